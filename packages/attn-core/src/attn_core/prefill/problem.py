"""One prefill call as the backends see it: the validated tensors and each sequence's span.

Neutral ground for both backends (:mod:`attn_core.prefill.torch_path`,
:mod:`attn_core.prefill.fused`)
and the verification step: :mod:`attn_core.runtime.prefill` builds these after validating the call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from attn_core.core.cache_layout import CacheLayout
from attn_core.prefill.gather import gather_context


@dataclass(frozen=True)
class SeqSpan:
    """One sequence of the packed batch: tokens ``[q0, q1)`` of the chunk, ``ctx`` cached."""

    index: int
    q0: int
    q1: int
    ctx: int

    @property
    def query_len(self) -> int:
        return self.q1 - self.q0


@dataclass(frozen=True)
class Problem:
    """The call's tensors and attention options, validated by :mod:`attn_core.runtime.prefill`."""

    query: torch.Tensor  # [num_tokens, heads, hs]
    key: torch.Tensor  # [num_tokens, kv_heads, hs]
    value: torch.Tensor  # [num_tokens, kv_heads, hs]
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32
    layout: CacheLayout
    scale: float
    alibi_slopes: Optional[torch.Tensor]  # [heads] fp32
    window: int  # 0: no sliding window
    k_scale: float
    v_scale: float


def gather_span(
    problem: Problem,
    span: SeqSpan,
    c0: int,
    c1: int,
    dtype: torch.dtype,
    *,
    sum_column: bool,
) -> tuple:
    """Context tokens ``[c0, c1)`` of one sequence: keys ``[kvh, n, hs]``, values
    ``[kvh, n, hs]`` (``[kvh, n, hs + 8]`` with the row-sum column the torch path's P@V uses)."""
    return gather_context(
        problem.key_cache,
        problem.value_cache,
        problem.block_tables[span.index],
        c0,
        c1,
        problem.layout,
        dtype,
        problem.k_scale,
        problem.v_scale,
        sum_column=sum_column,
    )
