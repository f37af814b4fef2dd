"""Which backend a decode plan takes, and the native plan's contents (no GPU needed)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attn_core.core.settings import DecodeOverrides
from attn_core.core.shapes import AttentionShape
from attn_core.decode.plan import DecodeLengths, plan_decode
from attn_core.decode.plan_native import TORCH_ONLY_OVERRIDES, choose_backend
from attn_core.device.capabilities import Capabilities
from attn_core.device.spec import get_device_spec
from attn_core.native.split import native_split
from attn_core.runtime.resolve import decode_plan_for

QWEN = AttentionShape()
H200 = get_device_spec("h200")
NATIVE = Capabilities(bmm_writes_fp32=True, native_decode=True)
NO_NATIVE = Capabilities(
    bmm_writes_fp32=True, native_decode=False, native_decode_why="not available (no compiler)"
)
TORCH_ONLY_VALUES = {
    "tier": "partitioned",
    "partition_size": 512,
    "single_tile_max": 1024,
    "subscription": 3,
    "stream_tokens": 8192,
    "scores": "compute",
    "gather_bytes": 8,
}


def test_native_where_built_and_verified_else_torch_and_why():
    assert choose_backend(NATIVE, DecodeOverrides()) == (
        "native",
        "native kernel built and verified on this device",
    )
    assert choose_backend(NO_NATIVE, DecodeOverrides()) == (
        "torch",
        "native kernel not available (no compiler)",
    )
    assert choose_backend(NATIVE, DecodeOverrides(backend="torch"))[0] == "torch"
    assert choose_backend(NATIVE, DecodeOverrides(backend="native"))[0] == "native"


def test_forcing_native_where_it_is_not_verified_names_the_variable_and_why():
    with pytest.raises(ValueError, match="ATTN_CORE_DECODE_BACKEND.*not available .no compiler"):
        choose_backend(NO_NATIVE, DecodeOverrides(backend="native"))


@pytest.mark.parametrize("name", TORCH_ONLY_OVERRIDES)
def test_a_torch_path_override_keeps_the_torch_path_and_says_so(name):
    assert set(TORCH_ONLY_VALUES) == set(TORCH_ONLY_OVERRIDES)
    overrides = DecodeOverrides(**{name: TORCH_ONLY_VALUES[name]})
    assert choose_backend(NATIVE, overrides) == ("torch", f"torch-only override(s) set: {name}")
    plan = plan_decode(QWEN, DecodeLengths(1, 32768), H200, NATIVE, overrides)
    assert plan.backend == "torch" and not hasattr(plan, "split")
    assert plan.backend_reason == f"torch-only override(s) set: {name}"


@pytest.mark.parametrize("name", TORCH_ONLY_OVERRIDES)
def test_forced_native_with_a_torch_only_override_is_an_error_naming_both(name):
    overrides = DecodeOverrides(backend="native", **{name: TORCH_ONLY_VALUES[name]})
    with pytest.raises(ValueError, match=rf"'native'.*torch-only override\(s\) {name} "):
        plan_decode(QWEN, DecodeLengths(1, 32768), H200, NATIVE, overrides)


@pytest.mark.parametrize(
    "num_seqs, context, tier, launches, merge_slices",
    [
        # eight warps a block, one block per SM: 33 and 4 partitions, 32-dimension merge slices
        # (16-dimension ones from 48 partitions: test_native_build's mirror test)
        (1, 102400, "partitioned", 2, 8),
        (8, 102400, "partitioned", 2, 8),
        (512, 4096, "one_pass", 1, 0),
    ],
)
def test_native_plan_is_the_split(num_seqs, context, tier, launches, merge_slices):
    plan = plan_decode(QWEN, DecodeLengths(num_seqs, context), H200, NATIVE)
    split = native_split(QWEN, num_seqs, context, H200)
    assert plan.backend == "native" and plan.native == split
    assert plan.tier == tier and len(plan.steps) == launches
    assert (plan.num_partitions, plan.partition_size) == (
        split.num_partitions,
        split.partition_size,
    )
    assert plan.steps[0].name == "native_partition"
    assert plan.steps[0].grid == (QWEN.num_kv_heads, split.num_partitions, num_seqs)
    assert plan.steps[0].registers_per_thread == split.partition.registers
    if launches == 2:  # one merge block per query head, sequence and slice of the 256 dimensions
        assert plan.steps[1].name == "native_merge"
        assert plan.steps[1].grid == (24, num_seqs, merge_slices)
    assert plan.workspace_bytes == split.workspace_bytes(num_seqs, 24, 256)


def test_native_plan_covers_the_table_capacity_not_more():
    plan = plan_decode(QWEN, DecodeLengths(2, 1 << 20, max_blocks_per_seq=64), H200, NATIVE)
    assert plan.context_tokens == 64 * 16
    assert plan.num_partitions * plan.partition_size >= 1024


def test_cpu_plans_stay_on_the_torch_path_and_say_why():
    plan = decode_plan_for(QWEN, DecodeLengths(1, 8192), torch.device("cpu"), H200)
    assert plan.backend == "torch"
    assert plan.backend_reason == "native kernel needs a CUDA device, got cpu"
    for kwargs in ({"overrides": DecodeOverrides("native")}, {"backend": "native"}):
        with pytest.raises(ValueError, match="'native'.*needs a CUDA device, got cpu"):
            decode_plan_for(QWEN, DecodeLengths(1, 8192), torch.device("cpu"), H200, **kwargs)


def test_backend_argument_wins_over_the_overrides():
    plan = decode_plan_for(
        QWEN, DecodeLengths(1, 8192), torch.device("cpu"), H200, DecodeOverrides("native"),
        backend="torch",
    )  # fmt: skip
    assert plan.backend == "torch" and plan.backend_reason == "backend 'torch' asked for"


def test_plan_is_still_frozen_and_hashable():
    plan = plan_decode(QWEN, DecodeLengths(1, 8192), H200, NATIVE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.backend = "torch"  # type: ignore[misc]
    assert hash(plan.native) == hash(native_split(QWEN, 1, 8192, H200))
    assert plan.library is None  # the pure planner loads nothing; the resolver attaches it
