"""Paged decode attention on vLLM 0.6.3's cache layout: validate -> plan -> execute -> merge.

One query token per sequence attends to its paged context. Work is organised per KV head: the
``group`` query heads of a KV head form the rows of one batched matmul against that head's keys,
so K/V are read once per KV head and never repeated to query heads.

One step over ``C`` token slots (``C >= max_seq_len + block_size - 1``, so every sequence's row
holds at least ``block_size - 1`` masked slots after its last token):

1. ``masked = pos >= seq_lens`` (``[S, C]``); block ids, blocks past a sequence's end pointed
   at its first block (:func:`attn_core.decode_gather.block_ids`);
2. one ``index_select`` each for K (token-major) and V (D-major) by whole blocks;
3. the ``block_size - 1`` slots after each sequence's last token are zeroed in the gathered V
   (one small ``index_put_``): the cache's unused tail slots may hold inf/NaN and the
   ``P . V`` product would turn ``0 * NaN`` into NaN. Blocks past the end are copies of the
   first block, which is all real tokens unless the sequence is shorter than one block; those
   short sequences take their output from the first block alone (one ``[G, block]`` bmm and a
   ``where`` at the end);
4. scores ``[kv_heads * S, group, C]`` in fp32 by one bmm (scale folded into q where that is
   exact), ALiBi, masked slots set to ``-1e30`` (finite: an all-masked partition then yields
   finite statistics whose merge weight is exactly 0; whatever a masked key produced, inf and
   NaN included, is replaced);
5. ``single_tile`` / ``one_pass``: fp32 softmax, cast, one ``P . V`` bmm, written to ``out``;
   ``partitioned``: per-partition max / exp / sum on the score tensor, probabilities normalised
   per partition and cast, one bmm over every (row, partition), then a fp32 log-sum-exp merge
   (``softmax`` of ``max + log(sum)`` over partitions weights the partial outputs).

Ops per step: a fixed set per tier, independent of batch and context (no loop over sequences,
partitions or tiles; streaming repeats the set per chunk). This module is the one statement of
them: the simulator counts them by tracing this code (``python -m attn_sim report``,
*launches*) and ``gates.toml`` bounds the count per tier.

Nothing reads device values on the host, so a step can be captured in a CUDA graph;
``max_seq_len`` only sizes the step. Streaming (``num_chunks > 1``) repeats the partitioned
machinery per chunk and merges chunks by log-sum-exp.
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import torch

from attn_core.cache_layout import (
    COMPUTE_DTYPES,
    CacheLayout,
    check_block_tables,
    validate_caches,
)
from attn_core.capabilities import probe_capabilities
from attn_core.checks import (
    check_positive,
    check_positive_finite,
    check_tensor,
    resolve_scale,
    value_checks_enabled,
)
from attn_core.decode_checks import check_decode_bounds
from attn_core.decode_gather import block_ids, gather_keys, gather_values, to_compute
from attn_core.device_detect import detect_device_spec
from attn_core.device_spec import DeviceSpec
from attn_core.lse_merge import merge_lse
from attn_core.native.decode_step import run_native_decode
from attn_core.native.readiness import native_ready, with_native_capability
from attn_core.plan_decode import DecodeLengths, DecodePlan, plan_decode
from attn_core.settings import current_overrides
from attn_core.shapes import AttentionShape
from attn_core.workspace import Workspace, check_workspace, default_workspace, is_capturing

# Score of a masked slot: finite, so an all-masked partition's max/exp/sum stay finite, yet
# exp(-1e30 - m) is exactly 0 next to any real score.
MASKED_SCORE = -1e30


def paged_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    scale: Optional[float] = None,
    *,
    alibi_slopes: Optional[torch.Tensor] = None,
    kv_cache_dtype: str = "auto",
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    out: Optional[torch.Tensor] = None,
    workspace: Optional[Workspace] = None,
    device_spec: Optional[DeviceSpec] = None,
    plan: Optional[DecodePlan] = None,
) -> torch.Tensor:
    """What vLLM 0.6.3's ``paged_attention_v1`` / ``v2`` compute.

    Args:
        query: ``[num_seqs, num_heads, head_size]`` fp16 / bf16 / fp32.
        key_cache: ``[num_blocks, num_kv_heads, head_size // x, block_size, x]``.
        value_cache: ``[num_blocks, num_kv_heads, head_size, block_size]``.
        block_tables: ``[num_seqs, max_blocks]`` int32.
        seq_lens: ``[num_seqs]`` int32, each in ``[1, max_seq_len]``.
        max_seq_len: upper bound on ``seq_lens`` (may exceed all of them; results stay exact),
            at most ``max_blocks * block_size`` (checked on every call).
        scale: score scale; ``None`` means ``1 / sqrt(head_size)``.
        alibi_slopes: ``[num_heads]`` float32 or ``None``.
        kv_cache_dtype: ``"auto"`` or ``"fp8"`` / ``"fp8_e4m3"`` / ``"fp8_e5m2"`` (caches uint8).
        out: ``[num_seqs, num_heads, head_size]`` in the query's dtype, written in place.
        workspace: scratch buffers (default: the thread's shared workspace); one thread's only
            (another thread using it raises ``RuntimeError``, see :mod:`attn_core.workspace`).
        device_spec: the profile to plan for (default: detected, see :func:`plan_for`).
        plan: a prebuilt :class:`DecodePlan` (:func:`attn_core.plan_decode`; the simulator,
            benchmarks, tests); it must be for this call's shape, batch and dtype. Default:
            planned here from the device and the environment's overrides.
    Returns:
        ``[num_seqs, num_heads, head_size]`` in the query's dtype (``out`` if given).

    Every call checks shapes, dtypes, devices, finite positive scales and ``max_seq_len``
    against the table's capacity (``ValueError`` naming the argument). ``seq_lens`` and block-id
    values are read only with ``ATTN_CORE_CHECKS=1``; :mod:`attn_core.decode_checks` lists what
    each bad value does without it (an error or an exact result, never another block's tokens).
    """
    layout = _validate(
        query,
        key_cache,
        value_cache,
        block_tables,
        seq_lens,
        max_seq_len,
        alibi_slopes,
        kv_cache_dtype,
        k_scale,
        v_scale,
        out,
    )
    scale = resolve_scale(scale, layout.head_size)
    ws = check_workspace(workspace) or default_workspace()
    if out is None:
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    if query.shape[0] == 0:  # an empty batch is a no-op, not an error
        return out
    if plan is None:
        plan = plan_for(query, layout, block_tables.shape[1], max_seq_len, device_spec)
    else:
        _check_plan(plan, query, layout, block_tables.shape[1], max_seq_len)
    if value_checks_enabled() and not is_capturing(query.device):
        # reading values syncs, which a CUDA-graph capture forbids: capture checks nothing
        _check_values(layout, block_tables, seq_lens, max_seq_len)
    _execute(
        plan,
        ws,
        query,
        key_cache,
        value_cache,
        block_tables,
        seq_lens,
        scale,
        alibi_slopes,
        layout,
        float(k_scale),
        float(v_scale),
        out,
    )
    return out


# ---------------------------------------------------------------------------------- validate
def _validate(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    alibi_slopes: Optional[torch.Tensor],
    kv_cache_dtype: str,
    k_scale: float,
    v_scale: float,
    out: Optional[torch.Tensor],
) -> CacheLayout:
    check_tensor("query", query, ndim=3, dtype=COMPUTE_DTYPES)
    device = query.device
    layout = validate_caches(
        key_cache, value_cache, kv_cache_dtype, compute_dtype=query.dtype, device=device
    )
    num_seqs, num_heads, _ = query.shape
    check_tensor("query", query, shape=(None, None, layout.head_size))
    if num_heads % layout.num_kv_heads:
        raise ValueError(
            f"query's num_heads must be divisible by num_kv_heads ({layout.num_kv_heads}), "
            f"got {num_heads}"
        )
    check_block_tables(block_tables, num_seqs, device)
    check_tensor("seq_lens", seq_lens, shape=(num_seqs,), dtype=torch.int32, device=device)
    check_positive("max_seq_len", max_seq_len)
    check_decode_bounds(layout, block_tables, num_seqs, max_seq_len)
    if alibi_slopes is not None:
        check_tensor(
            "alibi_slopes", alibi_slopes, shape=(num_heads,), dtype=torch.float32, device=device
        )
    check_positive_finite("k_scale", k_scale)
    check_positive_finite("v_scale", v_scale)
    if out is not None:
        check_tensor("out", out, shape=tuple(query.shape), dtype=query.dtype, device=device)
    return layout


def _check_values(
    layout: CacheLayout, block_tables: torch.Tensor, seq_lens: torch.Tensor, max_seq_len: int
) -> None:
    """``ATTN_CORE_CHECKS=1``: value checks that read the device (they sync)."""
    lens = seq_lens.long()
    capacity = block_tables.shape[1] * layout.block_size
    lo, hi = int(lens.min()), int(lens.max())
    if lo < 1 or hi > capacity:
        raise ValueError(
            f"seq_lens must be in [1, {capacity}] (block_tables' capacity), got min {lo} max {hi}"
        )
    if hi > max_seq_len:
        raise ValueError(f"seq_lens must be <= max_seq_len ({max_seq_len}), got max {hi}")
    needed = (lens + layout.block_size - 1) // layout.block_size
    cols = torch.arange(block_tables.shape[1], device=lens.device)
    used = block_tables[cols[None, :] < needed[:, None]]
    lo_id, hi_id = int(used.min()), int(used.max())
    if lo_id < 0 or hi_id >= layout.num_blocks:
        raise ValueError(
            f"block_tables entries in use must be in [0, {layout.num_blocks - 1}], "
            f"got min {lo_id} max {hi_id}"
        )


def _check_plan(
    plan: DecodePlan, query: torch.Tensor, layout: CacheLayout, max_blocks: int, max_seq_len: int
) -> None:
    """A caller's plan must be for this call: same sizes and dtypes, covering its context."""
    if not isinstance(plan, DecodePlan):
        raise ValueError(f"plan must be an attn_core DecodePlan, got {type(plan).__name__}")
    cache_elem = 1 if layout.is_fp8 else query.element_size()
    want = (query.shape[0], query.shape[1], layout.num_kv_heads, layout.head_size,
            layout.block_size, query.dtype, cache_elem)  # fmt: skip
    got = (plan.num_seqs, plan.num_heads, plan.num_kv_heads, plan.head_size, plan.block_size,
           plan.compute_dtype, plan.cache_element_size)  # fmt: skip
    if want != got:
        raise ValueError(
            "plan must be for (num_seqs, num_heads, num_kv_heads, head_size, block_size, dtype, "
            f"cache element size) = {want}, got {got}"
        )
    context = min(max_seq_len, max_blocks * layout.block_size)
    if plan.context_tokens < context:
        raise ValueError(
            f"plan.context_tokens must cover min(max_seq_len, block_tables capacity) = "
            f"{context}, got {plan.context_tokens}"
        )


# -------------------------------------------------------------------------------------- plan
def plan_for(
    query: torch.Tensor,
    layout: CacheLayout,
    max_blocks: int,
    max_seq_len: int,
    device_spec: Optional[DeviceSpec] = None,
) -> DecodePlan:
    """The plan :func:`paged_decode` makes for these arguments: the profile (``device_spec`` or
    detected), probed capabilities and the environment's overrides, cached on all of them (the
    frozen :class:`DecodeOverrides` is the key, so no variable can be left out of it)."""
    shape = AttentionShape(
        query.shape[1],
        layout.num_kv_heads,
        layout.head_size,
        layout.block_size,
        query.dtype,
        layout.kv_cache_dtype,
    )
    lengths = DecodeLengths(query.shape[0], max_seq_len, max_blocks)
    settings = current_overrides()  # once per call: the environment read at the boundary
    spec = device_spec or detect_device_spec(query.device, forced=settings.device)
    caps = probe_capabilities(query.device, query.dtype)
    caps = with_native_capability(caps, settings, query.device, shape)
    return _cached_plan(shape, lengths, spec, caps, settings.decode)


_cached_plan = functools.lru_cache(maxsize=256)(plan_decode)


# ----------------------------------------------------------------------------------- execute
def _is_power_of_two(x: float) -> bool:
    return x > 0 and math.frexp(x)[0] == 0.5


def _execute(
    plan: DecodePlan,
    ws: Workspace,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    alibi_slopes: Optional[torch.Tensor],
    layout: CacheLayout,
    k_scale: float,
    v_scale: float,
    out: torch.Tensor,
) -> None:
    if plan.backend == "native":
        _execute_native(
            plan, ws, query, key_cache, value_cache, block_tables, seq_lens, scale,
            alibi_slopes, layout, k_scale, v_scale, out,
        )  # fmt: skip
        return
    num_seqs, _, head_size = query.shape
    kv_heads, group = layout.num_kv_heads, plan.group
    rows = kv_heads * num_seqs
    if not layout.is_fp8:  # vLLM applies k_scale / v_scale to fp8 caches only
        k_scale = v_scale = 1.0
    score_scale = scale * k_scale  # fp8 keys are dequantised unscaled; k_scale rides on q
    # Grouped queries [kv_heads * S, group, D] in the score bmm's input dtype: row (h, s) holds
    # query heads h*group..+group. Folding the scale into q rounds q once more in fp16/bf16,
    # so it is folded only where exact (fp32 q, or a power-of-two scale: head 64 / 256).
    qg = ws.take("q", (kv_heads, num_seqs, group, head_size), plan.score_input_dtype, query.device)
    by_head = query.reshape(num_seqs, kv_heads, group, head_size).transpose(0, 1)
    fold = query.dtype == torch.float32 or _is_power_of_two(score_scale)
    if fold:
        torch.mul(by_head, score_scale, out=qg)
    else:
        qg.copy_(by_head)
    qg = qg.view(rows, group, head_size)
    slopes = None if alibi_slopes is None else alibi_slopes.view(kv_heads, 1, group, 1)
    post_scale = 1.0 if fold else score_scale

    o: Optional[torch.Tensor]
    small: Optional[torch.Tensor]
    if not plan.streaming and plan.tier != "partitioned":
        o, small = _direct(
            plan, ws, qg, key_cache, value_cache, block_tables, seq_lens, slopes, layout,
            post_scale,
        )  # fmt: skip
    else:
        o = lse = small = None
        for chunk in range(plan.num_chunks):  # 1 unless streaming (plan.streaming)
            part_o, part_lse, part_small = _partitioned(
                plan, ws, qg, key_cache, value_cache, block_tables, seq_lens, slopes, layout,
                post_scale, chunk * plan.chunk_tokens,
            )  # fmt: skip
            if o is None:
                o, lse, small = part_o, part_lse, part_small
            else:
                assert lse is not None and part_lse is not None
                o, lse = merge_lse(torch.stack((o, part_o), 1), torch.stack((lse, part_lse), -1))
    assert o is not None and small is not None
    _write_out(out, o, small, seq_lens, plan, v_scale)


def _execute_native(
    plan: DecodePlan,
    ws: Workspace,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    alibi_slopes: Optional[torch.Tensor],
    layout: CacheLayout,
    k_scale: float,
    v_scale: float,
    out: torch.Tensor,
) -> None:
    """The plan's native launches (:mod:`attn_core.native`), partials from ``ws``."""
    lib, why = native_ready(
        current_overrides().native, query.device, query.dtype, layout.kv_cache_dtype,
        layout.head_size, layout.block_size, plan.group,
    )  # fmt: skip
    if lib is None or plan.native is None:
        raise ValueError(
            "plan.backend is 'native' but the native kernel cannot serve this call: "
            f"{why or 'the plan has no native split'}"
        )
    run_native_decode(
        lib,
        plan.native,
        query=query,
        key_cache=key_cache,
        value_cache=value_cache,
        block_tables=block_tables,
        seq_lens=seq_lens,
        out=out,
        scale=scale,
        k_scale=k_scale,
        v_scale=v_scale,
        kv_cache_dtype=layout.kv_cache_dtype,
        workspace=ws,
        alibi_slopes=alibi_slopes,
    )


def _write_out(
    out: torch.Tensor,
    o: torch.Tensor,
    small: torch.Tensor,
    seq_lens: torch.Tensor,
    plan: DecodePlan,
    v_scale: float,
) -> None:
    """``out`` from ``o [rows, G, D]``; sequences shorter than a block take ``small``.

    ``out`` may have any strides (vLLM's ``empty_like`` of a strided query): it is written
    through a ``[kv_heads, S, G, D]`` view by one ``where`` (after a cast when dtypes differ).
    """
    num_seqs = seq_lens.shape[0]
    kv_heads = o.shape[0] // num_seqs
    shape = (kv_heads, num_seqs, plan.group, plan.head_size)
    dst = out.unflatten(1, (kv_heads, plan.group)).transpose(0, 1)
    if o.dtype != out.dtype:
        o = o.to(out.dtype)
    if small.dtype != out.dtype:
        small = small.to(out.dtype)
    short = (seq_lens < plan.block_size).view(1, num_seqs, 1, 1)
    torch.where(short, small.view(shape), o.view(shape), out=dst)
    if v_scale != 1.0:
        dst.mul_(v_scale)


def _gather_and_score(
    plan: DecodePlan,
    ws: Workspace,
    qg: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    slopes: Optional[torch.Tensor],
    layout: CacheLayout,
    post_scale: float,
    start: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scores [rows, G, C] fp32, values [D, kv_heads, S, C] in the bmm dtype)``."""
    rows, group, head_size = qg.shape
    num_seqs = seq_lens.shape[0]
    kv_heads = rows // num_seqs
    c, bs, device = plan.chunk_tokens, plan.block_size, qg.device
    # chunk-relative positions: slot i of this chunk is masked when i >= seq_len - start
    end = seq_lens if start == 0 else seq_lens - start
    pos = ws.arange(c, device)
    masked = pos[None, :] >= end[:, None]  # [S, C]
    ids = block_ids(block_tables, masked[:, ::bs], start // bs, c // bs, ws)
    keys = gather_keys(ws, key_cache, ids, layout, plan.gather_bytes)
    values = gather_values(ws, value_cache, ids, layout, plan.gather_bytes)
    _zero_value_tails(ws, values, end, plan, last=start + c >= plan.num_chunks * c)

    keys = keys.view(rows, c, head_size)
    if plan.scores_in_compute_dtype:
        keys = to_compute(ws, "k_c", keys, layout, plan.matmul_dtype)
        rounded = ws.take("scores_c", (rows, group, c), plan.matmul_dtype, device)
        torch.bmm(qg, keys.transpose(1, 2), out=rounded)
        scores = ws.take("scores", (rows, group, c), torch.float32, device)
        scores.copy_(rounded)
    elif plan.score_input_dtype != torch.float32:  # the device's bmm writes fp32 itself
        keys = to_compute(ws, "k_c", keys, layout, plan.score_input_dtype)
        scores = torch.bmm(qg, keys.transpose(1, 2), out_dtype=torch.float32)
    else:
        keys = to_compute(ws, "k_c", keys, layout, torch.float32)
        scores = ws.take("scores", (rows, group, c), torch.float32, device)
        torch.bmm(qg, keys.transpose(1, 2), out=scores)
    scores4 = scores.view(kv_heads, num_seqs, group, c)
    if post_scale != 1.0:
        scores4.mul_(post_scale)
    if slopes is not None:  # vLLM's bias: slope * (position - seq_len + 1)
        rel = pos[None, :] - (end[:, None] - 1)
        scores4.addcmul_(slopes, rel.view(1, num_seqs, 1, c).to(torch.float32))
    scores4.masked_fill_(masked.view(1, num_seqs, 1, c), MASKED_SCORE)
    values = to_compute(ws, "v_c", values, layout, plan.matmul_dtype)
    return scores, values


def _zero_value_tails(
    ws: Workspace, values: torch.Tensor, end: torch.Tensor, plan: DecodePlan, last: bool = True
) -> None:
    """Zero the ``block_size - 1`` gathered value slots after each sequence's last token.

    ``values [D, kv_heads, S, C]``; ``end [S]``: each sequence's first masked slot relative to
    the chunk (may be < 0 or >= C when streaming). Without streaming every such slot lies
    inside the row (``C >= max_seq_len + block_size - 1``) and past the end, so one
    ``index_put_`` of zeros does it. A streamed chunk may end before a sequence does: targets
    are clamped into the chunk and slots that hold real tokens are written back unchanged.
    The ``last`` chunk is not clamped above: the chunks cover ``max_seq_len + block_size - 1``
    slots, so a target past it means ``seq_lens > max_seq_len`` and fails (IndexError / device
    assert) rather than silently dropping the tokens no chunk covers.
    """
    num_seqs, c, bs = end.shape[0], plan.chunk_tokens, plan.block_size
    device = values.device
    step = ws.arange(bs - 1, device)
    seqs = ws.arange(num_seqs, device)[:, None]
    zero = ws.constant(
        ("zero", values.dtype), lambda d: torch.zeros((), dtype=values.dtype, device=d), device
    )
    if not plan.streaming:
        target = end[:, None] + step  # [S, BS - 1]
        torch.ops.aten.index_put_(values, [None, None, seqs, target], zero)
        return
    target = (end[:, None] + step).clamp_(0, None if last else c - 1)
    current = values[:, :, seqs, target]
    keep = target < end[:, None]  # a clamped target on a real token: write it back as it is
    torch.ops.aten.index_put_(values, [None, None, seqs, target], torch.where(keep, current, zero))


def _direct(
    plan: DecodePlan,
    ws: Workspace,
    qg: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    slopes: Optional[torch.Tensor],
    layout: CacheLayout,
    post_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """single_tile / one_pass: ``(out [rows, G, D], first-block out [rows, G, D])``."""
    scores, values = _gather_and_score(
        plan, ws, qg, key_cache, value_cache, block_tables, seq_lens, slopes, layout,
        post_scale, 0,
    )  # fmt: skip
    rows, group, c = scores.shape
    probs = torch.softmax(scores, -1)
    if plan.matmul_dtype != torch.float32:
        cast = ws.take("probs", (rows, group, c), plan.matmul_dtype, probs.device)
        probs = cast.copy_(probs)
    v_rows = values.view(plan.head_size, rows, c).permute(1, 2, 0)  # [rows, C, D]
    o = torch.bmm(probs, v_rows)
    bs = plan.block_size
    return o, torch.bmm(probs[:, :, :bs], v_rows[:, :bs])


def _partitioned(
    plan: DecodePlan,
    ws: Workspace,
    qg: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    slopes: Optional[torch.Tensor],
    layout: CacheLayout,
    post_scale: float,
    start: int,
) -> tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
    """One chunk: ``(normalised out [rows, G, D] fp32, lse [rows, G] if streaming, first-block
    out)``.

    Phase 1 on the small score tensor: per-partition max ``m``, ``exp(s - m)``, sum ``l``,
    probabilities normalised per partition (as vLLM V2 does: an unnormalised fp16 ``P . V``
    can reach ``partition_size * max|v|`` and overflow), one bmm for every partition's partial
    output. Phase 2 in fp32: partition weights ``softmax(m + log l)``, a weighted sum.
    """
    scores, values = _gather_and_score(
        plan, ws, qg, key_cache, value_cache, block_tables, seq_lens, slopes, layout,
        post_scale, start,
    )  # fmt: skip
    rows, group, c = scores.shape
    p, ps, head_size = plan.num_partitions, plan.partition_size, plan.head_size
    parts = scores.view(rows, group, p, ps)
    maxes = parts.amax(-1)  # [rows, G, P]
    parts.sub_(maxes.unsqueeze(-1)).exp_()
    sums = parts.sum(-1)  # >= 1: every partition's max contributes exp(0)
    probs = ws.take("probs", (rows, p, group, ps), plan.matmul_dtype, scores.device)
    torch.div(parts, sums.unsqueeze(-1), out=probs.transpose(1, 2))
    v_parts = values.view(head_size, rows * p, ps).permute(1, 2, 0)  # [rows * P, ps, D]
    partial = torch.bmm(probs.view(rows * p, group, ps), v_parts).view(rows, p, group, head_size)
    o, lse = merge_lse(partial, maxes + sums.log(), with_lse=plan.streaming)
    bs = plan.block_size
    v_rows = values.view(head_size, rows, c).permute(1, 2, 0)
    small = torch.bmm(probs[:, 0, :, :bs], v_rows[:, :bs])
    return o, lse, small
