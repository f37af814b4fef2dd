"""Good keyword arguments for each public entry point, for the bad-input tests to spoil."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from decode_helpers import paged_tensors

from attn_core import paged_decode, paged_prefix_prefill, write_to_paged_cache
from attn_core.reference import PagedCase, make_paged_case, make_prefill_case


def small_paged_case() -> PagedCase:
    """Lengths 5 and 40 at block 16: tables of 3 + 2 = 5 columns, capacity 80 tokens."""
    return make_paged_case((5, 40), 8, 2, 64, 16, torch.float16)


def decode_args_of(case: PagedCase, max_seq_len: int, **kwargs: Any) -> dict[str, Any]:
    """Keyword arguments of :func:`attn_core.paged_decode` on ``case``, and ``kwargs``."""
    return dict(paged_tensors(case), max_seq_len=max_seq_len, **kwargs)


def decode_args() -> dict[str, Any]:
    case = small_paged_case()
    out = torch.empty_like(case.query)
    return decode_args_of(case, 40, scale=0.125, k_scale=1.0, v_scale=1.0, out=out)


def prefill_args() -> dict[str, Any]:
    case = make_prefill_case(((20, 5), (0, 3), (7, 4)), 8, 2, 64, 16, torch.float16, seed=1)
    names = (
        "query key value key_cache value_cache block_tables query_start_loc seq_lens "
        "context_lens max_query_len"
    ).split()
    args = dict(zip(names, case.args(), strict=True))
    args.update(case.kwargs(), scale=0.125, out=torch.empty_like(case.query))
    return args


def write_args() -> dict[str, Any]:
    case = small_paged_case()
    g = torch.Generator().manual_seed(3)
    return dict(
        key=torch.randn(4, 2, 64, generator=g).half(),
        value=torch.randn(4, 2, 64, generator=g).half(),
        key_cache=case.key_cache,
        value_cache=case.value_cache,
        slot_mapping=torch.tensor([0, 17, -1, 33]),
        kv_cache_dtype="auto",
        k_scale=1.0,
        v_scale=1.0,
    )


ENTRY_POINTS: dict[str, tuple[Callable[..., Any], Callable[[], dict[str, Any]]]] = {
    "paged_decode": (paged_decode, decode_args),
    "paged_prefix_prefill": (paged_prefix_prefill, prefill_args),
    "write_to_paged_cache": (write_to_paged_cache, write_args),
}


def call_with(entry: str, name: str, value: Any) -> Any:
    """``entry`` (a key of :data:`ENTRY_POINTS`) on its good arguments with ``name`` set to
    ``value``."""
    fn, make_args = ENTRY_POINTS[entry]
    args = make_args()
    args[name] = value
    return fn(**args)
