"""paged_prefix_prefill's bad-input errors: each names the argument, the expected and the actual."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from plan_helpers import prefill_plan
from prefill_helpers import run_prefill

from attn_core.reference import make_prefill_case


@pytest.fixture
def case():
    return make_prefill_case(((20, 5), (0, 3), (7, 4)), 8, 2, 64, 16, torch.float16, seed=1)


def _with(case, **changes):
    return dataclasses.replace(case, **changes)


def i32(values):
    return torch.tensor(values, dtype=torch.int32)


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"query_start_loc": i32([0, 6, 4, 12])}, "query_start_loc must be non-decreasing"),
        ({"query_start_loc": i32([1, 5, 8, 12])}, "query_start_loc must run from 0 to num_tokens"),
        ({"query_start_loc": i32([0, 5, 8, 11])}, "query_start_loc must run from 0 to num_tokens"),
        ({"query_start_loc": i32([0, 5, 8])}, r"query_start_loc must have shape \[4\]"),
        ({"seq_lens": i32([25, 3, 12])}, r"seq_lens must equal context_lens \+ query lengths"),
        ({"context_lens": i32([20, -1, 7])}, "context_lens must be >= 0"),
        (
            {"context_lens": i32([2000, 0, 7]), "seq_lens": i32([2005, 3, 11])},
            "context_lens\\[0\\] must fit the block table's capacity",
        ),
        ({"max_query_len": 4}, "max_query_len must be >= every query length"),
        ({"max_query_len": 0}, "max_query_len must be a positive int"),
        ({"seq_lens": torch.tensor([25, 3, 11], dtype=torch.float32)}, "seq_lens must be"),
        ({"block_tables": i32([[0, 1]] * 3).long()}, "block_tables must be torch.int32"),
        ({"block_tables": i32([[0, 1]] * 2)}, "block_tables must have shape"),
        ({"sliding_window": -4}, "sliding_window must be >= -1"),
        ({"alibi_slopes": torch.ones(7)}, r"alibi_slopes must have shape \[8\]"),
        ({"k_scale": -1.0}, "k_scale must be a positive float"),
        ({"kv_cache_dtype": "int4"}, "kv_cache_dtype must be one of"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_inconsistent_metadata(case, changes, match) -> None:
    with pytest.raises(ValueError, match=match):
        run_prefill(_with(case, **changes))


def test_tensor_mismatches(case) -> None:
    from attn_core import paged_prefix_prefill

    with pytest.raises(ValueError, match="key must have shape"):
        run_prefill(_with(case, key=case.key[:, :1]))
    with pytest.raises(ValueError, match="value must be torch.float16"):
        run_prefill(_with(case, value=case.value.float()))
    with pytest.raises(ValueError, match="query must be"):
        paged_prefix_prefill(*_with(case, query=case.query.int()).args())
    with pytest.raises(ValueError, match="query's head_size"):
        run_prefill(_with(case, query=torch.zeros(12, 8, 128, dtype=torch.float16)))
    with pytest.raises(ValueError, match="query's num_heads must be a multiple of num_kv_heads"):
        run_prefill(_with(case, query=torch.zeros(12, 7, 64, dtype=torch.float16)))
    with pytest.raises(ValueError, match="key_cache must be"):
        run_prefill(_with(case, key_cache=case.key_cache.float()))
    with pytest.raises(ValueError, match="head_size must be one of"):
        bad = torch.zeros(4, 2, 6, 16, 8, dtype=torch.float16)
        run_prefill(_with(case, key_cache=bad))


def test_out_and_plan_mismatches(case) -> None:
    from attn_core import paged_prefix_prefill

    with pytest.raises(ValueError, match="out must have shape"):
        paged_prefix_prefill(*case.args(), out=case.query[:3].clone())
    with pytest.raises(ValueError, match="out must be torch.float16"):
        paged_prefix_prefill(*case.args(), out=case.query.float())
    wrong = prefill_plan(8, 2, 128, torch.float16, 5)
    with pytest.raises(ValueError, match="plan must be for"):
        paged_prefix_prefill(*case.args(), plan=wrong)


def test_a_callers_native_plan_is_taken_and_says_why_it_cannot_run(case) -> None:
    """A pure :class:`NativePrefillPlan` is a plan the entry point accepts (not a type error);
    on the CPU its library cannot load, and the error says so."""
    from attn_core import (
        AttentionShape,
        Capabilities,
        PrefillLengths,
        PrefillOverrides,
        get_device_spec,
        paged_prefix_prefill,
        plan_prefill,
    )

    plan = plan_prefill(
        AttentionShape(8, 2, 64, 16, torch.float16), PrefillLengths(5, 20, num_seqs=3),
        get_device_spec("h200"), Capabilities(device_type="cuda", native_prefill=("wmma",)),
        PrefillOverrides(backend="native"),
    )  # fmt: skip
    assert plan.backend == "native"
    with pytest.raises(ValueError, match=r"'native' \(wmma\) but it cannot run here: needs a CUDA"):
        paged_prefix_prefill(*case.args(), plan=plan)
    with pytest.raises(TypeError, match="plan must be None or an attn_core PrefillPlan or Native"):
        paged_prefix_prefill(*case.args(), plan="native")  # type: ignore[arg-type]
