"""plan_decode: tier choice, even-share partitions per device, overrides, grids, workspace."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from plan_helpers import decode_plan

from attn_core import DecodePlan, get_device_spec
from attn_core.decode.plan import (
    ONE_PASS_MIN_SOFTMAX_FILL,
    softmax_row_slots,
)

QWEN = {"num_heads": 24, "num_kv_heads": 4, "head_size": 256, "block_size": 16}


def qwen(num_seqs: int, tokens: int, device: str = "bi-v100", **kw) -> DecodePlan:
    return decode_plan(
        num_seqs, max_seq_len=tokens, device_spec=get_device_spec(device), **QWEN, **kw
    )


def test_plan_is_frozen() -> None:
    plan = qwen(1, 1000)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.tier = "one_pass"  # type: ignore[misc]


def test_tiers_follow_context_and_batch() -> None:
    assert qwen(1, 100).tier == "single_tile"
    assert qwen(1, 100_000).tier == "partitioned"
    # a batch that already fills the device needs no split of long sequences
    assert qwen(512, 1500).tier == "one_pass"


@pytest.mark.parametrize(
    ("device", "num_seqs", "tokens", "tier"),
    [
        # GPU run 2 (H200): partitioned won at 24 rows, one_pass at 192 and 1536 rows
        ("h200", 1, 32_768, "partitioned"),
        ("h200", 1, 100_000, "partitioned"),
        ("h200", 8, 8192, "one_pass"),
        ("h200", 8, 32_768, "one_pass"),
        ("h200", 8, 100_000, "one_pass"),
        ("h200", 64, 8192, "one_pass"),
        # extrapolated by resident softmax blocks: 4 per SM x 16 SMs, threshold 32 rows
        ("bi-v100", 1, 100_000, "partitioned"),
        ("bi-v100", 2, 32_768, "one_pass"),
    ],
)
def test_tier_follows_softmax_rows(device: str, num_seqs: int, tokens: int, tier: str) -> None:
    assert qwen(num_seqs, tokens, device).tier == tier


@pytest.mark.parametrize("device", ("bi-v100", "h200", "a100"))
def test_one_pass_threshold_is_half_the_softmax_slots(device: str) -> None:
    """One sequence below the threshold stays partitioned, one at or above it takes one_pass."""
    spec = get_device_spec(device)
    rows = ONE_PASS_MIN_SOFTMAX_FILL * softmax_row_slots(spec)
    heads = {"num_heads": 8, "num_kv_heads": 8, "head_size": 128, "block_size": 16}
    at = -(-int(rows) // 8)  # sequences of 8 heads reaching the threshold
    assert decode_plan(at, max_seq_len=65_536, device_spec=spec, **heads).tier == "one_pass"
    if at > 1:
        below = decode_plan(at - 1, max_seq_len=65_536, device_spec=spec, **heads)
        assert below.tier == "partitioned"
    assert softmax_row_slots(get_device_spec("h200")) == 2 * 132


def test_forced_tier_and_partition_size_beat_the_row_rule() -> None:
    assert qwen(8, 100_000, "h200", tier="partitioned").tier == "partitioned"
    forced = qwen(8, 100_000, "h200", partition_size=4096)
    assert forced.tier == "partitioned" and forced.partition_size == 4096


def test_context_capped_at_the_table() -> None:
    plan = decode_plan(2, 8, 2, 64, 16, max_seq_len=10_000, max_blocks_per_seq=4)
    # one block past the table: masked slots for decode's fixed-size tail zeroing
    assert plan.context_tokens == 64 and plan.chunk_tokens == 80


def test_overrides() -> None:
    plan = qwen(1, 5000, partition_size=48)
    assert plan.tier == "partitioned" and plan.partition_size == 48
    assert plan.num_partitions == 105 and plan.chunk_tokens == 5040
    assert qwen(1, 5000, partition_size=48, single_tile_max=8192).tier == "single_tile"
    assert qwen(1, 5000, partition_size=48, single_tile_max=8192, tier="one_pass").tier == (
        "one_pass"
    )
    streamed = qwen(1, 5000, partition_size=48, tier="one_pass", stream_tokens=1000)
    assert streamed.streaming and streamed.chunk_tokens == 992 and streamed.num_chunks == 6


def test_overrides_are_an_explicit_argument(monkeypatch) -> None:
    """The planner reads no environment: a variable set in the process changes nothing."""
    monkeypatch.setenv("ATTN_CORE_DECODE_PARTITION_SIZE", "48")
    assert qwen(1, 100_000).partition_size != 48


@pytest.mark.parametrize(
    ("name", "value", "match"),
    [
        ("partition_size", 40, "partition_size must be a multiple of block"),
        (
            "partition_size",
            0,
            r"DecodeOverrides.partition_size must be None or an int in \[1, 16777216\]",
        ),
        (
            "stream_tokens",
            0,
            r"DecodeOverrides.stream_tokens must be None or an int in \[1, 16777216\]",
        ),
        ("tier", "fast", "DecodeOverrides.tier must be None or one of"),
        ("scores", "fp16", "DecodeOverrides.scores must be None or one of"),
    ],
)
def test_bad_overrides_raise(name: str, value: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        qwen(1, 1000, **{name: value})


def test_bad_sizes_raise() -> None:
    with pytest.raises(ValueError, match="num_heads must be a multiple of num_kv_heads"):
        decode_plan(1, 6, 4, 64, 16, 100)
    with pytest.raises(ValueError, match="max_seq_len must be a positive int, got 0"):
        decode_plan(1, 8, 4, 64, 16, 0)


def test_streaming_bounds_workspace() -> None:
    plain = [qwen(1, n).workspace_bytes for n in (8192, 100_000)]
    streamed = [qwen(1, n, stream_tokens=4096) for n in (8192, 100_000, 262_144)]
    assert plain[1] > plain[0]
    assert len({p.workspace_bytes for p in streamed}) == 1
    assert streamed[1].streaming and streamed[1].num_chunks == -(-100_000 // 4096)
    assert streamed[1].workspace_bytes < plain[1] / 10


def test_workspace_within_budget_at_100k() -> None:
    """The issue's bound: transient memory at most 1.25x the gathered K+V (fp16, 24/4, 256)."""
    plan = decode_plan(
        1,
        24,
        4,
        256,
        16,
        100_000,
        dtype=torch.float16,
        scores_fp32_from_bmm=True,
        device_spec=get_device_spec("h200"),
    )
    gathered_kv = 2 * 4 * 100_000 * 256 * 2
    assert plan.workspace_bytes <= 1.25 * gathered_kv
    assert plan.kv_bytes == gathered_kv


def test_scores_opt_in_drops_the_key_upcast() -> None:
    exact = qwen(1, 100_000)
    rounded = qwen(1, 100_000, scores="compute")
    assert rounded.scores_in_compute_dtype and not exact.scores_in_compute_dtype
    upcast_keys = 4 * exact.chunk_tokens * 256 * 4
    rounded_scores = 24 * exact.chunk_tokens * 2
    assert exact.workspace_bytes - rounded.workspace_bytes == upcast_keys - rounded_scores
    assert not qwen(1, 100_000, scores_fp32_from_bmm=True).scores_in_compute_dtype
