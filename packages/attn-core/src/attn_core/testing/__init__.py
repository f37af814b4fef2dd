"""Test support shipped with attn-core: the float64 reference and random paged inputs.

It is part of the installed package (not only ``tests/``) because engine-patch's ``status``
self-test and the HIL suites check the device against the same reference the unit tests use.
Nothing here imports attn-core's execution code: the reference must stay independent of it.

``PrefillCase`` / ``make_prefill_case`` (random chunked-prefill problems) live in
:mod:`attn_core.prefill_case`, which imports only torch and :mod:`.paged_inputs`; they are
re-exported lazily (PEP 562 ``__getattr__``) because that module imports this package, so an
eager import here would be circular when ``attn_core.prefill_case`` is imported first.
"""

from attn_core.testing.paged_inputs import PagedCase, make_paged_case, random_block_tables
from attn_core.testing.reference import (
    alibi_bias,
    reference_decode,
    reference_prefix_prefill,
    tokens_from_cache,
)

_PREFILL_CASE_NAMES = ("PrefillCase", "make_prefill_case")


def __getattr__(name: str):
    if name in _PREFILL_CASE_NAMES:
        from attn_core import prefill_case

        return getattr(prefill_case, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "PagedCase",
    "PrefillCase",
    "make_paged_case",
    "make_prefill_case",
    "random_block_tables",
    "alibi_bias",
    "reference_decode",
    "reference_prefix_prefill",
    "tokens_from_cache",
]
