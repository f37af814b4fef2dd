"""The prefill kernel's CUDA-core tile layer (what CoreX builds), on the CPU, against the float64
reference.

ci/host_emulation.py builds csrc/paged_prefill.cu with ``-D__ILUVATAR__ -DATTN_PREFILL_MMA=0``
for the host; these tests launch it through :func:`attn_core.native.prefill.launch_prefill` at
forced tile configurations and splits, following test_native_prefill.py's families (which run
the GPU builds, both layers): both tile configurations (one K / V buffer: the CUDA-core layer
has no other), head sizes 64 / 120 / 128 / 256, blocks 8 / 16 / 32, fp16 / bf16, fp8 caches
with scales, ALiBi, sliding windows, GQA 1-16, chunk and context lengths around every tile and
block edge, permuted block tables, NaN in every cache slot past each context and in the outputs
and the partials, splits merged by log-sum-exp; each phase's threads also run in reverse order
once per family.
What it cannot see: what a device compiler makes of the source, NVIDIA's wmma layer, and time.
"""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close
from host_emulation_helpers import host_prefill_case, run_emulated_prefill
from native_prefill_helpers import (
    FEATURES,
    edge_batch,
    feature_kwargs,
    fp8_prefill_case,
    group_batch,
    reference,
)

from attn_core.native import split as ps
from attn_core.native.split import tokens_per_tile

CONFIGS = (ps.CONFIG_LARGE, ps.CONFIG_32K)
DTYPES = (torch.float16, torch.bfloat16)


def check_both_orders(case, config: int, splits: int, dtype: torch.dtype, **kwargs) -> None:
    """Against the reference, and bit for bit the same with each phase's threads reversed."""
    got = run_emulated_prefill(case, config, splits, **kwargs)
    assert_close(got, reference(case, scale=kwargs.get("scale")), dtype)
    again = run_emulated_prefill(case, config, splits, reverse=True, **kwargs)
    assert torch.equal(got.view(torch.uint8), again.view(torch.uint8)), "thread order changed bits"


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_size", (64, 120, 128, 256))
def test_heads_dtypes(head_size: int, dtype: torch.dtype, config: int) -> None:
    tile = tokens_per_tile(config, 2)
    case = host_prefill_case(edge_batch(16, tile), 4, 2, head_size, 16, dtype, seed=head_size)
    assert_close(run_emulated_prefill(case, config, 1), reference(case), dtype)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("block_size", (8, 16, 32))
def test_block_sizes_long_context_splits(block_size: int, config: int) -> None:
    tile = tokens_per_tile(config, 3)
    case = host_prefill_case(
        edge_batch(block_size, tile, long=1501), 6, 2, 128, block_size, torch.float16
    )
    want = reference(case)
    for splits in (1, 5):
        assert_close(run_emulated_prefill(case, config, splits), want, torch.float16)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kv_cache_dtype", ("fp8_e4m3", "fp8_e5m2"))
@pytest.mark.parametrize("head_size", (64, 256))
def test_fp8_caches(head_size: int, kv_cache_dtype: str, dtype: torch.dtype) -> None:
    case = fp8_prefill_case(host_prefill_case, head_size, dtype, kv_cache_dtype, long=300)
    want = reference(case)
    assert_close(run_emulated_prefill(case, ps.CONFIG_LARGE, 1), want, dtype)
    assert_close(run_emulated_prefill(case, ps.CONFIG_32K, 3), want, dtype)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("feature", FEATURES)
def test_alibi_and_window_in_both_thread_orders(feature: str, config: int) -> None:
    seqs = [(0, 40), (300, 1), (400, 90), (17, 130)]
    case = host_prefill_case(seqs, 8, 2, 128, 16, torch.float16, **feature_kwargs(feature, 100))
    check_both_orders(case, config, 1, torch.float16, scale=0.07)
    check_both_orders(case, config, 4, torch.float16, scale=0.07)


@pytest.mark.parametrize("group", (1, 2, 6, 8, 16))
def test_gqa_groups(group: int) -> None:
    for config in CONFIGS:
        seqs = group_batch(config, group, 200)
        case = host_prefill_case(seqs, 2 * group, 2, 128, 16, torch.float16, seed=group)
        assert_close(run_emulated_prefill(case, config, 2), reference(case), torch.float16)


def test_split_counts_agree_in_both_thread_orders() -> None:
    """A short chunk over a long context, split many ways (some splits get no tile)."""
    case = host_prefill_case([(2099, 7), (0, 3)], 24, 4, 256, 16, torch.bfloat16)
    for splits in (1, 2, 7, 40):
        check_both_orders(case, ps.CONFIG_32K, splits, torch.bfloat16)
