"""paged_decode against the float64 reference over the supported matrix.

Sizes are deliberately odd (seq_lens 1, block and partition boundaries +-1, primes), block
tables are random permutations padded with stray ids, and every output starts as NaN.
"""

from __future__ import annotations

from typing import Optional

import pytest
import torch
from conftest import assert_close
from decode_helpers import reference, run_decode, slopes_for

from attn_core.core.cache_layout import SUPPORTED_BLOCK_SIZES, SUPPORTED_HEAD_SIZES
from attn_core.reference import make_paged_case

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
GQA = ((24, 4), (16, 2), (6, 1), (32, 8), (8, 8), (8, 1))
ODD_LENS = (1, 15, 16, 17, 97, 130)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_size", SUPPORTED_HEAD_SIZES)
def test_head_sizes_and_dtypes(head_size: int, dtype: torch.dtype) -> None:
    case = make_paged_case(ODD_LENS, 8, 2, head_size, 16, dtype, seed=head_size)
    assert_close(run_decode(case), reference(case), dtype)


@pytest.mark.parametrize("heads", GQA, ids=lambda h: f"{h[0]}q{h[1]}kv")
@pytest.mark.parametrize("block_size", SUPPORTED_BLOCK_SIZES)
def test_gqa_ratios_and_block_sizes(heads: tuple[int, int], block_size: int) -> None:
    num_heads, num_kv_heads = heads
    case = make_paged_case(
        (1, block_size - 1, block_size + 1, 77),
        num_heads,
        num_kv_heads,
        64,
        block_size,
        torch.float32,
        seed=block_size,
    )
    assert_close(run_decode(case), reference(case), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("tier", ("single_tile", "one_pass", "partitioned"))
def test_alibi_each_tier(tier: str, dtype: torch.dtype) -> None:
    ov: dict = {}  # DecodeOverrides fields for this test's plans
    ov["tier"] = tier
    ov["partition_size"] = 32
    case = make_paged_case(ODD_LENS, 12, 4, 80, 16, dtype, seed=3)
    slopes = slopes_for(12)
    got = run_decode(case, alibi_slopes=slopes, **ov)
    assert_close(got, reference(case, alibi_slopes=slopes), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kv_cache_dtype", ("fp8", "fp8_e4m3", "fp8_e5m2"))
def test_fp8_caches(kv_cache_dtype: str, dtype: torch.dtype) -> None:
    case = make_paged_case(
        ODD_LENS,
        8,
        2,
        128,
        16,
        dtype,
        kv_cache_dtype=kv_cache_dtype,
        k_scale=0.25,
        v_scale=3.0,
        seed=5,
    )
    assert_close(run_decode(case), reference(case), dtype)


def test_explicit_scale() -> None:
    case = make_paged_case(ODD_LENS, 8, 2, 64, 16, torch.float32, seed=6)
    assert_close(run_decode(case, scale=0.3), reference(case, scale=0.3), torch.float32)


@pytest.mark.parametrize("gather_bytes", (8, 16))
@pytest.mark.parametrize("partition_size", (32, 64))
def test_partition_boundaries(partition_size: int, gather_bytes: int) -> None:
    ov: dict = {}  # DecodeOverrides fields for this test's plans
    ov["partition_size"] = partition_size
    ov["tier"] = "partitioned"
    ov["gather_bytes"] = gather_bytes
    ps = partition_size
    lens = (1, ps - 1, ps, ps + 1, 2 * ps - 1, 2 * ps, 2 * ps + 1, 5 * ps + 3)
    case = make_paged_case(lens, 8, 2, 64, 16, torch.float32, seed=ps)
    assert_close(run_decode(case, **ov), reference(case), torch.float32)


@pytest.mark.parametrize("extra", (1, 100, 10_000))
def test_max_seq_len_above_every_length(extra: int) -> None:
    """vLLM passes its capture size as max_seq_len; results must not change."""
    # vLLM sizes its tables for max_seq_len (checked): graph tables hold the capture size
    room = extra // 16 + 1
    case = make_paged_case((3, 40, 65), 8, 2, 64, 16, torch.float16, extra_table_blocks=room)
    tight = run_decode(case)
    loose = run_decode(case, max_seq_len=case.max_seq_len + extra)
    assert_close(loose, reference(case), torch.float16)
    torch.testing.assert_close(loose, tight, atol=2e-3, rtol=0)


def test_non_contiguous_block_tables() -> None:
    case = make_paged_case(ODD_LENS, 8, 2, 64, 8, torch.float32, non_contiguous_tables=True)
    assert not case.block_tables.is_contiguous()
    assert_close(run_decode(case), reference(case), torch.float32)


@pytest.mark.parametrize("stream", (None, 32))
@pytest.mark.parametrize("tier", ("single_tile", "one_pass", "partitioned"))
@pytest.mark.parametrize("garbage", (float("nan"), float("inf"), -float("inf")))
def test_masked_slots_cannot_poison(garbage: float, tier: str, stream: Optional[int]) -> None:
    """Slots past seq_len (tail of the last block, stray table entries) may hold inf/NaN.

    Lengths cover a sequence shorter than one block (its blocks past the end are copies of a
    block with a garbage tail), exact block multiples, and streamed chunks that end before,
    at and after a sequence's end."""
    ov: dict = {}  # DecodeOverrides fields for this test's plans
    ov["tier"] = tier
    ov["partition_size"] = 16
    if stream:
        ov["stream_tokens"] = stream
    block = 16
    case = make_paged_case((5, 16, 33, 70, 1), 8, 2, 64, block, torch.float16, spare_blocks=2)
    expected = reference(case)
    for s, n in enumerate(case.seq_lens.tolist()):
        row = case.block_tables[s].long()
        last = row[(n - 1) // block]
        tail = n % block
        if tail:
            case.key_cache[last, :, :, tail:, :] = garbage
            case.value_cache[last, :, :, tail:] = garbage
    # Every block no sequence owns, and the stray ids padding the tables, hold garbage too.
    owned = torch.zeros(case.key_cache.shape[0], dtype=torch.bool)
    for s, n in enumerate(case.seq_lens.tolist()):
        owned[case.block_tables[s, : (n + block - 1) // block].long()] = True
    case.key_cache[~owned] = garbage
    case.value_cache[~owned] = garbage
    got = run_decode(case, max_seq_len=case.max_seq_len + 40, **ov)
    assert_close(got, expected, torch.float16)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tiers_and_streaming_agree(dtype: torch.dtype) -> None:
    """single_tile, one_pass, partitioned and streamed runs of one case agree closely."""
    case = make_paged_case((1, 31, 64, 200, 257), 24, 4, 128, 16, dtype, seed=11)
    results = {}
    ov: dict = {}  # DecodeOverrides fields for this test's plans
    ov["partition_size"] = 64
    for tier in ("single_tile", "one_pass", "partitioned"):
        ov["tier"] = tier
        results[tier] = run_decode(case, **ov)
        ov["stream_tokens"] = 96
        results[f"{tier} stream"] = run_decode(case, **ov)
        ov.pop("stream_tokens", None)
    expected = reference(case)
    base = results["single_tile"]
    for name, got in results.items():
        assert_close(got, expected, dtype)
        # Same math, different grouping: closer to each other than to the reference.
        tol = TIGHT[dtype]
        torch.testing.assert_close(got, base, atol=tol, rtol=tol, msg=lambda m, n=name: f"{n}: {m}")


TIGHT = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5}


def test_out_none_allocates_result() -> None:
    from attn_core import paged_decode

    case = make_paged_case((7, 20), 4, 2, 64, 8, torch.float32)
    got = paged_decode(
        case.query, case.key_cache, case.value_cache, case.block_tables, case.seq_lens, 20
    )
    assert got.shape == case.query.shape and got.dtype == case.query.dtype
    assert_close(got, reference(case), torch.float32)


@pytest.mark.long
def test_100k_context_qwen_shape() -> None:
    """The Qwen3.6 attention shape at 100K tokens against the float64 reference."""
    case = make_paged_case((100_000,), 24, 4, 256, 16, torch.float16, seed=100)
    assert_close(run_decode(case), reference(case), torch.float16)


def test_query_sliced_from_fused_qkv() -> None:
    """vLLM's query is a column slice of the fused QKV projection: rows are not contiguous."""
    case = make_paged_case((9, 70), 8, 2, 64, 16, torch.float16, seed=12)
    qkv = torch.randn(2, (8 + 2 * 2) * 64).to(torch.float16)
    qkv[:, : 8 * 64] = case.query.reshape(2, -1)
    case.query = qkv[:, : 8 * 64].view(2, 8, 64)
    assert not case.query.is_contiguous()
    assert_close(run_decode(case), reference(case), torch.float16)


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=str)
def test_scores_in_compute_dtype_opt_in(dtype: torch.dtype) -> None:
    """ATTN_CORE_DECODE_SCORES=compute rounds scores (no fp32 key copy); still close."""
    ov: dict = {}  # DecodeOverrides fields for this test's plans
    ov["scores"] = "compute"
    case = make_paged_case(ODD_LENS, 12, 4, 128, 16, dtype, seed=13)
    assert_close(run_decode(case, **ov), reference(case), torch.bfloat16)


def test_empty_batch_is_a_no_op() -> None:
    from attn_core import paged_decode

    case = make_paged_case((5,), 8, 2, 64, 16, torch.float16)
    got = paged_decode(
        case.query[:0],
        case.key_cache,
        case.value_cache,
        case.block_tables[:0],
        case.seq_lens[:0],
        16,
    )
    assert got.shape == (0, 8, 64)


def test_query_with_any_strides() -> None:
    case = make_paged_case((9, 70), 8, 2, 64, 16, torch.float32, seed=14)
    case.query = case.query.transpose(0, 1).contiguous().transpose(0, 1)  # heads outermost
    assert not case.query.is_contiguous()
    assert_close(run_decode(case), reference(case), torch.float32)


def test_scales_apply_to_fp8_caches_only() -> None:
    """vLLM multiplies by k_scale / v_scale only when dequantising fp8; "auto" ignores them."""
    case = make_paged_case((9, 70), 8, 2, 64, 16, torch.float16, k_scale=0.5, v_scale=2.0)
    plain = make_paged_case((9, 70), 8, 2, 64, 16, torch.float16)
    assert_close(run_decode(case), reference(plain), torch.float16)
