"""Validating one prefill call: every argument checked once, the call's one host read.

:func:`validate_prefill` is what :func:`attn_core.paged_prefix_prefill` runs before planning,
and what the one-time check of a fused backend (:mod:`attn_core.prefill.verify`) runs on its
case; both then hand the :class:`~attn_core.prefill.problem.Problem` and its spans to a backend.
"""

from __future__ import annotations

import torch

from attn_core.core.cache_layout import COMPUTE_DTYPES, check_block_tables, validate_caches
from attn_core.core.checks import (
    check_heads,
    check_positive,
    check_positive_finite,
    check_tensor,
    check_window,
    resolve_scale,
    value_checks_enabled,
)
from attn_core.prefill.problem import Problem, SeqSpan

_LEN_DTYPES = (torch.int32, torch.int64)


def validate_prefill(
    query,
    key,
    value,
    key_cache,
    value_cache,
    block_tables,
    query_start_loc,
    seq_lens,
    context_lens,
    max_query_len,
    scale,
    alibi_slopes,
    sliding_window,
    kv_cache_dtype,
    k_scale,
    v_scale,
) -> tuple[Problem, list[SeqSpan]]:
    """The validated call and each sequence's span; ``ValueError`` / ``TypeError`` naming the
    argument, the expected and the actual value. Arguments in
    :func:`attn_core.paged_prefix_prefill`'s order (``scale`` and the keywords positional)."""
    check_tensor("query", query, ndim=3, dtype=COMPUTE_DTYPES)
    device = query.device
    num_tokens, heads, head_size = query.shape
    layout = validate_caches(
        key_cache, value_cache, kv_cache_dtype, compute_dtype=query.dtype, device=device
    )
    check_heads(query)
    if head_size != layout.head_size:
        raise ValueError(
            f"query's head_size (dimension 2) must match the caches' head_size "
            f"{layout.head_size}, got {head_size}"
        )
    kvh = layout.num_kv_heads
    if heads % kvh:
        raise ValueError(f"query's num_heads must be a multiple of num_kv_heads {kvh}, got {heads}")
    for name, t in (("key", key), ("value", value)):
        check_tensor(name, t, shape=(num_tokens, kvh, head_size), dtype=query.dtype, device=device)
    num_seqs = check_tensor("seq_lens", seq_lens, ndim=1, dtype=_LEN_DTYPES, device=device).shape[0]
    check_tensor("context_lens", context_lens, shape=(num_seqs,), dtype=_LEN_DTYPES, device=device)
    check_tensor(
        "query_start_loc", query_start_loc, shape=(num_seqs + 1,), dtype=_LEN_DTYPES, device=device
    )
    max_blocks = check_block_tables(block_tables, num_seqs, device)
    check_positive("max_query_len", max_query_len)
    if alibi_slopes is not None:
        check_tensor(
            "alibi_slopes", alibi_slopes, shape=(heads,), dtype=torch.float32, device=device
        )
    window = check_window(sliding_window)
    check_positive_finite("k_scale", k_scale)
    check_positive_finite("v_scale", v_scale)
    spans = _spans(
        query_start_loc,
        seq_lens,
        context_lens,
        num_tokens,
        max_query_len,
        max_blocks * layout.block_size,
        layout.num_blocks,
    )
    if value_checks_enabled() and device.type != "meta":
        _check_block_ids(block_tables, spans, layout.block_size, layout.num_blocks)
    problem = Problem(
        query=query,
        key=key,
        value=value,
        key_cache=key_cache,
        value_cache=value_cache,
        block_tables=block_tables,
        layout=layout,
        scale=resolve_scale(scale, head_size),
        alibi_slopes=alibi_slopes,
        window=window,
        k_scale=float(k_scale),
        v_scale=float(v_scale),
    )
    return problem, spans


def _check_block_ids(
    block_tables: torch.Tensor, spans: list[SeqSpan], block_size: int, num_blocks: int
) -> None:
    """``ATTN_CORE_CHECKS=1``: the block ids each sequence's context reads are in
    ``[0, num_blocks)`` (one device read; the call has read its lengths already)."""
    needed = torch.tensor(
        [-(-s.ctx // block_size) for s in spans], dtype=torch.long, device=block_tables.device
    )
    cols = torch.arange(block_tables.shape[1], device=block_tables.device)
    used = block_tables[cols[None, :] < needed[:, None]]
    if used.numel() == 0:
        return
    lo, hi = int(used.min()), int(used.max())
    if lo < 0 or hi >= num_blocks:
        raise ValueError(
            f"block_tables entries in use must be in [0, {num_blocks - 1}], got min {lo} max {hi}"
        )


def _spans(
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    context_lens: torch.Tensor,
    num_tokens: int,
    max_query_len: int,
    capacity: int,
    num_blocks: int,
) -> list[SeqSpan]:
    """Per-sequence token ranges; the call's one host read of device values."""
    n = seq_lens.shape[0]
    host = torch.cat([query_start_loc.long(), seq_lens.long(), context_lens.long()]).tolist()
    starts, lens, ctxs = host[: n + 1], host[n + 1 : 2 * n + 1], host[2 * n + 1 :]
    if starts[0] != 0 or starts[-1] != num_tokens:
        raise ValueError(
            f"query_start_loc must run from 0 to num_tokens={num_tokens}, "
            f"got {starts[0]} .. {starts[-1]}"
        )
    for i in range(n):
        if starts[i + 1] < starts[i]:
            raise ValueError(
                f"query_start_loc must be non-decreasing, got {starts[i]} then {starts[i + 1]} "
                f"at index {i}"
            )
    spans = []
    for i in range(n):
        qlen = starts[i + 1] - starts[i]
        if qlen > max_query_len:
            raise ValueError(
                f"max_query_len must be >= every query length, got {max_query_len} but "
                f"sequence {i} has {qlen}"
            )
        if ctxs[i] < 0:
            raise ValueError(f"context_lens must be >= 0, got {ctxs[i]} for sequence {i}")
        if lens[i] != ctxs[i] + qlen:
            raise ValueError(
                f"seq_lens must equal context_lens + query lengths, got seq_lens[{i}]={lens[i]}, "
                f"expected {ctxs[i]} + {qlen} = {ctxs[i] + qlen}"
            )
        if ctxs[i] > 0 and num_blocks == 0:
            raise ValueError(
                f"key_cache must hold at least one block when a sequence has context, got 0 "
                f"blocks and context_lens[{i}]={ctxs[i]}"
            )
        if ctxs[i] > capacity:
            raise ValueError(
                f"context_lens[{i}] must fit the block table's capacity of {capacity} tokens, "
                f"got {ctxs[i]}"
            )
        spans.append(SeqSpan(index=i, q0=starts[i], q1=starts[i + 1], ctx=ctxs[i]))
    return spans
