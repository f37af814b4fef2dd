"""paged_decode on bad input without ATTN_CORE_CHECKS: host checks always run, bad values never
read another sequence's blocks (issue 11, attn-core).

What each bad *value* does without the flag is documented in :mod:`attn_core.decode.bounds`;
these tests hold the code to that list.
"""

from __future__ import annotations

import pytest
import torch
from bad_input_helpers import decode_args_of, small_paged_case
from decode_helpers import plan_of, reference
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attn_core import paged_decode
from attn_core.core.workspace import Workspace
from attn_core.reference import make_paged_case

# What torch raises on the CPU for an out-of-range gather index (index_select: RuntimeError,
# index_put_: IndexError); on CUDA the same reads are device-side asserts.
TORCH_INDEX_ERRORS = (IndexError, RuntimeError)


@pytest.fixture(autouse=True)
def checks_off(settings_env) -> None:
    settings_env.set("ATTN_CORE_CHECKS", "0")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            lambda a: a.update(max_seq_len=81),
            r"max_seq_len must be <= the capacity of block_tables "
            r"\(shape\[1\] \* block_size = 5 \* 16 = 80\), got 81",
        ),
        (
            lambda a: a.update(block_tables=a["block_tables"][:, :0]),
            r"block_tables must have at least one column for 2 sequences, got shape \(2, 0\)",
        ),
        (
            lambda a: a.update(
                key_cache=a["key_cache"][:0], value_cache=a["value_cache"][:0]
            ),
            r"key_cache must hold at least one block for 2 sequences, got num_blocks",
        ),
        (lambda a: a.update(max_seq_len=0), r"max_seq_len must be a positive int, got 0"),
        (lambda a: a.update(max_seq_len=-5), r"max_seq_len must be a positive int, got -5"),
        (lambda a: a.update(max_seq_len=40.0), r"max_seq_len must be a positive int, got 40.0"),
        (lambda a: a.update(max_seq_len=True), r"max_seq_len must be a positive int, got True"),
        (
            lambda a: a.update(max_seq_len=torch.tensor(40)),
            r"max_seq_len must be a positive int, got tensor\(40\)",
        ),
    ],
    ids=["beyond capacity", "table width 0", "zero blocks", "0", "negative", "float", "bool",
         "tensor"],
)  # fmt: skip
def test_host_checks_run_without_the_flag(change, match: str) -> None:
    args = decode_args_of(small_paged_case(), 40)
    change(args)
    with pytest.raises(ValueError, match=match):
        paged_decode(**args)


def test_issue_case_seq_lens_beyond_the_table_is_an_error_not_a_wrong_answer() -> None:
    """The issue's case: seq_lens past the table's capacity used to read other blocks (rel.
    error 0.14-0.36). max_seq_len must now cover them, which the table cannot hold."""
    case = small_paged_case()
    case.seq_lens[1] = 100
    with pytest.raises(ValueError, match="max_seq_len must be <= the capacity"):
        paged_decode(**decode_args_of(case, 100))
    # a max_seq_len that lies (seq_lens > max_seq_len): torch's index error, never numbers
    with pytest.raises(TORCH_INDEX_ERRORS):
        paged_decode(**decode_args_of(case, 80))


@pytest.mark.parametrize("stream", (None, 32))
@pytest.mark.parametrize("tier", ("single_tile", "one_pass", "partitioned"))
@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_bad_seq_lens_error_or_exact_never_other_blocks(
    tier: str, stream, data, clean_decode_env: pytest.MonkeyPatch
) -> None:
    """Without checks, a seq_len above max_seq_len is either computed exactly (it lies within the
    step and the table) or fails in torch; above the table's capacity it always fails."""
    ov: dict = {"tier": tier, "partition_size": 32, "stream_tokens": stream}
    lens = data.draw(st.tuples(st.integers(1, 90), st.integers(1, 90)), label="lens")
    extra = data.draw(st.integers(0, 2), label="extra_table_blocks")
    case = make_paged_case(lens, 4, 2, 64, 16, torch.float32, extra_table_blocks=extra, seed=7)
    capacity = case.block_tables.shape[1] * 16
    max_seq_len = data.draw(st.integers(max(lens), capacity), label="max_seq_len")
    bad = data.draw(st.integers(max_seq_len + 1, capacity + 48), label="bad seq_len")
    case.seq_lens[0] = bad
    plan = plan_of(case, max_seq_len, **ov)
    try:
        got = paged_decode(**decode_args_of(case, max_seq_len, plan=plan))
    except TORCH_INDEX_ERRORS:
        return
    assert bad <= capacity, f"seq_len {bad} > capacity {capacity} gave numbers, not an error"
    # the longer length reaches the table's extra entries, which may be make_paged_case's spare
    # blocks (|v| ~ 30): fp32's tolerance scales with what was read. Another sequence's or a
    # wrong block gave errors of 0.14-0.36 relative.
    used = case.block_tables.long().flatten()
    scale = max(1.0, float(case.value_cache[used].abs().amax()))
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), reference(case), atol=2e-5 * scale, rtol=1e-3)


@pytest.mark.parametrize("length", (0, -1, -3))
def test_seq_lens_below_one_give_finite_output(length: int) -> None:
    """Documented, not checked without the flag: a finite output of no meaning."""
    case = small_paged_case()
    case.seq_lens[0] = length
    out = paged_decode(**decode_args_of(case, 40))
    assert torch.isfinite(out).all()


def test_value_checks_name_what_the_defaults_cannot(settings_env) -> None:
    settings_env.set("ATTN_CORE_CHECKS", "1")
    case = small_paged_case()
    case.seq_lens[1] = 60
    with pytest.raises(ValueError, match=r"seq_lens must be <= max_seq_len \(40\), got max 60"):
        paged_decode(**decode_args_of(case, 40))


def test_bad_checks_flag_is_an_error_naming_the_variable(settings_env) -> None:
    """Read when the settings are (re)loaded: the error names the variable and the value."""
    with pytest.raises(ValueError, match=r"ATTN_CORE_CHECKS must be one of .*got 'maybe'"):
        settings_env.set("ATTN_CORE_CHECKS", "maybe")


@pytest.mark.parametrize("bad", (object(), {}, 3, "ws"), ids=("object", "dict", "int", "str"))
def test_workspace_of_the_wrong_type(bad: object) -> None:
    want = (
        r"workspace must be an attn_core Workspace \(attn_core.core.workspace.Workspace\) or None, "
        rf"got {type(bad).__name__}"
    )
    with pytest.raises(ValueError, match=want):
        paged_decode(**decode_args_of(small_paged_case(), 40), workspace=bad)


def test_empty_batch_still_checks_its_arguments() -> None:
    case = small_paged_case()
    args = decode_args_of(case, 40)
    args.update(
        query=case.query[:0], block_tables=case.block_tables[:0], seq_lens=case.seq_lens[:0]
    )
    assert paged_decode(**args, workspace=Workspace()).shape == (0, 8, 64)
    with pytest.raises(ValueError, match="workspace must be"):
        paged_decode(**args, workspace=object())
    with pytest.raises(ValueError, match="k_scale must be a positive float"):
        paged_decode(**args, k_scale=float("nan"))
