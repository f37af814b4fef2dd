"""Random paged-attention inputs in vLLM 0.6.3's layout, for tests, self-tests and benchmarks.

Blocks are handed out in a random permutation (so a sequence's blocks are scattered over the
cache), block-table rows are padded with further random block ids past the sequence's end, and
blocks no sequence owns are filled with large values, so reading a wrong block shows up as a
large error rather than passing by luck.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import torch

from attn_core.reference.attention import reference_decode


@dataclass
class PagedCase:
    """One decode-shaped problem: a query per sequence over its paged context.

    Shapes: query ``[num_seqs, num_heads, head_size]``; key_cache
    ``[num_blocks, num_kv_heads, head_size // x, block_size, x]``; value_cache
    ``[num_blocks, num_kv_heads, head_size, block_size]``; block_tables ``[num_seqs, max_blocks]``
    int32; seq_lens ``[num_seqs]`` int32.
    """

    query: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    kv_cache_dtype: str = "auto"
    k_scale: float = 1.0
    v_scale: float = 1.0

    @property
    def max_seq_len(self) -> int:
        return int(self.seq_lens.max())

    def reference(
        self, scale: Optional[float] = None, alibi_slopes: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """The float64 decode of this case, its cache dtype and fp8 scales included
        (:func:`reference_decode`): ``[num_seqs, num_heads, head_size]`` on the CPU."""
        return reference_decode(
            self.query, self.key_cache, self.value_cache, self.block_tables, self.seq_lens,
            scale, alibi_slopes, self.kv_cache_dtype, self.k_scale, self.v_scale,
        )  # fmt: skip


def random_block_tables(
    seq_lens: Sequence[int],
    block_size: int,
    num_blocks: int,
    *,
    extra_blocks: int = 0,
    generator: Optional[torch.Generator] = None,
    non_contiguous: bool = False,
) -> torch.Tensor:
    """Block tables that give each sequence distinct, randomly permuted blocks.

    Returns ``[num_seqs, max_blocks + extra_blocks]`` int32 on the CPU. With ``non_contiguous``
    the result is a column slice of a wider table (stride(0) > max_blocks).
    """
    need = [(n + block_size - 1) // block_size for n in seq_lens]
    width = max(need) + extra_blocks
    if sum(need) > num_blocks:
        raise ValueError(f"num_blocks must be at least {sum(need)}, got {num_blocks}")
    perm = torch.randperm(num_blocks, generator=generator)
    pad = 3 if non_contiguous else 0
    wide = torch.randint(0, num_blocks, (len(seq_lens), width + pad), generator=generator)
    # Slice first, fill the view: filling the wide table and slicing after would drop each
    # row's first `pad` blocks and leave random (shared) ids in use, so sequences would read
    # each other's blocks (an H200 run caught it with poisoned tails).
    table = wide.to(torch.int32)[:, pad:]
    used = 0
    for s, count in enumerate(need):
        table[s, :count] = perm[used : used + count].to(torch.int32)
        used += count
    return table


def make_paged_case(
    seq_lens: Sequence[int],
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int = 16,
    dtype: torch.dtype = torch.float16,
    device: str | torch.device = "cpu",
    *,
    kv_cache_dtype: str = "auto",
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    spare_blocks: int = 3,
    extra_table_blocks: int = 2,
    non_contiguous_tables: bool = False,
    seed: int = 0,
) -> PagedCase:
    """Build a random case; ``spare_blocks`` unused blocks are filled with large values."""
    g = torch.Generator().manual_seed(seed)
    need = sum((n + block_size - 1) // block_size for n in seq_lens)
    num_blocks = need + spare_blocks
    tables = random_block_tables(
        seq_lens,
        block_size,
        num_blocks,
        extra_blocks=extra_table_blocks,
        generator=g,
        non_contiguous=non_contiguous_tables,
    )
    if kv_cache_dtype == "auto":
        store = dtype
        elem = torch.empty((), dtype=dtype).element_size()
    else:
        store = torch.uint8
        elem = 1
    x = 16 // elem
    k = torch.randn(num_blocks, num_kv_heads, head_size // x, block_size, x, generator=g)
    v = torch.randn(num_blocks, num_kv_heads, head_size, block_size, generator=g)
    owned = torch.zeros(num_blocks, dtype=torch.bool)
    for s, n in enumerate(seq_lens):
        owned[tables[s, : (n + block_size - 1) // block_size].long()] = True
    k[~owned] *= 30.0
    v[~owned] *= 30.0
    if kv_cache_dtype == "auto":
        key_cache, value_cache = k.to(store), v.to(store)
    else:
        name = "float8_e5m2" if kv_cache_dtype == "fp8_e5m2" else "float8_e4m3fn"
        f8 = getattr(torch, name)
        key_cache = (k / k_scale).to(f8).view(torch.uint8)
        value_cache = (v / v_scale).to(f8).view(torch.uint8)
    query = torch.randn(len(seq_lens), num_heads, head_size, generator=g).to(dtype)
    return PagedCase(
        query=query.to(device),
        key_cache=key_cache.to(device),
        value_cache=value_cache.to(device),
        block_tables=tables.to(device),
        seq_lens=torch.tensor(list(seq_lens), dtype=torch.int32, device=device),
        kv_cache_dtype=kv_cache_dtype,
        k_scale=k_scale,
        v_scale=v_scale,
    )


def poison_tails(case: PagedCase) -> None:
    """Fill every cache slot past each sequence's end inside its last block with NaN (fp8 caches:
    the format's NaN byte, 0x7F), as a reused block may hold: masked slots must never reach an
    output. Reads ``seq_lens`` and ``block_tables`` on the host (test and verification use)."""
    bs = case.key_cache.shape[3]
    nan = 0x7F if case.kv_cache_dtype != "auto" else math.nan
    for s, n in enumerate(case.seq_lens.tolist()):
        if n % bs:
            block = int(case.block_tables[s, (n - 1) // bs])
            case.key_cache[block, :, :, n % bs :, :] = nan
            case.value_cache[block, :, :, n % bs :] = nan
