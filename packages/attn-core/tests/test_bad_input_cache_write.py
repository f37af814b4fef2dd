"""write_to_paged_cache on degenerate and bad input (issue 11, attn-core)."""

from __future__ import annotations

import pytest
import torch
from bad_input_helpers import write_args

from attn_core import write_to_paged_cache


@pytest.fixture(autouse=True)
def checks_off(settings_env) -> None:
    settings_env.set("ATTN_CORE_CHECKS", "0")


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's raw bits (NaN-safe equality: fp16 caches viewed as int16)."""
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.uint8)


def zero_block_args() -> dict:
    args = write_args()
    args.update(
        key_cache=args["key_cache"][:0],
        value_cache=args["value_cache"][:0],
        slot_mapping=torch.full((4,), -1),
    )
    return args


def test_all_padding_into_a_zero_block_cache_is_accepted() -> None:
    """Was an IndexError (the skipped-slot redirect read block 0, which does not exist); the
    caches stay the empty tensors they were."""
    args = zero_block_args()
    write_to_paged_cache(**args)
    assert args["key_cache"].shape[0] == 0 and args["value_cache"].shape[0] == 0


@pytest.mark.parametrize("slots", ("empty", "all padding"))
def test_nothing_to_write_is_a_no_op(slots: str) -> None:
    """A real cache (poisoned, NaN included) and an empty or all-padding slot mapping: every
    bit of both caches is what it was."""
    args = write_args()
    args["key_cache"][1, 0, 0, 0, 0] = float("nan")  # NaN != NaN: compared as bits
    if slots == "empty":
        args.update(key=args["key"][:0], value=args["value"][:0], slot_mapping=torch.empty(0))
        args["slot_mapping"] = args["slot_mapping"].long()
    else:
        args["slot_mapping"] = torch.full((4,), -1)
    before_k, before_v = args["key_cache"].clone(), args["value_cache"].clone()
    write_to_paged_cache(**args)
    assert torch.equal(bits(args["key_cache"]), bits(before_k))
    assert torch.equal(bits(args["value_cache"]), bits(before_v))


def test_zero_block_cache_with_a_real_slot_raises_under_checks(settings_env) -> None:
    settings_env.set("ATTN_CORE_CHECKS", "1")
    args = zero_block_args()
    write_to_paged_cache(**args)  # padding only: still fine
    args["slot_mapping"] = torch.tensor([-1, 0, -1, -1])
    with pytest.raises(ValueError, match=r"slot_mapping must be < num_blocks \* block_size = 0"):
        write_to_paged_cache(**args)


def test_dtype_error_names_key_not_query() -> None:
    args = write_args()
    args.update(key=args["key"].float(), value=args["value"].float())
    with pytest.raises(ValueError) as info:
        write_to_paged_cache(**args)
    message = str(info.value)
    assert "query" not in message
    assert message == (
        "key_cache must be torch.float32 for kv_cache_dtype='auto' and key dtype "
        "torch.float32, got torch.float16"
    )


def test_value_dtype_mismatch_names_value() -> None:
    args = write_args()
    args["value"] = args["value"].float()
    with pytest.raises(ValueError, match=r"^value must be torch.float16, got torch.float32"):
        write_to_paged_cache(**args)


@pytest.mark.parametrize("bad", (float("inf"), float("nan"), -1.0, 0.0))
@pytest.mark.parametrize("name", ("k_scale", "v_scale"))
def test_scales_checked_even_for_an_empty_write(name: str, bad: float) -> None:
    args = write_args()
    args.update(key=args["key"][:0], value=args["value"][:0], slot_mapping=args["slot_mapping"][:0])
    args[name] = bad
    with pytest.raises(ValueError, match=rf"^{name} must be a positive float"):
        write_to_paged_cache(**args)
