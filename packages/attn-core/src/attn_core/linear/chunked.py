"""The gated delta rule over whole prefills in 64-token chunks (the WY / UT form), fp32.

Per chunk of C tokens, value head h, with ``G`` the in-chunk cumulative log decay and ``S`` the
state before the chunk (derivation: unroll the per-token rule over the chunk):

    A = strictly_lower(diag(beta) (K K^T o D)),  D[i, j] = exp(G_i - G_j) for j <= i
    [U | W] = (I + A)^-1 [diag(beta) V | diag(beta e^G) K]   (A's inverse solved, then one bmm)
    delta = U - W S                                                  (the chunk's new values)
    O = (e^G Q) S * scale + ((Q K^T o D) * scale) delta
    S' = M S + N,  M = e^{G_C} I - Kd^T W,  N = Kd^T U,  Kd = K o e^{G_C - G}

Everything except ``S' = M S + N`` is batched over all chunks of a segment and all heads; the
state pass is one ``baddbmm_`` per chunk (the output and ``delta`` are computed afterwards from
the stored states, batched again). Keys and queries stay at their key heads for the Gram
products and broadcast to the value heads (``HV = group * H``) only where a per-value-head
factor multiplies them.

Counted as float-producing aten ops on the CPU (``tests/test_linear_chunked.py``): 2.2 per
64-token chunk at the model's 38-slot segments (44 per segment plus the one ``baddbmm_`` per
chunk), against ~19 per chunk for transformers' ``torch_chunk_gated_delta_rule`` counted the
same way at 32K tokens. The path is bound by the host's launches on an H100 (docs/benchmarks.md
#gated-deltanet), so what a segment launches is what it costs.

Sequences are cut into chunk slots; a segment holds ``depth`` chunk positions of ``width``
sequences (:class:`~attn_core.linear.plan.GatedDeltaPlan` bounds ``depth * width``). Slots past
a sequence's end get ``beta = 0`` and ``g = 0``: their ``M`` is the identity and ``N`` zero, so
the state passes through them unchanged.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from typing import Optional

import torch

from attn_core.linear.inputs import GatedDeltaInputs
from attn_core.linear.plan import GatedDeltaPlan
from attn_core.native.split import chunk_segments

L2NORM_EPS = 1e-6


def inverse_norm(x: torch.Tensor) -> torch.Tensor:
    """``1 / sqrt(sum(x^2) + 1e-6)`` over the last axis, kept as a trailing axis of one
    (flash-linear-attention's l2norm is ``x`` times this)."""
    return (x * x).sum(-1, keepdim=True).add_(L2NORM_EPS).rsqrt_()


def l2_normalise(x: torch.Tensor) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + 1e-6)`` over the last axis (flash-linear-attention's l2norm)."""
    return x * inverse_norm(x)


@functools.cache
def _chunk_constants(c: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The strictly upper ``c x c`` mask and the identity on ``device``, made once (three
    launches a segment otherwise), read only."""
    upper = torch.ones(c, c, dtype=torch.bool, device=device).triu(1)
    return upper, torch.eye(c, device=device)


def run_chunked(
    plan: GatedDeltaPlan, inputs: GatedDeltaInputs, out: torch.Tensor, want_final: bool
) -> Optional[torch.Tensor]:
    """Write ``out [B * T, HV, V]``; return the final states ``[N, HV, K, V]`` fp32 or None."""
    x = inputs
    n = len(x.lengths)
    hv, dk, dv = x.num_value_heads, x.q.shape[2], x.v.shape[2]
    dev = x.q.device
    chunks = [-(-length // plan.chunk) for length in x.lengths]
    # the native pair's schedule, with the plan's slots: longest first, so a group's active
    # sequences stay a prefix of it
    order, segments = chunk_segments(chunks, plan.segment_chunks)
    final = torch.empty(n, hv, dk, dv, device=dev) if want_final else None
    for base, group_segments in itertools.groupby(segments, key=lambda seg: seg[0]):
        group = order[base : base + plan.segment_chunks]
        ids = torch.tensor(group, device=dev)
        if x.initial_state is not None:
            state = x.initial_state.index_select(0, ids)
        else:
            state = torch.zeros(len(group), hv, dk, dv, device=dev)
        # Sequences of no tokens (a suffix of the group: longest first) keep their states as
        # they are; the native pair carries them through its first segment instead, which here
        # would put them through a state product.
        active = sum(1 for s in group if chunks[s] > 0)
        for _, width, p0, depth in group_segments:
            seqs = group[: min(width, active)]
            if seqs:
                _segment(plan, x, [x.starts[s] for s in seqs], [x.lengths[s] for s in seqs],
                         p0, depth, state[: len(seqs)], out)  # fmt: skip
        if final is not None:
            final.index_copy_(0, ids, state)
    return final


def _slot_tokens(
    plan: GatedDeltaPlan, starts: Sequence[int], lengths: Sequence[int], p0: int, depth: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Host tensors: each slot row's token (``[depth * width * C]``, chunk-position major; 0
    where past its sequence's end) and whether it is a real token."""
    c = plan.chunk
    first = torch.tensor(starts)[None, :, None]
    end = first + torch.tensor(lengths)[None, :, None]
    pos = first + (p0 + torch.arange(depth))[:, None, None] * c + torch.arange(c)[None, None, :]
    valid = pos < end
    return torch.where(valid, pos, torch.zeros_like(pos)).reshape(-1), valid.reshape(-1)


def _pass_states(after: torch.Tensor, trans: torch.Tensor, before: torch.Tensor, step: int) -> None:
    """``after[p] = trans[p] @ before[p] + after[p]`` for each chunk position ``p`` in turn
    (``step`` matrices a position; ``after[p]`` is ``before[p + 1]``): the only sequential part
    of a segment, one launch a position. The operands are split into views once: sliced inside
    the loop, the three slices cost about as much host time as the launch (a 32K prefill took
    36 ms of host time a call against 24 ms on the device, H100). A function of its own, so its
    loop's views die with it: left in the caller they kept the state maps alive through the
    output's products (2 MiB a chunk slot of the peak)."""
    views = zip(after.split(step), trans.split(step), before.split(step), strict=True)
    for after_p, trans_p, before_p in views:
        after_p.baddbmm_(trans_p, before_p)


def _segment(
    plan: GatedDeltaPlan,
    x: GatedDeltaInputs,
    starts: Sequence[int],
    lengths: Sequence[int],
    p0: int,
    depth: int,
    state: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """Chunk positions ``[p0, p0 + depth)`` of ``len(starts)`` sequences; ``state [width, HV,
    K, V]`` is the state before them and is advanced in place."""
    c, width = plan.chunk, len(starts)
    m = depth * width
    h, dk = x.q.shape[1], x.q.shape[2]
    hv, dv = x.v.shape[1], x.v.shape[2]
    grp = hv // h
    dev = x.q.device
    rows_host, valid_host = _slot_tokens(plan, starts, lengths, p0, depth)
    # One sequence whose tokens fill every slot: its rows are one run, read and written as a
    # slice instead of gathered and scattered (a 32K prefill is all such segments but its last).
    # Such a segment copies nothing from the host: a copy from pageable host memory waits for
    # the stream, so one a segment kept the host from running ahead of the device (a 128K
    # prefill took the sum of the two, 128 ms, H100).
    run = width == 1 and bool(valid_host.all())
    first = int(rows_host[0]) if run else 0
    if not run:
        rows = rows_host.to(dev, non_blocking=True)
        keep = valid_host.to(dev, dtype=torch.float32, non_blocking=True)[:, None]

    def rows_of(t: torch.Tensor) -> torch.Tensor:  # the segment's rows of a token-major input
        return t[first : first + m * c] if run else t.index_select(0, rows)

    def head_major(seg_rows: torch.Tensor) -> torch.Tensor:
        """The segment's rows ``[m * C, heads, ...]`` as ``[m, heads, C, ...]`` fp32, in one
        copy (dtype and layout together: one launch where ``.float().contiguous()`` was two)."""
        src = seg_rows.view(m, c, *seg_rows.shape[1:]).transpose(1, 2)
        return torch.empty(src.shape, device=dev).copy_(src)

    def gates(t: torch.Tensor) -> torch.Tensor:  # [m, HV, C] fp32, zero past each sequence's end
        return head_major(rows_of(t) if run else rows_of(t) * keep)

    # Keys and queries at their key heads, l2-normalised, the queries also scaled (once here,
    # not in each product that reads them).
    q, k = head_major(rows_of(x.q)), head_major(rows_of(x.k))  # [m, H, C, K]
    if x.l2norm:
        q.mul_(inverse_norm(q).mul_(x.scale))
        k.mul_(inverse_norm(k))
    else:
        q.mul_(x.scale)
    beta = gates(x.beta)
    cum = gates(x.g).cumsum_(-1)
    # the values stay in their dtype: the product with beta below reads and converts them

    # decay D[i, j] = exp(G_i - G_j) for j <= i, 0 above the diagonal (masked before exp)
    upper, eye = _chunk_constants(c, dev)
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill_(upper, float("-inf")).exp_()
    decay5 = decay.view(m, h, grp, c, c)
    gram = torch.matmul(k, k.transpose(-1, -2))[:, :, None]  # [m, H, 1, C, C]
    lower = (gram * decay5).mul_(beta.view(m, h, grp, c, 1)).view(m, hv, c, c)
    del gram
    e_cum = cum.exp()
    k_wide = k[:, :, None]  # [m, H, 1, C, K]: broadcast, never repeated
    # The keys' side enters negated, so the solve yields -W: the state map below is then one
    # bmm, without negating its K x K result (0.7 of the 33 ms of a 32K prefill, H100).
    rhs = torch.empty(m, hv, c, dv + dk, device=dev)
    v = rows_of(x.v).view(m, c, hv, dv).transpose(1, 2)  # [m, HV, C, V] in the input's dtype
    torch.mul(v, beta[..., None], out=rhs[..., :dv])
    torch.mul(k_wide, (beta * e_cum).neg_().view(m, h, grp, c, 1),
              out=rhs[..., dv:].view(m, h, grp, c, dk))  # fmt: skip
    del v
    # (I + A) is unit lower triangular (the solve reads A's strict lower part only). It is
    # solved against the identity, then applied to both right-hand sides in one matmul: solved
    # against the V + K = 256 columns of [beta v | -beta e^G k] directly, the batched
    # triangular solve was 6.6 of the 33 ms of a 32K prefill (H100, torch.profiler); against
    # C = 64 columns it does a quarter of that work, and the product runs at the bmms' rate.
    inverse = torch.linalg.solve_triangular(
        lower, eye.expand(m, hv, c, c), upper=False, unitriangular=True
    )
    del lower
    uw = torch.matmul(inverse, rhs)
    del inverse, rhs
    u, w_neg = uw[..., :dv], uw[..., dv:]
    last = cum[..., -1:]  # [m, HV, 1]
    k_dec = (k_wide * (last - cum).exp_().view(m, h, grp, c, 1)).view(m, hv, c, dk)

    states = torch.empty(depth + 1, width, hv, dk, dv, device=dev)
    states[0] = state
    before = states[:depth].view(m * hv, dk, dv)
    after = states[1:].view(m * hv, dk, dv)
    kt = k_dec.view(m * hv, c, dk).transpose(1, 2)
    torch.bmm(kt, u.reshape(m * hv, c, dv), out=after)  # N, the state's additive part
    trans = torch.bmm(kt, w_neg.reshape(m * hv, c, dk))  # M = e^{G_C} I - Kd^T W
    trans.diagonal(dim1=-2, dim2=-1).add_(e_cum[..., -1:].reshape(m * hv, 1))
    del k_dec, kt
    _pass_states(after, trans, before, width * hv)
    state.copy_(states[depth])
    del trans

    delta = torch.baddbmm(u.reshape(m * hv, c, dv), w_neg.reshape(m * hv, c, dk), before)
    del uw, u, w_neg
    q_dec = (q[:, :, None] * e_cum.view(m, h, grp, c, 1)).view(m * hv, c, dk)
    scores = torch.matmul(q, k.transpose(-1, -2))[:, :, None] * decay5
    del decay, decay5
    o = torch.baddbmm(torch.bmm(q_dec, before), scores.view(m * hv, c, c), delta)
    del q_dec, scores, delta, states
    # token-major order and the output's dtype in one copy
    o_heads = o.view(m, hv, c, dv).transpose(1, 2)
    if run:
        out[first : first + m * c].view(m, c, hv, dv).copy_(o_heads)
        return
    o = torch.empty(m * c, hv, dv, dtype=out.dtype, device=dev)
    o.view(m, c, hv, dv).copy_(o_heads)
    del o_heads
    if bool(valid_host.all()):
        out.index_copy_(0, rows, o)
    else:
        src = torch.nonzero(valid_host).view(-1)
        dst = rows_host.index_select(0, src).to(dev, non_blocking=True)
        out.index_copy_(0, dst, o.index_select(0, src.to(dev, non_blocking=True)))
