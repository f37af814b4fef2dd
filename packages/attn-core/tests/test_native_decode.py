"""The native decode kernel against the float64 reference, on the GPU.

Every head size x block size x dtype; fp8 caches (e4m3, e5m2) with scales; ALiBi; GQA ratios
1-16 (above 8 a group spans several blocks); lengths 1, block-1, block, block+1, partition+-1
and long ones mixed in one batch; permuted block tables with random ids past each row's end;
NaN in the cache slots past each sequence's end; NaN-poisoned outputs and partials; more
partitions than any sequence needs (max_seq_len far above the lengths); CUDA-graph replay after
seq_lens change. On NVIDIA, block 16 at head 64, 128 and 256 (a head that fills its bucket)
runs the matrix-unit body's specialised loop, every other block and head size its general one.
CPU-only machines skip these with the reason.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from conftest import assert_close, requires_cuda
from decode_helpers import slopes_for
from native_helpers import (
    assert_fused_qkv_query_and_out,
    assert_split_and_whole,
    cuda_case,
    fp8_paged_case,
    native_library,
    reference,
    run_native,
)

pytestmark = [pytest.mark.cuda, requires_cuda]

HEAD_SIZES = (64, 80, 96, 112, 120, 128, 192, 256)
BLOCK_SIZES = (8, 16, 32)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def lengths(block_size: int, partition: int) -> list[int]:
    return [1, block_size - 1, block_size, block_size + 1, partition - 1, partition + 1, 700]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("head_size", HEAD_SIZES)
def test_every_head_block_dtype(head_size: int, block_size: int, dtype: torch.dtype) -> None:
    partition = 8 * block_size  # several partitions per sequence, partial tiles in each
    case = cuda_case(lengths(block_size, partition), 12, 4, head_size, block_size, dtype)
    parts = -(-1024 // partition)  # more partitions than the longest sequence needs
    assert_split_and_whole(run_native, case, (parts, partition), parts * partition, dtype)


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("head_size", (64, 80, 128, 192, 256))  # 80, 192: below their buckets
def test_fp8_caches(head_size, block_size, dtype, kv_cache_dtype) -> None:
    lens = lengths(block_size, 128)
    case = fp8_paged_case(cuda_case, lens, head_size, block_size, dtype, kv_cache_dtype)
    # fp8 values are exact in the reference too: only the accumulation and output rounding differ
    assert_split_and_whole(run_native, case, (8, 128), 1024, dtype)


@pytest.mark.parametrize("dtype", (torch.float16, torch.float32), ids=str)
@pytest.mark.parametrize("head_size", (80, 256))
def test_merge_of_hundreds_of_partitions(head_size: int, dtype: torch.dtype) -> None:
    """The merge's streams: a launch of 260 partitions takes 16-dimension slices (eight
    streams; 257 hold tokens at 4100, so five rounds of eight loads with the running maximum
    rescaled between them; 1 token leaves seven streams empty), one of 37 takes 32-dimension
    slices (four streams); head 80 leaves half of its third 32-dimension slice idle."""
    case = cuda_case([1, 1000, 4100, 3333], 12, 2, head_size, 16, dtype)
    want = reference(case)
    assert_close(run_native(case, 260, 16), want, dtype)
    assert_close(run_native(case, 37, 112), want, dtype)


@pytest.mark.parametrize("group", [1, 2, 3, 4, 5, 6, 7, 8, 12, 16])
def test_gqa_ratios(group: int) -> None:
    case = cuda_case([5, 333, 1000], 2 * group, 2, 128, 16, torch.float16, seed=group)
    assert_split_and_whole(run_native, case, (4, 256), 1024, torch.float16)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_alibi_and_scale(dtype: torch.dtype) -> None:
    case = cuda_case([1, 17, 300, 999], 8, 2, 128, 16, dtype)
    slopes = slopes_for(8, "cuda")
    want = reference(case, scale=0.05, alibi_slopes=slopes)
    got = run_native(case, 5, 208, scale=0.05, alibi_slopes=slopes)
    assert_close(got, want, dtype)


def test_max_seq_len_far_above_lengths() -> None:
    """A graph captured at 32K serves sequences of 3 and 40 tokens: empty partitions are skipped
    and the merge reads only those that hold tokens."""
    case = cuda_case([3, 40], 24, 4, 256, 16, torch.float16, extra_table_blocks=2048)
    assert_close(run_native(case, 128, 256), reference(case), torch.float16)


def test_strided_query_and_out() -> None:
    """vLLM slices q out of a fused qkv projection and passes an ``empty_like`` of it as out."""
    assert_fused_qkv_query_and_out(cuda_case, run_native)


def test_cuda_graph_replay_follows_seq_lens() -> None:
    case = cuda_case([900, 1000, 64], 24, 4, 256, 16, torch.float16)
    out = torch.full_like(case.query, math.nan)
    run_native(case, 8, 128, out=out)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_native(case, 8, 128, out=out)
    # shorter than at capture only: the slots past the captured lengths hold poison (NaN)
    for new in ([1, 999, 64], [900, 1, 13], [129, 128, 63]):
        case.seq_lens.copy_(torch.tensor(new, dtype=torch.int32))
        out.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        assert_close(out, reference(case), torch.float16)


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16, torch.float32), ids=str)
def test_merge_on_both_sides_of_the_dependent_launch(dtype: torch.dtype) -> None:
    """On sm_90 and later a merge grid of at most two blocks per SM launches as a programmatic
    dependent of the partition kernel (csrc/paged_decode.cu, launch_merge), a larger one
    plainly. 64 partitions take 16-dimension slices, so 6 heads at head 256 make 96 merge blocks
    a sequence: one sequence is under the line on any GPU of 48 SMs or more, enough sequences
    are over it. Each is captured in a CUDA graph and replayed after seq_lens change, with the
    outputs poisoned before every replay; the partial tiles and the empty partitions are in it."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    over = -(-(2 * sms + 1) // 96)  # sequences whose merge grid exceeds two blocks an SM
    for seqs in (1, over):
        lens = [2000 - 37 * i for i in range(seqs)]
        case = cuda_case(lens, 6, 1, 256, 16, dtype, seed=seqs)
        out = torch.full_like(case.query, math.nan)
        run_native(case, 64, 32, out=out)
        torch.cuda.synchronize()
        assert_close(out, reference(case), dtype)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run_native(case, 64, 32, out=out)
        for shift in (1, 700, 1999):
            new = [max(1, n - shift - 13 * i) for i, n in enumerate(lens)]  # never longer
            case.seq_lens.copy_(torch.tensor(new, dtype=torch.int32))
            out.fill_(math.nan)
            graph.replay()
            torch.cuda.synchronize()
            assert_close(out, reference(case), dtype)


def test_the_driver_reports_what_the_facts_record() -> None:
    """Registers and shared memory as the driver reports them equal kernel_facts.json's record
    of the body this device runs (the simulator and the split price those)."""
    from attn_core import detect_device_spec
    from attn_core.native import abi, facts
    from attn_core.native.split import decode_body

    spec = detect_device_spec(torch.device("cuda"))
    major, minor = torch.cuda.get_device_capability()
    same_target = facts.load_facts()["arch"] == f"sm_{major}{minor}"  # else other registers
    names = {abi.FLOAT16: "float16", abi.BFLOAT16: "bfloat16", abi.FLOAT32: "float32"}
    caches = {abi.FP8_E4M3: "fp8_e4m3", abi.FP8_E5M2: "fp8_e5m2"}
    pairs = [(q, q) for q in names] + [(q, c) for q in names for c in caches]
    for bucket in abi.HEAD_BUCKETS:
        for (kind, cache), group in itertools.product(pairs, range(1, 9)):
            got = native_library(group).kernel_info("partition", kind, cache, bucket, group)
            query, cache_name = names[kind], {**names, **caches}[cache]
            body = decode_body(spec, query, cache_name)
            want = facts.lookup("partition", query, cache_name, bucket, group, body)
            assert want is not None, (bucket, kind, cache, group, body)
            # in 128-byte units (the H200's allocation unit): a build's static arrays may be
            # padded differently from the portable build's ptxas record of the same CUDA-core
            # body (fp32, head 64: 5504 vs 5440 while a dynamic array sat beside them)
            assert -(-got.smem_bytes // 128) == -(-want.smem_bytes // 128), (want, got)
            assert got.num_regs == want.registers or not same_target, (want, got)
            assert got.blocks_per_sm >= 1, (bucket, kind, got)
            # the block the library launches is the one the split and the simulator price
            assert got.threads_per_block == want.threads, (want, got)
