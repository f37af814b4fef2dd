"""Reading decode's K/V out of the paged cache into layouts one batched matmul consumes.

Two ways, chosen by ``DecodePlan.gather``:

- ``"token"``: slot-level advanced indexing. Keys and values land token-major
  ``[kv_heads, S, C, D]``; masked slots read the sequence's token 0, so they hold finite values.
  Values are read across the cache's ``[D, block]`` layout (2-byte reads, strided).
- ``"block"``: whole-block ``index_select`` with 8-byte elements. Keys land token-major (16-byte
  vectors); values land D-major ``[D, kv_heads, S, C]``, which is already the transposed
  right-hand side of the ``P . V`` bmm, batch ``(kv_heads, S, partition)`` at stride
  ``partition_size``. Masked slots hold whatever the cache holds there; decode drops partitions
  that are wholly masked and recomputes each sequence's boundary partition from token-level
  values (:func:`gather_values_tokens`), a fixed ``S x partition_size`` extra read.

Both return storage-dtype tensors; :func:`to_compute` converts (fp8 dequantisation included).
"""

from __future__ import annotations

import torch

from attn_core.cache_layout import CacheLayout, fp8_dtype
from attn_core.workspace import Workspace


def _int64_view_ok(t: torch.Tensor) -> bool:
    """Whether ``t.view(torch.int64)`` works: last dim contiguous, 8-byte multiple and aligned."""
    last_bytes = t.shape[-1] * t.element_size()
    return (
        t.stride(-1) == 1 and last_bytes % 8 == 0 and t.storage_offset() * t.element_size() % 8 == 0
    )


def token_indices(
    block_size: int, chunk: int, block_tables: torch.Tensor, seq_lens: torch.Tensor, start: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(block ids, offsets, masked)``, each ``[S, chunk]``; masked slots point at token 0."""
    pos = torch.arange(start, start + chunk, device=seq_lens.device)
    return slot_indices(block_size, pos[None, :], block_tables, seq_lens)


def slot_indices(
    block_size: int, pos: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cache coordinates of token positions ``pos`` (``[S, n]`` or ``[1, n]``)."""
    masked = pos >= seq_lens[:, None]
    tok = pos.masked_fill(masked, 0)
    col = (tok // block_size).clamp_(max=block_tables.shape[1] - 1)
    return block_tables.gather(1, col).long(), tok % block_size, masked


def block_indices(
    block_size: int, chunk: int, block_tables: torch.Tensor, seq_lens: torch.Tensor, start: int
) -> torch.Tensor:
    """Block ids ``[S, chunk // block_size]``; blocks past a sequence's end read its block 0."""
    first = start // block_size
    col = torch.arange(first, first + chunk // block_size, device=seq_lens.device)
    used = (seq_lens[:, None] + block_size - 1) // block_size
    col = col[None, :].masked_fill(col[None, :] >= used, 0)
    return block_tables.gather(1, col).long()


def gather_keys_tokens(
    ws: Workspace,
    key_cache: torch.Tensor,
    blocks: torch.Tensor,
    offsets: torch.Tensor,
    layout: CacheLayout,
) -> torch.Tensor:
    """Keys ``[kv_heads, S, C, D]`` (storage dtype), one gather of 16-byte vectors."""
    s, c = blocks.shape
    src, dst = _key_source(ws, key_cache, layout, (s, c))
    torch.ops.aten.index.Tensor_out(src, [None, blocks, offsets], out=dst)
    return dst.view(key_cache.dtype).view(layout.num_kv_heads, s, c, layout.head_size)


def gather_keys_blocks(
    ws: Workspace, key_cache: torch.Tensor, ids: torch.Tensor, layout: CacheLayout
) -> torch.Tensor:
    """Keys ``[kv_heads, S, C, D]`` (storage dtype) by whole blocks, ``ids [S, C // block]``."""
    s, nblk = ids.shape
    src, dst = _key_source(ws, key_cache, layout, (s * nblk,))
    torch.index_select(src, 1, ids.view(-1), out=dst)
    c = nblk * layout.block_size
    return dst.view(key_cache.dtype).view(layout.num_kv_heads, s, c, layout.head_size)


def _key_source(
    ws: Workspace, key_cache: torch.Tensor, layout: CacheLayout, index_shape: tuple
) -> tuple[torch.Tensor, torch.Tensor]:
    """The cache viewed ``[KVH, NB, BS, D/x, 16-byte vector]`` and a destination for a gather."""
    kvh, chunks = layout.num_kv_heads, layout.head_size // layout.x
    if _int64_view_ok(key_cache):
        src = key_cache.view(torch.int64).permute(1, 0, 3, 2, 4)
        vec, dtype = 2, torch.int64
    else:
        src = key_cache.permute(1, 0, 3, 2, 4)
        vec, dtype = layout.x, key_cache.dtype
    if len(index_shape) == 1:  # whole blocks: [KVH, n, BS, D/x, vec]
        shape = (kvh, index_shape[0], layout.block_size, chunks, vec)
    else:  # slots: [KVH, S, C, D/x, vec]
        shape = (kvh, *index_shape, chunks, vec)
    return src, ws.take("k", shape, dtype, key_cache.device)


def gather_values_tokens(
    ws: Workspace,
    value_cache: torch.Tensor,
    blocks: torch.Tensor,
    offsets: torch.Tensor,
    layout: CacheLayout,
    name: str = "v",
) -> torch.Tensor:
    """Values ``[kv_heads, S, n, D]`` (storage dtype) of slots ``blocks/offsets [S, n]``."""
    s, n = blocks.shape
    src = value_cache.permute(1, 0, 3, 2)  # [KVH, NB, BS, D]
    dst = ws.take(
        name, (layout.num_kv_heads, s, n, layout.head_size), value_cache.dtype, value_cache.device
    )
    torch.ops.aten.index.Tensor_out(src, [None, blocks, offsets], out=dst)
    return dst


def gather_values_dmajor(
    ws: Workspace, value_cache: torch.Tensor, ids: torch.Tensor, layout: CacheLayout
) -> torch.Tensor:
    """Values ``[D, kv_heads, S, C]`` (storage dtype) by whole blocks, ``ids [S, C // block]``."""
    s, nblk = ids.shape
    bs, kvh, d = layout.block_size, layout.num_kv_heads, layout.head_size
    if _int64_view_ok(value_cache):
        src = value_cache.view(torch.int64).permute(2, 1, 0, 3)  # [D, KVH, NB, BS / per-int64]
        per = 8 // value_cache.element_size()
        dst = ws.take("v", (d, kvh, s * nblk, bs // per), torch.int64, value_cache.device)
    else:
        src = value_cache.permute(2, 1, 0, 3)  # [D, KVH, NB, BS]
        dst = ws.take("v", (d, kvh, s * nblk, bs), value_cache.dtype, value_cache.device)
    torch.index_select(src, 2, ids.view(-1), out=dst)
    return dst.view(value_cache.dtype).view(d, kvh, s, nblk * bs)


def to_compute(
    ws: Workspace,
    name: str,
    stored: torch.Tensor,
    layout: CacheLayout,
    scale: float,
    dtype: torch.dtype,
) -> torch.Tensor:
    """``stored`` as ``dtype`` (fp8 dequantised by ``scale``); no copy when it already is."""
    if not layout.is_fp8 and stored.dtype == dtype:
        return stored
    dst = ws.take(name, tuple(stored.shape), dtype, stored.device)
    if layout.is_fp8:
        dst.copy_(stored.view(fp8_dtype(layout.kv_cache_dtype)))
        if scale != 1.0:
            dst.mul_(scale)
    else:
        dst.copy_(stored)
    return dst
