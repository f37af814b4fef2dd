"""Reading one sequence's cached context out of the paged cache, head-major, once.

Both prefill backends attend over K/V laid out ``[num_kv_heads, tokens, head_size]``: a query
group's matmuls then read one contiguous run per KV head (GQA by broadcast over the group).
"""

from __future__ import annotations

import torch

from attn_core.core.cache_layout import CacheLayout, dequantize


def gather_context(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_row: torch.Tensor,
    start: int,
    stop: int,
    layout: CacheLayout,
    dtype: torch.dtype,
    k_scale: float,
    v_scale: float,
    sum_column: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Context tokens ``[start, stop)`` of one sequence as ``dtype`` values.

    ``sum_column``: values come as ``[kvh, n, hs + SUM_COLUMNS]`` (:func:`sum_column_buffer`),
    gathered one KV head at a time straight into that buffer, so the padded copy never coexists
    with a whole unpadded one (peak extra memory: one head's values).

    Args:
        key_cache: ``[num_blocks, num_kv_heads, head_size // x, block_size, x]``.
        value_cache: ``[num_blocks, num_kv_heads, head_size, block_size]``.
        block_row: ``[max_blocks]`` int32, the sequence's block-table row (stays on the device).
    Returns:
        ``(keys, values)``, each ``[num_kv_heads, stop - start, head_size]`` (views into one
        gathered copy each; the token axis may be strided).
    """
    bs = layout.block_size
    first, last = start // bs, -(-stop // bs)
    ids = block_row[first:last].long()
    # One index_select per cache straight into head-major order: the permuted view lets the
    # gather write [kvh, blocks, block_size, ...] contiguously, so no second transpose copy.
    keys = key_cache.permute(1, 0, 3, 2, 4).index_select(1, ids)  # [kvh, nb, bs, hs/x, x]
    keys = keys.view(layout.num_kv_heads, -1, layout.head_size)
    keys = dequantize(keys, layout.kv_cache_dtype, k_scale, dtype)
    lo, n = start - first * bs, stop - start
    heads_first = value_cache.permute(1, 0, 3, 2)  # [kvh, blocks, bs, hs]
    if not sum_column:
        values = heads_first.index_select(1, ids).view(layout.num_kv_heads, -1, layout.head_size)
        values = dequantize(values, layout.kv_cache_dtype, v_scale, dtype)
        return keys[:, lo : lo + n], values[:, lo : lo + n]
    hs = layout.head_size
    values = sum_column_buffer(layout.num_kv_heads, n, hs, dtype, key_cache.device)
    for h in range(layout.num_kv_heads):
        one = heads_first[h].index_select(0, ids).view(-1, hs)[lo : lo + n]
        values[h, :, :hs].copy_(dequantize(one, layout.kv_cache_dtype, v_scale, dtype))
    return keys[:, lo : lo + n], values


def new_tokens_head_major(
    key: torch.Tensor, value: torch.Tensor, dtype: torch.dtype, sum_column: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunk's own K/V ``[tokens, kvh, hs]`` -> ``[kvh, tokens, hs]`` as ``dtype``, one copy
    (values ``[kvh, tokens, hs + SUM_COLUMNS]`` with ``sum_column``)."""
    kvh, n, hs = key.shape[1], key.shape[0], key.shape[2]
    k = torch.empty((kvh, n, hs), dtype=dtype, device=key.device)
    k.copy_(key.transpose(0, 1))
    if sum_column:
        v = sum_column_buffer(kvh, n, hs, dtype, value.device)
        v[..., :hs].copy_(value.transpose(0, 1))
    else:
        v = torch.empty((kvh, n, hs), dtype=dtype, device=value.device)
        v.copy_(value.transpose(0, 1))
    return k, v


# P @ [V | 1 | 0...] yields P @ V and P's row sums from one GEMM, so the softmax needs no separate
# row-sum pass over the score tile (2 of the ~16 bytes it moves per score with fp16 scores). 8
# extra columns keep fp16/bf16 rows 16-byte aligned for tensor-core GEMMs; they cost 3 % more
# P @ V FLOPs at head size 256 and are written once per gather (not per tile).
SUM_COLUMNS = 8


def sum_column_buffer(
    kvh: int, n: int, hs: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """``[kvh, n, hs + SUM_COLUMNS]`` with column ``hs`` ones and the rest after it zeros;
    columns ``[:hs]`` are left for the values."""
    out = torch.empty((kvh, n, hs + SUM_COLUMNS), dtype=dtype, device=device)
    out[..., hs + 1 :].zero_()
    out[..., hs].fill_(1)
    return out
