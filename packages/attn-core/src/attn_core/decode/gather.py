"""Reading decode's K/V out of the paged cache by whole blocks, into the layouts its bmms read.

One ``index_select`` each for K and V along the block axis of a permuted *view* of the cache,
moving wide elements (16-byte ``complex128`` or 8-byte ``int64`` views of the raw bytes; bytes
are copied, never interpreted, so inf/NaN/fp8 patterns pass unchanged):

- keys land token-major ``[kv_heads, S, C, D]``: row ``(h, s)`` is the ``[C, D]`` right-hand
  side of the score bmm (transposed), batch stride ``C * D``;
- values land D-major ``[D, kv_heads, S, C]``: row ``(h, s)`` is ``[D, C]`` with batch stride
  ``C`` and ``D`` stride ``kv_heads * S * C``, i.e. the transposed right-hand side of ``P . V``,
  for whole rows (``C``) or per partition (``ps``, batch stride ``ps``).

On the H200 (GPU run 1, 100K tokens, 4 KV heads, head 256, fp16) the block gather moved K+V in
0.354 ms against 0.878 ms for a token-level ``index``; it is the only gather decode uses.

Slots past a sequence's end read whatever the cache holds there: :func:`block_ids` points
blocks past the sequence's last block at its first block (a real block, always in range), and
decode zeroes the last block's unused tail in the gathered values (see
``attn_core.runtime.decode``).

All return storage-dtype tensors; :func:`to_compute` converts (fp8 dequantisation included).
"""

from __future__ import annotations

import torch

from attn_core.core.cache_layout import CacheLayout, fp8_dtype
from attn_core.core.workspace import Workspace

# Element views tried widest first: wider elements mean fewer, vectorised index_select copies.
_WIDE = {16: torch.complex128, 8: torch.int64}


def wide_view(t: torch.Tensor, max_bytes: int) -> torch.Tensor:
    """``t`` viewed with the widest element (<= ``max_bytes``) its last dim and alignment allow.

    The last dimension shrinks by ``width / element_size``; ``t`` itself if nothing fits.
    """
    for width, dtype in _WIDE.items():
        if width > max_bytes:
            continue
        last_bytes = t.shape[-1] * t.element_size()
        if (
            t.stride(-1) == 1
            and last_bytes % width == 0
            and (t.storage_offset() * t.element_size()) % width == 0
            and all(s * t.element_size() % width == 0 for s in t.stride()[:-1])
        ):
            return t.view(dtype)
    return t


def block_ids(
    block_tables: torch.Tensor, past_end: torch.Tensor, first_col: int, nblk: int, ws: Workspace
) -> torch.Tensor:
    """Block ids ``[S, nblk]`` of table columns ``first_col..+nblk``; blocks past a sequence's
    end (``past_end [S, nblk]``, True where the block's first slot is masked) read the
    sequence's first block, so every id is one the sequence owns. One ``where``, plus one more
    when the columns run past the table's width: those are past the end for every valid input;
    one that is not (``seq_lens`` beyond the table, unchecked without ``ATTN_CORE_CHECKS=1``)
    gets id -1, so the gather fails (IndexError / device assert) instead of reading another
    block."""
    width = block_tables.shape[1]
    first = block_tables[:, :1]
    ids = ws.take("ids", (block_tables.shape[0], nblk), block_tables.dtype, block_tables.device)
    inside = min(nblk, max(0, width - first_col))
    cols = block_tables[:, first_col : first_col + inside]
    torch.where(past_end[:, :inside], first, cols, out=ids[:, :inside])
    # made whether or not this call needs it, so the workspace's contents never depend on length
    no_block = ws.constant(
        ("no_block", ids.dtype), lambda d: torch.full((), -1, dtype=ids.dtype, device=d), ids.device
    )
    if inside < nblk:
        torch.where(past_end[:, inside:], first, no_block, out=ids[:, inside:])
    return ids


def gather_keys(
    ws: Workspace, key_cache: torch.Tensor, ids: torch.Tensor, layout: CacheLayout, width: int
) -> torch.Tensor:
    """Keys ``[kv_heads, S, C, D]`` (storage dtype) of blocks ``ids [S, C // block]``."""
    s, nblk = ids.shape
    src = wide_view(key_cache, width).permute(1, 0, 3, 2, 4)  # [KVH, NB, BS, D/x, vec]
    shape = (src.shape[0], s * nblk, *src.shape[2:])
    dst = ws.take("k", shape, src.dtype, key_cache.device)
    torch.index_select(src, 1, ids.view(-1), out=dst)
    c = nblk * layout.block_size
    return dst.view(key_cache.dtype).view(layout.num_kv_heads, s, c, layout.head_size)


def gather_values(
    ws: Workspace, value_cache: torch.Tensor, ids: torch.Tensor, layout: CacheLayout, width: int
) -> torch.Tensor:
    """Values ``[D, kv_heads, S, C]`` (storage dtype) of blocks ``ids [S, C // block]``."""
    s, nblk = ids.shape
    src = wide_view(value_cache, width).permute(2, 1, 0, 3)  # [D, KVH, NB, BS / per element]
    shape = (src.shape[0], src.shape[1], s * nblk, src.shape[3])
    dst = ws.take("v", shape, src.dtype, value_cache.device)
    torch.index_select(src, 2, ids.view(-1), out=dst)
    c = nblk * layout.block_size
    return dst.view(value_cache.dtype).view(layout.head_size, layout.num_kv_heads, s, c)


def to_compute(
    ws: Workspace,
    name: str,
    stored: torch.Tensor,
    layout: CacheLayout,
    dtype: torch.dtype,
) -> torch.Tensor:
    """``stored`` as ``dtype`` (fp8 reinterpreted, unscaled); no copy when it already is."""
    if not layout.is_fp8 and stored.dtype == dtype:
        return stored
    dst = ws.take(name, tuple(stored.shape), dtype, stored.device)
    dst.copy_(stored.view(fp8_dtype(layout.kv_cache_dtype)) if layout.is_fp8 else stored)
    return dst
