"""paged_prefix_prefill (torch backend) against the float64 reference over the supported matrix.

Mixed batches hold a sequence with no context, 1-token queries and lengths one either side of
the tile and block sizes; block tables are random permutations; every output starts as NaN.
Small forced tiles (query 8, key 16) make short sequences cross many tile edges.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import assert_close, requires_cuda
from hypothesis import given, settings
from hypothesis import strategies as st
from plan_helpers import prefill_plan
from prefill_helpers import reference, run_prefill

from attn_core import paged_prefix_prefill
from attn_core.core.cache_layout import SUPPORTED_BLOCK_SIZES, SUPPORTED_HEAD_SIZES
from attn_core.reference import make_prefill_case

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
GQA = ((24, 4), (16, 2), (8, 1), (8, 8))
# (context, new tokens): no context, 1-token queries, tile/block edges +-1, primes.
MIXED = ((0, 13), (37, 1), (16, 17), (95, 33), (1, 7), (64, 64))


def small_tiles(case, **overrides):
    """A torch plan with query tile 8 and key tile 16 for ``case``."""
    q, kvh = case.query, case.key.shape[1]
    return prefill_plan(
        q.shape[1],
        kvh,
        q.shape[2],
        q.dtype,
        case.max_query_len,
        backend="torch",
        query_tile=8,
        key_tile=16,
        **overrides,
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_size", SUPPORTED_HEAD_SIZES)
def test_head_sizes_and_dtypes(head_size: int, dtype: torch.dtype) -> None:
    case = make_prefill_case(MIXED, 4, 2, head_size, 16, dtype, seed=head_size)
    assert_close(run_prefill(case, small_tiles(case)), reference(case), dtype)


@pytest.mark.parametrize("heads", GQA, ids=lambda h: f"{h[0]}q{h[1]}kv")
@pytest.mark.parametrize("block_size", SUPPORTED_BLOCK_SIZES)
def test_gqa_ratios_and_block_sizes(heads: tuple[int, int], block_size: int) -> None:
    case = make_prefill_case(MIXED, *heads, 64, block_size, torch.float32, seed=block_size)
    assert_close(run_prefill(case, small_tiles(case)), reference(case), torch.float32)


@pytest.mark.parametrize("window", (0, 16, 64, 2048))
@pytest.mark.parametrize("alibi", (False, True), ids=("no-alibi", "alibi"))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sliding_window_and_alibi(window: int, alibi: bool, dtype: torch.dtype) -> None:
    seqs = ((0, 70), (150, 40), (20, 1), (300, 9))
    case = make_prefill_case(
        seqs, 8, 2, 64, 16, dtype, alibi=alibi, sliding_window=window, seed=window
    )
    assert_close(run_prefill(case, small_tiles(case)), reference(case), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kv_cache_dtype", ("fp8", "fp8_e4m3", "fp8_e5m2"))
def test_fp8_caches(kv_cache_dtype: str, dtype: torch.dtype) -> None:
    case = make_prefill_case(
        MIXED, 8, 2, 128, 16, dtype, kv_cache_dtype=kv_cache_dtype, k_scale=0.25, v_scale=3.0
    )
    assert_close(run_prefill(case, small_tiles(case)), reference(case), dtype)


def test_default_plan_matches_small_tiles() -> None:
    """The planned (large) tiles and forced small ones agree: tiling changes no result."""
    case = make_prefill_case(MIXED, 24, 4, 256, 16, torch.float32, seed=7)
    big = run_prefill(case)
    small = run_prefill(case, small_tiles(case))
    assert_close(big, reference(case), torch.float32)
    torch.testing.assert_close(big, small, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kv_cache_dtype", ("auto", "fp8_e5m2"))
@pytest.mark.parametrize("window", (0, 40))
def test_streaming_matches_whole_context(window: int, kv_cache_dtype: str) -> None:
    """Streaming gathers 32-token context chunks per query tile; results equal the whole path."""
    case = make_prefill_case(
        MIXED, 8, 2, 64, 16, torch.float32, sliding_window=window, seed=11,
        kv_cache_dtype=kv_cache_dtype, k_scale=0.5, v_scale=2.0,
    )  # fmt: skip
    plan = dataclasses.replace(small_tiles(case), stream_chunk=32)
    assert_close(run_prefill(case, plan), reference(case), torch.float32)


def test_small_budget_streams_and_shrinks_tiles() -> None:
    """A 64 KiB budget: the plan streams the context and shrinks both tiles; results hold."""
    case = make_prefill_case(((600, 90), (0, 5), (333, 1)), 8, 2, 64, 16, torch.float32, seed=29)
    plan = prefill_plan(
        8, 2, 64, torch.float32, case.max_query_len, max_context_len=600, budget_bytes=64 << 10
    )
    assert plan.workspace_bytes <= 64 << 10
    assert 0 < plan.stream_chunk < 600 and plan.key_tile < 4096
    assert_close(run_prefill(case, plan), reference(case), torch.float32)


@pytest.mark.cuda
@requires_cuda
def test_cuda_transient_memory_within_budget() -> None:
    """Peak memory above the inputs and ``out``: the budget + the gathered context + the chunk's
    own K/V copy (both outside the budget by definition), at 32K context and an 8K chunk."""
    budget = 256 << 20
    case = make_prefill_case(((32768, 8192),), 24, 4, 256, 16, torch.float16, device="cuda")
    plan = prefill_plan(
        24,
        4,
        256,
        torch.float16,
        8192,
        max_context_len=32768,
        device=torch.device("cuda"),
        backend="torch",
        budget_bytes=budget,
    )
    out = torch.empty_like(case.query)
    paged_prefix_prefill(*case.args(), out=out, plan=plan)  # warm up
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    paged_prefix_prefill(*case.args(), out=out, plan=plan)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    per_token_kv = 2 * 4 * 256 * 2
    # + 8 MiB: small index / mask / length tensors and the allocator's 512-byte rounding.
    allowed = budget + (32768 + 8192) * per_token_kv + (8 << 20)
    assert peak <= allowed, (peak, allowed)


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=str)
def test_half_precision_scores(dtype: torch.dtype) -> None:
    """The device path keeps scores in fp16/bf16 (fp32 softmax state); check it on the CPU."""
    try:
        torch.bmm(torch.ones(1, 2, 2, dtype=dtype), torch.ones(1, 2, 2, dtype=dtype))
    except RuntimeError as exc:  # torch 2.1's CPU has no half-precision bmm
        pytest.skip(f"torch {torch.__version__} CPU bmm lacks {dtype}: {exc}")
    case = make_prefill_case(MIXED, 8, 2, 128, 16, dtype, alibi=True, seed=13)
    plan = small_tiles(case, score_dtype=dtype)
    assert plan.score_dtype == dtype
    got = run_prefill(case, plan)
    # Scores rounded to 2 bytes before exp: the prefill tolerance of FlashInfer's tests.
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), reference(case), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("window", (0, 64))
def test_alibi_with_fp16_scores_and_large_tiles(window: int) -> None:
    """The CUDA fp16 plan (fp16 scores) with its own large tiles and ALiBi, emulated on the CPU.

    gpu-run-1 case at 8/2/64: a 512-query tile over a 257-token chunk behind 1500 cached
    tokens. A bias relative to the tile's first query instead of each row's own position put
    the near keys' logits at ~slope * 257 where fp16 keeps 1/8 of a unit: max error 0.063 here
    (0.152 at 24/4/256, the H200's exact failure) against 0.0017 now.
    """
    try:
        torch.bmm(torch.ones(1, 2, 2).half(), torch.ones(1, 2, 2).half())
    except RuntimeError as exc:  # torch 2.1's CPU has no half-precision bmm
        pytest.skip(f"torch {torch.__version__} CPU bmm lacks float16: {exc}")
    seqs = ((0, 300), (1500, 257), (20, 1))
    case = make_prefill_case(
        seqs, 8, 2, 64, 16, torch.float16, alibi=True, sliding_window=window, seed=5
    )
    plan = prefill_plan(
        8, 2, 64, torch.float16, case.max_query_len, backend="torch", score_dtype=torch.float16
    )
    assert plan.query_tile >= 257 and plan.score_dtype == torch.float16
    got = run_prefill(case, plan)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), reference(case), atol=2e-2, rtol=2e-2)


def test_fp32_scores_with_bf16_operands(monkeypatch) -> None:
    """The CUDA bf16 plan (bf16 GEMM operands, fp32 scores, a bf16 copy of the probabilities
    for P@V). The CPU has no fp32-output bf16 GEMM, so the QK^T product is upcast here."""
    from attn_core.prefill import torch_path as prefill_torch

    try:
        torch.bmm(torch.ones(1, 2, 2, dtype=torch.bfloat16), torch.ones(1, 2, 2).bfloat16())
    except RuntimeError as exc:
        pytest.skip(f"torch {torch.__version__} CPU bmm lacks bf16: {exc}")

    def bmm_into(a, b, out):  # an fp32-output GEMM where the operands are 2-byte
        if out.dtype == a.dtype:
            torch.bmm(a, b, out=out)
        else:
            torch.bmm(a.float(), b.float(), out=out)

    monkeypatch.setattr(prefill_torch, "_bmm_into", bmm_into)
    case = make_prefill_case(MIXED, 8, 2, 128, 16, torch.bfloat16, alibi=True, seed=37)
    plan = dataclasses.replace(small_tiles(case), matmul_dtype=torch.bfloat16)
    assert plan.score_dtype == torch.float32
    assert_close(run_prefill(case, plan), reference(case), torch.bfloat16)


def test_batch_equals_single_sequences() -> None:
    case = make_prefill_case(MIXED, 8, 2, 64, 16, torch.float32, seed=17)
    batched = run_prefill(case)
    starts = case.query_start_loc.tolist()
    for s in range(len(MIXED)):
        q0, q1 = starts[s], starts[s + 1]
        one = dataclasses.replace(
            case,
            query=case.query[q0:q1],
            key=case.key[q0:q1],
            value=case.value[q0:q1],
            block_tables=case.block_tables[s : s + 1],
            query_start_loc=torch.tensor([0, q1 - q0], dtype=torch.int32),
            seq_lens=case.seq_lens[s : s + 1],
            context_lens=case.context_lens[s : s + 1],
        )
        torch.testing.assert_close(run_prefill(one), batched[q0:q1], atol=1e-6, rtol=1e-6)


def test_empty_query_sequence_and_explicit_scale() -> None:
    """A sequence with context but no new tokens contributes nothing; scale is honoured."""
    case = make_prefill_case(((30, 5), (40, 0), (0, 3)), 4, 4, 64, 16, torch.float32, seed=19)
    out = torch.full_like(case.query, float("nan"))
    paged_prefix_prefill(*case.args()[:-1], case.max_query_len, 0.3, out=out)
    from attn_core.reference import reference_prefix_prefill

    kw = case.reference_kwargs()
    kw["query"], kw["key"], kw["value"] = case.query[:5], case.key[:5], case.value[:5]
    kw["block_tables"], kw["context_lens"] = case.block_tables[:1], case.context_lens[:1]
    kw["query_start_loc"] = torch.tensor([0, 5])
    assert_close(out[:5], reference_prefix_prefill(**kw, scale=0.3), torch.float32)
    assert torch.isfinite(out).all()


@pytest.mark.long
def test_long_context_100k_with_2k_chunk() -> None:
    """One sequence, 100K cached tokens + a 2K chunk, on the CPU (minutes with the reference)."""
    case = make_prefill_case(((100_000, 2_048),), 4, 1, 128, 16, torch.float32, seed=23)
    assert_close(run_prefill(case), reference(case), torch.float32)


def test_qkv_views_of_a_packed_projection() -> None:
    """vLLM passes query/key/value as strided views of one qkv projection output."""
    case = make_prefill_case(MIXED, 8, 2, 64, 16, torch.float16, seed=31)
    n = case.query.shape[0]
    qkv = torch.cat(
        [case.query.reshape(n, -1), case.key.reshape(n, -1), case.value.reshape(n, -1)], dim=1
    )
    q, k, v = qkv.split([8 * 64, 2 * 64, 2 * 64], dim=1)
    views = dataclasses.replace(
        case, query=q.view(n, 8, 64), key=k.view(n, 2, 64), value=v.view(n, 2, 64)
    )
    assert not views.key.is_contiguous()
    assert_close(run_prefill(views, small_tiles(views)), reference(case), torch.float16)


@settings(max_examples=12, deadline=None)
@given(
    seqs=st.lists(st.tuples(st.integers(0, 90), st.integers(0, 40)), min_size=1, max_size=4),
    query_tile=st.integers(1, 48),
    key_tile=st.integers(1, 64),
    stream_chunk=st.sampled_from([0, 16, 33]),
    window=st.sampled_from([0, 1, 7, 50]),
)
def test_random_batches_and_tiles(seqs, query_tile, key_tile, stream_chunk, window) -> None:
    """Any batch (empty queries included), any tile sizes and window: the reference's answer."""
    if all(q == 0 for _, q in seqs):
        seqs = [*seqs, (3, 2)]
    case = make_prefill_case(seqs, 4, 2, 64, 8, torch.float32, sliding_window=window, seed=1)
    plan = prefill_plan(
        4,
        2,
        64,
        torch.float32,
        case.max_query_len,
        backend="torch",
        query_tile=query_tile,
        key_tile=key_tile,
    )
    plan = dataclasses.replace(plan, stream_chunk=stream_chunk)
    assert_close(run_prefill(case, plan), reference(case), torch.float32)
