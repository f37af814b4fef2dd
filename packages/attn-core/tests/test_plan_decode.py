"""plan_decode: tier choice, even-share partitions per device, overrides, grids, workspace."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attn_core import DecodePlan, get_device_spec, plan_decode
from attn_core.plan_decode import (
    MIN_PARTITION,
    ONE_PASS_MIN_SOFTMAX_FILL,
    SUBSCRIPTION,
    blocks_per_sm,
    softmax_row_slots,
)

QWEN = {"num_heads": 24, "num_kv_heads": 4, "head_size": 256, "block_size": 16}


def qwen(num_seqs: int, tokens: int, device: str = "bi-v100", **kw) -> DecodePlan:
    return plan_decode(
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
    assert plan_decode(at, max_seq_len=65_536, device_spec=spec, **heads).tier == "one_pass"
    if at > 1:
        below = plan_decode(at - 1, max_seq_len=65_536, device_spec=spec, **heads)
        assert below.tier == "partitioned"
    assert softmax_row_slots(get_device_spec("h200")) == 2 * 132


def test_forced_tier_and_partition_size_beat_the_row_rule(clean_decode_env) -> None:
    assert qwen(8, 100_000, "h200", tier="partitioned").tier == "partitioned"
    clean_decode_env.setenv("ATTN_CORE_DECODE_TIER", "partitioned")
    assert qwen(8, 100_000, "h200").tier == "partitioned"
    clean_decode_env.delenv("ATTN_CORE_DECODE_TIER")
    clean_decode_env.setenv("ATTN_CORE_DECODE_PARTITION_SIZE", "4096")
    forced = qwen(8, 100_000, "h200")
    assert forced.tier == "partitioned" and forced.partition_size == 4096


@pytest.mark.parametrize("device", ("bi-v100", "h200", "a100"))
def test_even_share_partition_count(device: str) -> None:
    """Partitions x (seqs x kv heads) reach occupancy x SMs x subscription when context allows."""
    spec = get_device_spec(device)
    plan = qwen(1, 100_000, device)
    phase1 = plan.steps[0]
    assert phase1.name == "partition"
    occupancy = blocks_per_sm(spec, phase1.threads_per_block, phase1.shared_mem_bytes, 64)
    target = occupancy * spec.sm_count * SUBSCRIPTION
    assert phase1.num_blocks >= target * 0.8 or plan.partition_size == MIN_PARTITION
    # not vLLM's fixed 512 tokens: the partition size depends on the device
    assert plan.partition_size % 16 == 0


def test_devices_differ_and_batch_shrinks_partitions_count() -> None:
    bi = qwen(1, 100_000, "bi-v100")
    h200 = qwen(1, 100_000, "h200")
    assert h200.num_partitions > bi.num_partitions
    batch = qwen(8, 100_000, "h200", tier="partitioned")  # the row rule would take one_pass
    assert 1 < batch.num_partitions < h200.num_partitions


@pytest.mark.parametrize("device", ("bi-v100", "bi-v100-smem48k", "h200"))
@pytest.mark.parametrize("tokens", (1, 17, 512, 8192, 100_000, 262_144))
@pytest.mark.parametrize("num_seqs", (1, 8, 64))
def test_steps_fit_the_device(device: str, tokens: int, num_seqs: int) -> None:
    spec = get_device_spec(device)
    plan = qwen(num_seqs, tokens, device)
    assert plan.num_partitions * plan.partition_size == plan.chunk_tokens
    # block_size - 1 masked slots past the longest sequence (decode zeroes their values)
    assert plan.chunk_tokens >= tokens + 15
    assert plan.chunk_tokens - tokens < plan.partition_size + 16
    for step in plan.steps:
        assert step.grid[:2] == (num_seqs, 4)
        assert step.shared_mem_bytes <= spec.shared_mem_per_block, step
        assert step.threads_per_block <= spec.max_threads_per_block
    # launches per step do not grow with context or batch
    assert len(plan.steps) == {"single_tile": 1, "one_pass": 1, "partitioned": 2}[plan.tier]


def test_grid_is_on_kv_heads() -> None:
    plan = qwen(1, 100_000, "bi-v100")
    assert plan.steps[0].grid == (1, 4, plan.num_partitions)
    assert plan.steps[1].grid == (1, 4, 1)


def test_table_capacity_caps_context() -> None:
    plan = plan_decode(2, 8, 2, 64, 16, max_seq_len=10_000, max_blocks_per_seq=4)
    # one block past the table: masked slots for decode's fixed-size tail zeroing
    assert plan.context_tokens == 64 and plan.chunk_tokens == 80


def test_env_overrides(clean_decode_env) -> None:
    clean_decode_env.setenv("ATTN_CORE_DECODE_PARTITION_SIZE", "48")
    plan = qwen(1, 5000)
    assert plan.tier == "partitioned" and plan.partition_size == 48
    assert plan.num_partitions == 105 and plan.chunk_tokens == 5040
    clean_decode_env.setenv("ATTN_CORE_DECODE_SINGLE_TILE_MAX", "8192")
    assert qwen(1, 5000).tier == "single_tile"
    clean_decode_env.setenv("ATTN_CORE_DECODE_TIER", "one_pass")
    assert qwen(1, 5000).tier == "one_pass"
    clean_decode_env.setenv("ATTN_CORE_DECODE_STREAM_TOKENS", "1000")
    streamed = qwen(1, 5000)
    assert streamed.streaming and streamed.chunk_tokens == 992 and streamed.num_chunks == 6


def test_arguments_override_env(clean_decode_env) -> None:
    clean_decode_env.setenv("ATTN_CORE_DECODE_PARTITION_SIZE", "48")
    assert qwen(1, 100_000, partition_size=512).partition_size == 512


@pytest.mark.parametrize(
    ("name", "value", "match"),
    [
        ("ATTN_CORE_DECODE_PARTITION_SIZE", "40", "partition_size must be a multiple of block"),
        ("ATTN_CORE_DECODE_PARTITION_SIZE", "abc", "ATTN_CORE_DECODE_PARTITION_SIZE must be"),
        ("ATTN_CORE_DECODE_STREAM_TOKENS", "0", "ATTN_CORE_DECODE_STREAM_TOKENS must be"),
        ("ATTN_CORE_DECODE_TIER", "fast", "ATTN_CORE_DECODE_TIER must be one of"),
    ],
)
def test_bad_overrides_raise(name: str, value: str, match: str, clean_decode_env) -> None:
    clean_decode_env.setenv(name, value)
    with pytest.raises(ValueError, match=match):
        qwen(1, 1000)


def test_bad_sizes_raise() -> None:
    with pytest.raises(ValueError, match="num_heads must be divisible by num_kv_heads"):
        plan_decode(1, 6, 4, 64, 16, 100)
    with pytest.raises(ValueError, match="max_seq_len must be a positive int, got 0"):
        plan_decode(1, 8, 4, 64, 16, 0)


def test_streaming_bounds_workspace() -> None:
    plain = [qwen(1, n).workspace_bytes for n in (8192, 100_000)]
    streamed = [qwen(1, n, stream_tokens=4096) for n in (8192, 100_000, 262_144)]
    assert plain[1] > plain[0]
    assert len({p.workspace_bytes for p in streamed}) == 1
    assert streamed[1].streaming and streamed[1].num_chunks == -(-100_000 // 4096)
    assert streamed[1].workspace_bytes < plain[1] / 10


def test_workspace_within_budget_at_100k() -> None:
    """The issue's bound: transient memory at most 1.25x the gathered K+V (fp16, 24/4, 256)."""
    plan = plan_decode(
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


def test_scores_opt_in_drops_the_key_upcast(clean_decode_env) -> None:
    exact = qwen(1, 100_000)
    clean_decode_env.setenv("ATTN_CORE_DECODE_SCORES", "compute")
    rounded = qwen(1, 100_000)
    assert rounded.scores_in_compute_dtype and not exact.scores_in_compute_dtype
    upcast_keys = 4 * exact.chunk_tokens * 256 * 4
    rounded_scores = 24 * exact.chunk_tokens * 2
    assert exact.workspace_bytes - rounded.workspace_bytes == upcast_keys - rounded_scores
    assert not qwen(1, 100_000, scores_fp32_from_bmm=True).scores_in_compute_dtype
    clean_decode_env.setenv("ATTN_CORE_DECODE_SCORES", "fp16")
    with pytest.raises(ValueError, match="ATTN_CORE_DECODE_SCORES must be one of fp32, compute, got 'fp16'"):
        qwen(1, 100)
