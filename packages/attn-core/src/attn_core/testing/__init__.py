"""Compatibility name for :mod:`attn_core.reference` (the float64 reference and its random
paged cases), kept so existing tests, suites and scripts import unchanged. New code imports
:mod:`attn_core.reference`, whose name says what it is."""

from attn_core.reference import (
    PagedCase,
    PrefillCase,
    alibi_bias,
    make_paged_case,
    make_prefill_case,
    poison_tails,
    random_block_tables,
    reference_decode,
    reference_prefix_prefill,
    tokens_from_cache,
)

__all__ = [
    "PagedCase",
    "PrefillCase",
    "make_paged_case",
    "make_prefill_case",
    "poison_tails",
    "random_block_tables",
    "alibi_bias",
    "reference_decode",
    "reference_prefix_prefill",
    "tokens_from_cache",
]
