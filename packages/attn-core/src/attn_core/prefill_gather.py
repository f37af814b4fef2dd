"""Reading one sequence's cached context out of the paged cache, head-major, once.

Both prefill backends attend over K/V laid out ``[num_kv_heads, tokens, head_size]``: a query
group's matmuls then read one contiguous run per KV head (GQA by broadcast over the group).
"""

from __future__ import annotations

import torch

from attn_core.cache_layout import CacheLayout, dequantize


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Context tokens ``[start, stop)`` of one sequence as ``dtype`` values.

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
    values = value_cache.permute(1, 0, 3, 2).index_select(1, ids)  # [kvh, nb, bs, hs]
    keys = keys.view(layout.num_kv_heads, -1, layout.head_size)
    values = values.view(layout.num_kv_heads, -1, layout.head_size)
    keys = dequantize(keys, layout.kv_cache_dtype, k_scale, dtype)
    values = dequantize(values, layout.kv_cache_dtype, v_scale, dtype)
    lo = start - first * bs
    return keys[:, lo : lo + stop - start], values[:, lo : lo + stop - start]


def new_tokens_head_major(
    key: torch.Tensor, value: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunk's own K/V ``[tokens, kvh, hs]`` -> ``[kvh, tokens, hs]`` as ``dtype``, one copy."""
    shape = (key.shape[1], key.shape[0], key.shape[2])
    k = torch.empty(shape, dtype=dtype, device=key.device)
    v = torch.empty(shape, dtype=dtype, device=value.device)
    k.copy_(key.transpose(0, 1))
    v.copy_(value.transpose(0, 1))
    return k, v
