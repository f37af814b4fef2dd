"""Paged decode attention on vLLM 0.6.3's cache layout: validate -> plan -> execute -> merge.

One query token per sequence attends to its paged context. Work is organised per KV head: the
``group`` query heads of a KV head form the rows of one batched matmul against that head's keys,
so K/V are read once per KV head and never repeated to query heads.

Execution of one chunk of ``C`` token slots (the whole context unless streaming):

1. cache coordinates of the chunk's slots (:mod:`attn_core.decode_gather`): per token
   (``gather="token"``; slots at or past ``seq_lens[s]`` read the sequence's token 0, so they
   hold finite values) or per block (``gather="block"``);
2. one gather each for K and V from a permuted view of the cache: keys token-major
   ``[kv_heads, S, C, head]`` as 16-byte vectors; values token-major (token gather) or D-major
   ``[head, kv_heads, S, C]`` (block gather), each already the layout its bmm reads;
3. scores ``[kv_heads * S, group, C]`` in fp32 by one bmm, scale, ALiBi, mask to ``-inf``
   (masking replaces whatever a masked slot's key produced, inf and NaN included);
4. per-partition max / exp / sum on the scores (``C = partitions * partition_size``),
   probabilities normalised per partition and cast to the compute dtype;
5. one bmm with V over every (row, partition); with block gathers, partitions holding no real
   token are zeroed and each sequence's boundary partition is recomputed from token-gathered
   values, because a real cache's unused slots may hold inf/NaN and ``0 * NaN`` is NaN;
6. log-sum-exp merge of partitions in fp32 (and of chunks when streaming); divide on the
   output side.

The number of ops is fixed per chunk; nothing reads device values on the host, so a step can be
captured in a CUDA graph. ``max_seq_len`` only sizes the chunk.
"""

from __future__ import annotations

import functools
import math
import os
from typing import Optional

import torch

from attn_core.cache_layout import (
    COMPUTE_DTYPES,
    CacheLayout,
    check_block_tables,
    validate_caches,
)
from attn_core.checks import check_positive, check_tensor, resolve_scale, value_checks_enabled
from attn_core.decode_gather import (
    block_indices,
    gather_keys_blocks,
    gather_keys_tokens,
    gather_values_dmajor,
    gather_values_tokens,
    slot_indices,
    to_compute,
    token_indices,
)
from attn_core.device_spec import DeviceSpec, detect_device_spec
from attn_core.lse_merge import merge_partitions, merge_two, normalise, safe_max
from attn_core.plan_decode import DecodePlan, plan_decode
from attn_core.workspace import Workspace, default_workspace, is_capturing

Triple = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


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
) -> torch.Tensor:
    """What vLLM 0.6.3's ``paged_attention_v1`` / ``v2`` compute.

    Args:
        query: ``[num_seqs, num_heads, head_size]`` fp16 / bf16 / fp32.
        key_cache: ``[num_blocks, num_kv_heads, head_size // x, block_size, x]``.
        value_cache: ``[num_blocks, num_kv_heads, head_size, block_size]``.
        block_tables: ``[num_seqs, max_blocks]`` int32.
        seq_lens: ``[num_seqs]`` int32, each in ``[1, min(max_seq_len, max_blocks * block_size)]``.
        max_seq_len: upper bound on ``seq_lens`` (may exceed all of them; results stay exact).
        scale: score scale; ``None`` means ``1 / sqrt(head_size)``.
        alibi_slopes: ``[num_heads]`` float32 or ``None``.
        kv_cache_dtype: ``"auto"`` or ``"fp8"`` / ``"fp8_e4m3"`` / ``"fp8_e5m2"`` (caches uint8).
        out: ``[num_seqs, num_heads, head_size]`` in the query's dtype, written in place.
        workspace: scratch buffers (default: the thread's shared workspace).
        device_spec: the profile to plan for (default: detected, see :func:`plan_for`).
    Returns:
        ``[num_seqs, num_heads, head_size]`` in the query's dtype (``out`` if given).
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
    if out is None:
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    if query.shape[0] == 0:  # an empty batch is a no-op, not an error
        return out
    plan = plan_for(query, layout, block_tables.shape[1], max_seq_len, device_spec)
    if value_checks_enabled() and not is_capturing(query.device):
        # reading values syncs, which a CUDA-graph capture forbids: capture checks nothing
        _check_values(layout, block_tables, seq_lens, max_seq_len)
    _execute(
        plan,
        workspace or default_workspace(),
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
    if alibi_slopes is not None:
        check_tensor(
            "alibi_slopes", alibi_slopes, shape=(num_heads,), dtype=torch.float32, device=device
        )
    for name, value in (("k_scale", k_scale), ("v_scale", v_scale)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"{name} must be a positive float, got {value!r}")
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


# -------------------------------------------------------------------------------------- plan
@functools.cache
def bmm_writes_fp32(device_type: str, dtype: torch.dtype) -> bool:
    """Whether ``torch.bmm(..., out_dtype=torch.float32)`` works for ``dtype`` on this device.

    CUDA builds of recent torch have it (fp16/bf16 in, fp32 accumulate *and* output); older
    torch (2.1) and the CPU do not, and the executor then upcasts keys to fp32 instead.
    """
    if dtype == torch.float32:
        return True
    if device_type != "cuda":
        return False
    try:
        a = torch.ones(1, 2, 8, dtype=dtype, device=device_type)
        return torch.bmm(a, a.transpose(1, 2), out_dtype=torch.float32).dtype == torch.float32
    except (TypeError, RuntimeError, NotImplementedError):
        return False


def plan_for(
    query: torch.Tensor,
    layout: CacheLayout,
    max_blocks: int,
    max_seq_len: int,
    device_spec: Optional[DeviceSpec] = None,
) -> DecodePlan:
    """The plan :func:`paged_decode` executes for these arguments (cached per shape and env)."""
    spec = device_spec or _detected_spec(query.device, os.environ.get("ATTN_CORE_DEVICE"))
    env = tuple(
        os.environ.get(k)
        for k in (
            "ATTN_CORE_DECODE_PARTITION_SIZE",
            "ATTN_CORE_DECODE_SINGLE_TILE_MAX",
            "ATTN_CORE_DECODE_STREAM_TOKENS",
            "ATTN_CORE_DECODE_TIER",
            "ATTN_CORE_DECODE_SUBSCRIPTION",
            "ATTN_CORE_DECODE_GATHER",
            "ATTN_CORE_DECODE_SCORES",
        )
    )
    num_seqs, num_heads, _ = query.shape
    cache_elem = 1 if layout.is_fp8 else query.element_size()
    fp32_scores = bmm_writes_fp32(query.device.type, query.dtype)
    return _cached_plan(
        num_seqs,
        num_heads,
        layout.num_kv_heads,
        layout.head_size,
        layout.block_size,
        max_seq_len,
        max_blocks,
        query.dtype,
        cache_elem,
        spec,
        fp32_scores,
        env,
    )


@functools.lru_cache(maxsize=16)
def _detected_spec(device: torch.device, forced: Optional[str]) -> DeviceSpec:
    return detect_device_spec(device)


@functools.lru_cache(maxsize=256)
def _cached_plan(
    num_seqs: int,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    max_seq_len: int,
    max_blocks: int,
    dtype: torch.dtype,
    cache_elem: int,
    spec: DeviceSpec,
    fp32_scores: bool,
    env: tuple,
) -> DecodePlan:
    return plan_decode(
        num_seqs,
        num_heads,
        num_kv_heads,
        head_size,
        block_size,
        max_seq_len,
        max_blocks,
        dtype,
        cache_element_size=cache_elem,
        device_spec=spec,
        scores_fp32_from_bmm=fp32_scores,
    )


# ----------------------------------------------------------------------------------- execute
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
    num_seqs, _, head_size = query.shape
    kv_heads, group = layout.num_kv_heads, plan.group
    rows = kv_heads * num_seqs
    # Grouped queries [kv_heads * S, group, D]: row (h, s) holds query heads h*group..+group.
    qg = ws.take("q", (kv_heads, num_seqs, group, head_size), query.dtype, query.device)
    qg.copy_(query.reshape(num_seqs, kv_heads, group, head_size).transpose(0, 1))
    qg = qg.view(rows, group, head_size)
    slopes = None
    if alibi_slopes is not None:
        slopes = alibi_slopes.reshape(kv_heads, 1, group, 1)
    merged: Optional[Triple] = None
    for chunk in range(plan.num_chunks):  # 1 unless streaming (plan.streaming)
        part = _chunk(
            plan,
            ws,
            qg,
            key_cache,
            value_cache,
            block_tables,
            seq_lens,
            scale,
            slopes,
            layout,
            k_scale,
            v_scale,
            chunk * plan.chunk_tokens,
        )
        merged = part if merged is None else merge_two(merged, part)
    assert merged is not None
    result = normalise(merged[0], merged[2])  # [rows, group, D] fp32
    by_seq = result.view(kv_heads, num_seqs, group, head_size).transpose(0, 1)
    if out.is_contiguous():
        out.view(num_seqs, kv_heads, group, head_size).copy_(by_seq)
    else:  # e.g. empty_like of a head-major query: any strides work, via one small copy
        out.copy_(by_seq.reshape(out.shape))


def _chunk(
    plan: DecodePlan,
    ws: Workspace,
    qg: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    slopes: Optional[torch.Tensor],
    layout: CacheLayout,
    k_scale: float,
    v_scale: float,
    start: int,
) -> Triple:
    """One chunk's merged ``(out [rows, G, D], max [rows, G], sum [rows, G])`` in fp32."""
    rows, group, head_size = qg.shape
    num_seqs = seq_lens.shape[0]
    kv_heads = rows // num_seqs
    c, p, ps, bs = plan.chunk_tokens, plan.num_partitions, plan.partition_size, plan.block_size
    dtype, device = qg.dtype, qg.device
    if plan.gather == "block":
        ids = block_indices(bs, c, block_tables, seq_lens, start)
        keys = gather_keys_blocks(ws, key_cache, ids, layout)
        masked = torch.arange(start, start + c, device=device)[None, :] >= seq_lens[:, None]
    else:
        blocks, offsets, masked = token_indices(bs, c, block_tables, seq_lens, start)
        keys = gather_keys_tokens(ws, key_cache, blocks, offsets, layout)

    # scores [rows, G, C] fp32
    keys = keys.view(rows, c, head_size)
    if plan.scores_in_compute_dtype:
        keys = to_compute(ws, "k_c", keys, layout, k_scale, dtype)
        rounded = ws.take("scores_c", (rows, group, c), dtype, device)
        torch.bmm(qg, keys.transpose(1, 2), out=rounded)
        scores = ws.take("scores", (rows, group, c), torch.float32, device)
        scores.copy_(rounded)
    elif plan.scores_fp32_from_bmm and dtype != torch.float32:
        keys = to_compute(ws, "k_c", keys, layout, k_scale, dtype)
        scores = torch.bmm(qg, keys.transpose(1, 2), out_dtype=torch.float32)
    else:
        keys = to_compute(ws, "k_c", keys, layout, k_scale, torch.float32)
        scores = ws.take("scores", (rows, group, c), torch.float32, device)
        torch.bmm(qg.to(torch.float32), keys.transpose(1, 2), out=scores)
    scores4 = scores.view(kv_heads, num_seqs, group, c)
    scores4.mul_(scale)
    if slopes is not None:
        rel = torch.arange(start, start + c, device=device)[None, :] - seq_lens[:, None] + 1
        scores4.add_(slopes * rel.view(1, num_seqs, 1, c).float())
    scores4.masked_fill_(masked.view(1, num_seqs, 1, c), -math.inf)

    # per-partition softmax statistics
    parts = scores.view(rows, group, p, ps)
    maxes = parts.amax(-1)  # [rows, G, P]
    parts.sub_(safe_max(maxes).unsqueeze(-1)).exp_()
    sums = parts.sum(-1)
    # Normalise each partition before the cast, as vLLM's kernels do: an unnormalised fp16
    # product P.V can reach partition_size * max|v| and overflow fp16's 65504.
    parts.div_(sums.clamp(min=1e-30).unsqueeze(-1))
    probs = ws.take("probs", (rows, p, group, ps), dtype, device)
    probs.copy_(parts.transpose(1, 2))

    # partial outputs [rows, P, G, D], normalised per partition
    if plan.gather == "block":
        partial = _values_by_blocks(
            plan, ws, probs, value_cache, block_tables, seq_lens, ids, sums, layout, v_scale, start
        )
    else:
        values = gather_values_tokens(ws, value_cache, blocks, offsets, layout)
        values = to_compute(ws, "v_c", values, layout, v_scale, dtype)
        partial = torch.bmm(probs.view(rows * p, group, ps), values.view(rows * p, ps, head_size))
        partial = partial.view(rows, p, group, head_size)
    if p == 1:  # back to the unnormalised triple, in fp32
        return partial[:, 0] * sums[..., 0].unsqueeze(-1), maxes[..., 0], sums[..., 0]
    return merge_partitions(partial, maxes.transpose(1, 2), sums.transpose(1, 2), normalised=True)


def _values_by_blocks(
    plan: DecodePlan,
    ws: Workspace,
    probs: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    ids: torch.Tensor,
    sums: torch.Tensor,
    layout: CacheLayout,
    v_scale: float,
    start: int,
) -> torch.Tensor:
    """``P . V`` per partition from D-major values: ``[rows, P, G, D]`` in the compute dtype.

    Masked slots were read from the cache as they are (possibly inf/NaN), so partitions with no
    real token are zeroed and each sequence's boundary partition is recomputed from clean
    token-level values.
    """
    rows, p, group, ps = probs.shape
    num_seqs = seq_lens.shape[0]
    kv_heads, head_size, c = rows // num_seqs, layout.head_size, plan.chunk_tokens
    vd = gather_values_dmajor(ws, value_cache, ids, layout)  # [D, KVH, S, C]
    vd = to_compute(ws, "v_c", vd, layout, v_scale, probs.dtype)
    # row b = (kv head, seq, partition) starts at b * ps; D is the slowest axis
    vt = vd.as_strided((rows * p, head_size, ps), (ps, rows * c, 1))
    partial = torch.bmm(probs.view(rows * p, group, ps), vt.transpose(1, 2))
    partial = partial.view(rows, p, group, head_size)
    empty = (sums.transpose(1, 2) == 0).unsqueeze(-1)  # [rows, P, G, 1]
    partial = partial.masked_fill(empty, 0.0)

    edge = ((seq_lens - (1 + start)) // ps).clamp_(0, p - 1)  # [S], int32
    pos = edge[:, None] * ps + torch.arange(start, start + ps, device=edge.device)[None, :]
    blocks, offsets, _ = slot_indices(plan.block_size, pos, block_tables, seq_lens)
    values = gather_values_tokens(ws, value_cache, blocks, offsets, layout, name="v_edge")
    values = to_compute(ws, "v_edge_c", values, layout, v_scale, probs.dtype)
    seqs = torch.arange(num_seqs, device=edge.device)
    edge_probs = probs.view(kv_heads, num_seqs, p, group, ps)[:, seqs, edge]  # [KVH, S, G, ps]
    fixed = torch.bmm(edge_probs.reshape(rows, group, ps), values.view(rows, ps, head_size))
    partial.view(kv_heads, num_seqs, p, group, head_size)[:, seqs, edge] = fixed.view(
        kv_heads, num_seqs, group, head_size
    )
    return partial
