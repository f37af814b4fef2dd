"""Test support shipped with attn-core: the float64 reference and random paged inputs.

It is part of the installed package (not only ``tests/``) because engine-patch's ``status``
self-test and the HIL suites check the device against the same reference the unit tests use.
Nothing here imports attn-core's execution code: the reference must stay independent of it.
"""

from attn_core.testing.paged_inputs import (
    PagedCase,
    make_paged_case,
    poison_tails,
    random_block_tables,
)
from attn_core.testing.prefill_case import PrefillCase, make_prefill_case
from attn_core.testing.reference import (
    alibi_bias,
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
