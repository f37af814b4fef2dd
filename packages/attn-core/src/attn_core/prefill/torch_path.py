"""The portable prefill backend: online softmax over key tiles in plain torch ops.

Always safe on BI-V100 (no Triton, no vendor kernels). Per sequence the cached context is
gathered once (or, in streaming mode, in chunks of ``plan.stream_chunk`` tokens once per query
tile); queries are processed ``plan.query_tile`` tokens at a time against key tiles of
``plan.key_tile`` tokens, first over the context, then causally over the chunk's own keys. Tiles
that the causal mask or the sliding window fully exclude are skipped; only tiles crossing an
edge build a mask.

Every buffer (score tile, query tile, P@V tile, running max, fp32 sum / accumulator) is
allocated once per call in :class:`_SoftmaxState` - or taken from a reusable
:class:`attn_core.core.workspace.Workspace` - and updated in place with ``out=`` forms.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from attn_core.core.workspace import Workspace
from attn_core.prefill.gather import SUM_COLUMNS, new_tokens_head_major
from attn_core.prefill.plan import PrefillPlan
from attn_core.prefill.problem import Problem, gather_span


def run_torch_prefill(
    plan: PrefillPlan,
    problem: Problem,
    spans: list,
    out: torch.Tensor,
    scratch: Optional[Workspace] = None,
) -> None:
    """Attend every span's new tokens; writes ``out [num_tokens, heads, hs]`` in place.

    ``scratch``: a reusable :class:`Workspace` for the tile buffers (steady state allocates
    none); None allocates them for this call only.
    """
    ws = _SoftmaxState(plan, problem, scratch)
    for span in spans:
        if span.query_len == 0:
            continue
        new_k, new_v = new_tokens_head_major(
            problem.key[span.q0 : span.q1],
            problem.value[span.q0 : span.q1],
            plan.matmul_dtype,
            sum_column=True,
        )
        # With a sliding window the chunk's first token sees only the last window - 1 cached
        # tokens; older ones are never gathered.
        lo = max(0, span.ctx - problem.window + 1) if problem.window > 0 else 0
        whole = None
        if span.ctx > lo and plan.stream_chunk == 0:
            whole = gather_span(problem, span, lo, span.ctx, plan.matmul_dtype, sum_column=True)
        for a in range(0, span.query_len, plan.query_tile):
            b = min(a + plan.query_tile, span.query_len)
            ws.begin(problem.query[span.q0 + a : span.q0 + b], span.ctx + a)
            for c0, c1 in _context_chunks(plan, problem.window, lo, span.ctx, span.ctx + a):
                if whole is not None:
                    keys, values = whole[0][:, c0 - lo : c1 - lo], whole[1][:, c0 - lo : c1 - lo]
                else:
                    keys, values = gather_span(
                        problem, span, c0, c1, plan.matmul_dtype, sum_column=True
                    )
                ws.attend_range(keys, values, c0)
            ws.attend_range(new_k[:, :b], new_v[:, :b], span.ctx)
            ws.finish(out[span.q0 + a : span.q0 + b])


def _bmm_into(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    if out.dtype == a.dtype:
        torch.bmm(a, b, out=out)
    else:
        torch.bmm(a, b, out_dtype=out.dtype, out=out)


def _context_chunks(
    plan: PrefillPlan, window: int, lo: int, ctx: int, first_query_pos: int
) -> list:
    """Context ranges ``[c0, c1)`` within ``[lo, ctx)``: one when not streaming; chunks wholly
    outside this query tile's window are dropped."""
    if ctx <= lo:
        return []
    step = plan.stream_chunk or ctx - lo
    lowest = first_query_pos - window + 1 if window > 0 else 0  # oldest key the tile sees
    chunks = [(c0, min(c0 + step, ctx)) for c0 in range(lo, ctx, step)]
    return [(c0, c1) for c0, c1 in chunks if c1 > lowest]


class _SoftmaxState:
    """The online softmax of one query tile: running max, sum and accumulator, and the per-call
    tile buffers (score tile, query tile, P@V) they are updated through.

    Rows are ``(group member j, query i)`` per KV head: ``[kv_heads, group * query_tile]``, so
    the query heads that share a KV head share one read of each key tile.
    """

    def __init__(self, plan: PrefillPlan, problem: Problem, scratch: Optional[Workspace]) -> None:
        dev = problem.query.device

        def buf(name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
            if scratch is None:
                return torch.empty(numel, dtype=dtype, device=dev)
            return scratch.take(f"prefill_{name}", (numel,), dtype, dev)

        self.plan = plan
        self.problem = problem
        # group from the fields, not the plan's property: running a plan enters no planner code
        self.kvh, self.hs = plan.num_kv_heads, plan.head_size
        self.group = plan.num_heads // plan.num_kv_heads
        rows = self.kvh * self.group * plan.query_tile
        sd, md = plan.score_dtype, plan.matmul_dtype
        self._scores = buf("scores", rows * plan.key_tile, sd)
        # fp32 scores with 2-byte operands: P@V reads a 2-byte copy of the probabilities.
        self._probs = buf("probs", rows * plan.key_tile, md) if md != sd else None
        self._q = buf("query", rows * self.hs, md)
        # P @ [V | 1]: P @ V and the row sums (prefill_gather.SUM_COLUMNS) in plan.pv_dtype.
        self._pv = buf("pv", rows * (self.hs + SUM_COLUMNS), plan.pv_dtype)
        self._acc = buf("acc", rows * self.hs, torch.float32)
        # The running max is a max of score values, so it is exact in the score dtype; keeping
        # it there makes the big in-place subtract a same-dtype (vectorised) kernel.
        self._tile_max = buf("tile_max", rows, sd)
        self._m, self._m_new = buf("max", rows, sd), buf("new_max", rows, sd)
        self._l = buf("sum", rows, torch.float32)
        self._alpha = buf("correction", rows, torch.float32)
        self._slopes = None
        if problem.alibi_slopes is not None:
            # Slopes and one tile's key - query distances (shared by all heads) in the score
            # dtype, the distances computed in fp32 first (see _add_alibi).
            slopes = problem.alibi_slopes.view(self.kvh, self.group, 1, 1)
            self._slopes = buf("alibi_slopes", slopes.numel(), sd).view(slopes.shape)
            self._slopes.copy_(slopes)
            tq, tk = plan.query_tile, plan.key_tile
            self._dist32 = buf("alibi_dist32", tq * tk, torch.float32)
            self._dist = self._dist32 if sd == torch.float32 else buf("alibi_dist", tq * tk, sd)
            self._q_idx = torch.arange(tq, out=buf("alibi_query_idx", tq, torch.float32))[:, None]
            self._k_idx = torch.arange(tk, out=buf("alibi_key_idx", tk, torch.float32))
            self._k_pos = buf("alibi_key_pos", tk, torch.float32)

    def begin(self, query: torch.Tensor, first_pos: int) -> None:
        """Start a query tile: ``query [t, heads, hs]`` at absolute positions ``first_pos + i``."""
        t = query.shape[0]
        self.t, self.rows, self.first_pos = t, self.group * t, first_pos
        n = self.kvh * self.rows
        self.q = self._q[: n * self.hs].view(self.kvh, self.rows, self.hs)
        # The scale is folded into the query once per tile ([t, kvh, g, hs] -> [kvh, g, t, hs])
        # where that cannot overflow: into an fp32 query tile (computed in fp32:
        # torch.mul(fp16, s, out=fp32) would compute in fp16), or a 2-byte one when scale <= 1.
        # A larger scale on 2-byte operands is applied to the fp32 score tile instead
        # (fp16 q * 65536 is inf for |q| >= 1: NaN where the float64 reference is finite).
        src = query.view(t, self.kvh, self.group, self.hs).permute(1, 2, 0, 3)
        dst = self.q.view(self.kvh, self.group, t, self.hs)
        scale = self.problem.scale
        foldable = dst.dtype == torch.float32 or scale <= 1.0
        if foldable and dst.dtype == query.dtype:
            torch.mul(src, scale, out=dst)
        else:
            dst.copy_(src)
            if foldable:
                dst.mul_(scale)
        self.score_scale = 1.0 if foldable else scale
        if self.score_scale != 1.0 and self._scores.dtype != torch.float32:
            raise ValueError(
                f"scale {scale} > 1 needs fp32 scores (a {self._scores.dtype} score tile "
                "overflows); plan with score_dtype float32 (attn_core.runtime.prefill does)"
            )
        self.acc = self._acc[: n * self.hs].view(self.kvh, self.rows, self.hs).zero_()
        # Finite start: a row that has seen only masked keys gets exp(-inf - min) = 0, no NaN.
        self.m = self._m[:n].view(self.kvh, self.rows).fill_(torch.finfo(self._m.dtype).min)
        self.m_new = self._m_new[:n].view(self.kvh, self.rows)
        self.l = self._l[:n].view(self.kvh, self.rows).zero_()

    def attend_range(self, keys: torch.Tensor, values: torch.Tensor, first_key_pos: int) -> None:
        """Fold keys ``[kvh, n, hs]`` at positions ``first_key_pos + j`` and their values with
        the row-sum column ``[kvh, n, hs + SUM_COLUMNS]`` (``sum_column_buffer``) into the
        state."""
        tk, n = self.plan.key_tile, keys.shape[1]
        last_q = self.first_pos + self.t - 1
        window = self.problem.window
        for k0 in range(0, n, tk):
            k1 = min(k0 + tk, n)
            lo, hi = first_key_pos + k0, first_key_pos + k1 - 1  # key positions in this tile
            if lo > last_q or (window > 0 and hi <= self.first_pos - window):
                continue  # causally in the future / wholly outside every query's window
            needs_mask = hi > self.first_pos or (window > 0 and lo <= last_q - window)
            self._update(keys[:, k0:k1], values[:, k0:k1], lo, needs_mask)

    def _update(self, keys: torch.Tensor, values: torch.Tensor, lo: int, needs_mask: bool) -> None:
        n = keys.shape[1]
        count = self.kvh * self.rows
        s = self._scores[: count * n].view(self.kvh, self.rows, n)
        _bmm_into(self.q, keys.transpose(1, 2), s)  # fp32 s from 2-byte operands: GEMM writes it
        if self.score_scale != 1.0:  # a scale > 1 with 2-byte operands (see begin)
            s.mul_(self.score_scale)
        s4 = s.view(self.kvh, self.group, self.t, n)
        if self._slopes is not None:
            self._add_alibi(s4, self._slopes, lo, n)
        if needs_mask:
            s4.masked_fill_(self._mask(lo, n), -math.inf)
        tile_max = self._tile_max[:count].view(self.kvh, self.rows)
        torch.amax(s, dim=-1, out=tile_max)
        torch.maximum(self.m, tile_max, out=self.m_new)
        alpha = self._alpha[:count].view(self.kvh, self.rows)
        alpha.copy_(self.m).sub_(self.m_new).exp_()  # in fp32: max differences stay exact
        s.sub_(self.m_new.unsqueeze(-1)).exp_()  # probabilities, in place in the score tile
        width = self.hs + SUM_COLUMNS
        pv = self._pv[: count * width].view(self.kvh, self.rows, width)
        probs = s
        if self._probs is not None:
            probs = self._probs[: count * n].view(self.kvh, self.rows, n).copy_(s)
        _bmm_into(probs, values, pv)  # values [kvh, n, hs + 8]: P @ V and the row sums
        self.l.mul_(alpha).add_(pv[..., self.hs])
        self.acc.mul_(alpha.unsqueeze(-1)).add_(pv[..., : self.hs])
        self.m, self.m_new = self.m_new, self.m

    def _mask(self, lo: int, n: int) -> torch.Tensor:
        """``[t, n]`` True where a key is excluded (future, or outside the window)."""
        dev = self.q.device
        q_pos = torch.arange(self.first_pos, self.first_pos + self.t, device=dev)[:, None]
        k_pos = torch.arange(lo, lo + n, device=dev)[None, :]
        mask = k_pos > q_pos
        if self.problem.window > 0:
            mask |= k_pos <= q_pos - self.problem.window
        return mask

    def _add_alibi(self, s4: torch.Tensor, slopes: torch.Tensor, lo: int, n: int) -> None:
        """``s4 [kvh, g, t, n] += slope * (key_pos - query_pos)``, vLLM's bias, in one pass.

        The bias is relative to each row's own query position, so the keys that carry weight
        (near the query) get a bias near 0 and their logits stay small. A bias relative to the
        tile's first query (one row for the whole tile) is softmax-equivalent but puts those
        logits at ``slope * t``: ~200 for a 257-token chunk, where an fp16 score has a 0.125
        ulp, which put 0.4 % of the outputs off by up to 0.15 on the H200 (gpu-run-1,
        ``test_cuda_torch_windows_alibi_fp8[alibi-*]``; reproduced bit-for-bit on the CPU by
        ``test_prefill.py::test_alibi_with_fp16_scores_and_large_tiles``).

        ``addcmul_`` on same-dtype operands (mixed-dtype in-place promotion is not safe to
        rely on across torch versions) computes ``s + slope * dist`` in fp32 on CUDA and
        rounds once. In fp16, slopes carry a 2^-11 relative error and distances are exact to
        2048 and clamped at 65504 (bias <= -256 at the smallest standard slope 2^-8: no
        weight), so the near keys' bias is within ~0.005 where it matters; fp32 scores take
        both exactly. ``dist`` is a ``[t, n]`` tile: 1/heads of the score tile's traffic.
        """
        dist32 = self._dist32[: self.t * n].view(self.t, n)
        k_pos = torch.add(self._k_idx[:n], lo - self.first_pos, out=self._k_pos[:n])
        torch.sub(k_pos[None, :], self._q_idx[: self.t], out=dist32)
        dist = dist32
        if self._dist is not self._dist32:
            big = torch.finfo(self._dist.dtype).max
            dist = self._dist[: self.t * n].view(self.t, n).copy_(dist32.clamp_(-big, big))
        s4.addcmul_(slopes, dist)

    def finish(self, out: torch.Tensor) -> None:
        """Normalise and write ``out [t, heads, hs]`` (the query dtype)."""
        self.acc.div_(self.l.unsqueeze(-1))
        acc = self.acc.view(self.kvh, self.group, self.t, self.hs).permute(2, 0, 1, 3)
        out.view(self.t, self.kvh, self.group, self.hs).copy_(acc)
