"""Calling paged_decode on a PagedCase with a NaN-poisoned ``out``, and its reference."""

from __future__ import annotations

from typing import Any, Optional

import torch
from conftest import poisoned_like

from attn_core import (
    AttentionShape,
    DecodeLengths,
    DecodeOverrides,
    DecodePlan,
    decode_plan_for,
    paged_decode,
)
from attn_core.core.workspace import Workspace
from attn_core.reference import PagedCase, reference_decode

# PagedCase's tensors in paged_decode's (and launch_decode's) argument order, under those names
PAGED_TENSORS = ("query", "key_cache", "value_cache", "block_tables", "seq_lens")


def paged_tensors(case: PagedCase) -> dict[str, torch.Tensor]:
    """``case``'s query, caches, block tables and lengths as the keyword arguments of
    :func:`attn_core.paged_decode` (in its positional order)."""
    return {name: getattr(case, name) for name in PAGED_TENSORS}


def decode_on(case: PagedCase, max_seq_len: int, **kwargs: Any) -> torch.Tensor:
    """:func:`attn_core.paged_decode` on ``case``'s tensors up to ``max_seq_len``, with the
    keyword arguments ``kwargs``."""
    return paged_decode(**paged_tensors(case), max_seq_len=max_seq_len, **kwargs)


def plan_of(case: PagedCase, max_seq_len: Optional[int] = None, **overrides: object) -> DecodePlan:
    """The plan for ``case`` on its device with :class:`DecodeOverrides` fields ``overrides``
    (none: the plan decides); the environment is not read."""
    _, heads, head_size = case.query.shape
    shape = AttentionShape(
        heads,
        case.key_cache.shape[1],
        head_size,
        case.value_cache.shape[3],
        case.query.dtype,
        case.kv_cache_dtype,
    )
    lengths = DecodeLengths(
        case.query.shape[0], max_seq_len or case.max_seq_len, case.block_tables.shape[1]
    )
    return decode_plan_for(
        shape, lengths, case.query.device, overrides=DecodeOverrides(**overrides)
    )


def run_decode(
    case: PagedCase,
    max_seq_len: Optional[int] = None,
    *,
    alibi_slopes: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    workspace: Optional[Workspace] = None,
    **overrides: object,
) -> torch.Tensor:
    """One call with a poisoned ``out``, through the plan :func:`plan_of` makes."""
    out = poisoned_like(case.query)
    result = decode_on(
        case,
        max_seq_len or case.max_seq_len,
        scale=scale,
        alibi_slopes=alibi_slopes,
        kv_cache_dtype=case.kv_cache_dtype,
        k_scale=case.k_scale,
        v_scale=case.v_scale,
        out=out,
        workspace=workspace or Workspace(),
        plan=plan_of(case, max_seq_len, **overrides),
    )
    assert result is out
    return out


def reference(
    case: PagedCase,
    *,
    alibi_slopes: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
) -> torch.Tensor:
    return reference_decode(
        case.query,
        case.key_cache,
        case.value_cache,
        case.block_tables,
        case.seq_lens,
        scale,
        alibi_slopes,
        case.kv_cache_dtype,
        case.k_scale,
        case.v_scale,
    )


def slopes_for(num_heads: int, device: str = "cpu") -> torch.Tensor:
    """ALiBi slopes as models define them: 2^(-8 (i+1) / num_heads)."""
    i = torch.arange(num_heads, dtype=torch.float32)
    return torch.pow(2.0, -8.0 * (i + 1) / num_heads).to(device)
