"""The float64 reference every attention path is checked against, and the cases it checks on.

- :mod:`.attention`: dense float64 attention over tokens read one position at a time from the
  paged cache (:func:`reference_decode`, :func:`reference_prefix_prefill`);
- :mod:`.gated_delta`: the gated delta rule token by token and the causal convolution tap by
  tap, float64 (:func:`reference_gated_delta`, :func:`reference_causal_conv1d`);
- :mod:`.paged_case`, :mod:`.prefill_case`: random inputs in vLLM 0.6.3's layout (permuted
  blocks, poisoned unused blocks and tail slots).

Runtime code uses it too: a kernel is verified against it once per device before it is used
(:mod:`attn_core.core.verify_once`), and engine-patch's self-test runs it. It imports nothing of
attn-core's execution code, so the reference stays independent of what it checks.
"""

from attn_core.reference.attention import (
    alibi_bias,
    reference_decode,
    reference_prefix_prefill,
    tokens_from_cache,
)
from attn_core.reference.gated_delta import reference_causal_conv1d, reference_gated_delta
from attn_core.reference.paged_case import (
    PagedCase,
    make_paged_case,
    poison_tails,
    random_block_tables,
)
from attn_core.reference.prefill_case import PrefillArgs, PrefillCase, make_prefill_case

__all__ = [
    "PagedCase",
    "PrefillArgs",
    "PrefillCase",
    "make_paged_case",
    "make_prefill_case",
    "poison_tails",
    "random_block_tables",
    "alibi_bias",
    "reference_decode",
    "reference_prefix_prefill",
    "tokens_from_cache",
    "reference_causal_conv1d",
    "reference_gated_delta",
]
