"""Property-based decode: random shapes, lengths, tiers, gathers and partition sizes all match
the float64 reference (fp32, so any disagreement is a logic error, not rounding)."""

from __future__ import annotations

import torch
from conftest import assert_close
from decode_helpers import reference, run_decode
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attn_core.reference import make_paged_case

GQA = ((24, 4), (16, 2), (6, 1), (32, 8), (8, 8), (8, 1))

problems = st.fixed_dictionaries(
    {
        "heads": st.sampled_from(GQA),
        "head_size": st.sampled_from((64, 80, 96)),
        "block_size": st.sampled_from((8, 16, 32)),
        "lens": st.lists(st.integers(1, 300), min_size=1, max_size=4),
        "slack": st.integers(0, 200),
        "tier": st.sampled_from((None, "single_tile", "one_pass", "partitioned")),
        "gather_bytes": st.sampled_from((None, 8, 16)),
        "partition_blocks": st.integers(1, 6),
        "stream_blocks": st.one_of(st.none(), st.integers(1, 12)),
        "seed": st.integers(0, 2**16),
    }
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(p=problems)
def test_random_problems_match_reference(p) -> None:
    bs = p["block_size"]
    ov: dict = {}  # DecodeOverrides fields for this test's plans
    if p["tier"]:
        ov["tier"] = p["tier"]
    if p["gather_bytes"]:
        ov["gather_bytes"] = p["gather_bytes"]
    ov["partition_size"] = bs * p["partition_blocks"]
    if p["stream_blocks"]:
        ov["stream_tokens"] = bs * p["stream_blocks"]
    num_heads, num_kv_heads = p["heads"]
    case = make_paged_case(
        p["lens"],
        num_heads,
        num_kv_heads,
        p["head_size"],
        bs,
        torch.float32,
        extra_table_blocks=p["slack"] // bs + 1,
        seed=p["seed"],
    )
    got = run_decode(case, max_seq_len=case.max_seq_len + p["slack"], **ov)
    assert_close(got, reference(case), torch.float32)
