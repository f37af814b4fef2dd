"""Random chunked-prefill problems: a paged context per sequence plus a packed chunk of new tokens.

Built on :func:`attn_core.reference.make_paged_case` (permuted blocks, poisoned unused blocks), so
the fused backends' one-time check, the tests and the bench all use the same inputs. The cache
holds blocks for ``context + new`` tokens per sequence, as in vLLM, where the chunk's K/V are
written before attention runs; prefill reads only the context part from the cache.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import torch

from attn_core.reference.paged_case import make_paged_case

_T = torch.Tensor
# Fixed length, so a type checker knows ``scale`` and the keywords are not among them.
PrefillArgs = tuple[_T, _T, _T, _T, _T, _T, _T, _T, _T, int]
# The case's fields reference_prefix_prefill takes as tensors, and the options both entry
# points take by keyword.
_REFERENCE_TENSORS = (
    "query", "key", "value", "key_cache", "value_cache", "block_tables", "query_start_loc",
    "context_lens",
)  # fmt: skip
_OPTIONS = ("alibi_slopes", "sliding_window", "kv_cache_dtype", "k_scale", "v_scale")


@dataclass
class PrefillCase:
    """Shapes: query ``[num_tokens, heads, hs]``; key/value ``[num_tokens, kv_heads, hs]``;
    caches in vLLM's layout; block_tables ``[num_seqs, max_blocks]`` int32; query_start_loc
    ``[num_seqs + 1]``, seq_lens / context_lens ``[num_seqs]``, all int32."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    block_tables: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    context_lens: torch.Tensor
    max_query_len: int
    kv_cache_dtype: str = "auto"
    k_scale: float = 1.0
    v_scale: float = 1.0
    alibi_slopes: Optional[torch.Tensor] = None
    sliding_window: Optional[int] = None

    def args(self) -> PrefillArgs:
        """Positional arguments of :func:`attn_core.paged_prefix_prefill` (all ten, none more)."""
        return (
            self.query,
            self.key,
            self.value,
            self.key_cache,
            self.value_cache,
            self.block_tables,
            self.query_start_loc,
            self.seq_lens,
            self.context_lens,
            self.max_query_len,
        )

    def kwargs(self) -> dict:
        return self._fields(_OPTIONS)

    def reference_kwargs(self) -> dict:
        """Keyword arguments of :func:`attn_core.reference.reference_prefix_prefill`."""
        return {**self._fields(_REFERENCE_TENSORS), **self.kwargs()}

    def _fields(self, names: Sequence[str]) -> dict:
        return {name: getattr(self, name) for name in names}


def make_prefill_case(
    seqs: Sequence[tuple[int, int]],
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
    alibi: bool = False,
    sliding_window: Optional[int] = None,
    seed: int = 0,
) -> PrefillCase:
    """``seqs`` lists ``(context_len, query_len)`` per sequence."""
    ctx = [c for c, _ in seqs]
    qlen = [q for _, q in seqs]
    paged = make_paged_case(
        [c + q for c, q in seqs],
        num_heads,
        num_kv_heads,
        head_size,
        block_size,
        dtype,
        device,
        kv_cache_dtype=kv_cache_dtype,
        k_scale=k_scale,
        v_scale=v_scale,
        seed=seed,
    )
    g = torch.Generator().manual_seed(seed + 1)
    total = sum(qlen)
    query = torch.randn(total, num_heads, head_size, generator=g).to(dtype)
    key = torch.randn(total, num_kv_heads, head_size, generator=g).to(dtype)
    value = torch.randn(total, num_kv_heads, head_size, generator=g).to(dtype)
    starts = [0, *itertools.accumulate(qlen)]
    slopes = None
    if alibi:
        # The standard ALiBi slopes 2^(-8 i / heads), as vLLM's models build them.
        slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / num_heads) for i in range(num_heads)])
        slopes = slopes.to(device)

    def ints(values: Sequence[int]) -> torch.Tensor:
        return torch.tensor(list(values), dtype=torch.int32, device=device)

    return PrefillCase(
        query=query.to(device),
        key=key.to(device),
        value=value.to(device),
        key_cache=paged.key_cache,
        value_cache=paged.value_cache,
        block_tables=paged.block_tables,
        query_start_loc=ints(starts),
        seq_lens=ints([c + q for c, q in seqs]),
        context_lens=ints(ctx),
        max_query_len=max(1, max(qlen, default=1)),
        kv_cache_dtype=kv_cache_dtype,
        k_scale=k_scale,
        v_scale=v_scale,
        alibi_slopes=slopes,
        sliding_window=sliding_window,
    )
