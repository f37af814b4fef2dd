"""The decode kernel BI-V100 runs, on the CPU, against the float64 reference.

CI has no GPU. The CoreX configuration of csrc/paged_decode.cu (the CUDA-core body, no inline
PTX, no shuffles) compiled for the host by ci/host_emulation.py runs each block's threads as
fibers; these tests call it through attn-core's own argument block and loader, so a change to
the kernel's indexing, masking, softmax, partitions or merge fails here, before a device run.
The cases follow test_native_decode.py (which runs the GPU builds): odd head sizes below their
buckets, every block size and dtype, fp8 caches with scales, GQA groups across the head-slot
libraries, permuted block tables with NaN in each sequence's last page past its end, outputs
and partials NaN-poisoned, empty partitions, hundreds of partitions. Every phase's threads also
run in reverse order once per case family: the same bits come out unless some thread reads
shared memory another wrote in that phase (a missing barrier).

Not covered here: what nvcc or CoreX's compiler make of the source (ci/clang_check.py, the
device's CUDA tests), NVIDIA's matrix-unit body (inline PTX), and time.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import assert_close, skip_without_float8
from decode_helpers import slopes_for
from host_emulation_helpers import emulated_decode, host_case, run_emulated
from native_helpers import (
    assert_fused_qkv_query_and_out,
    assert_split_and_whole,
    fp8_paged_case,
    reference,
)

from attn_core.native.loader import NativeError
from attn_core.reference import make_paged_case

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def lengths(block_size: int, partition: int) -> list[int]:
    return [1, block_size - 1, block_size, block_size + 1, partition - 1, partition + 1, 300]


def check_both_orders(case, parts: int, size: int, dtype: torch.dtype, **kwargs) -> None:
    """Against the reference, and bit for bit the same with each phase's threads reversed."""
    got = run_emulated(case, parts, size, **kwargs)
    assert_close(got, reference(case, **kwargs), dtype)
    again = run_emulated(case, parts, size, reverse=True, **kwargs)
    assert torch.equal(got.view(torch.uint8), again.view(torch.uint8)), "thread order changed bits"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("block_size", (8, 16, 32))
@pytest.mark.parametrize("head_size", (64, 80, 128, 192, 256))
def test_every_head_block_dtype(head_size: int, block_size: int, dtype: torch.dtype) -> None:
    partition = 8 * block_size  # several partitions a sequence, partial tiles in each
    case = host_case(lengths(block_size, partition), 12, 4, head_size, block_size, dtype)
    parts = -(-300 // partition) + 1  # one more partition than the longest sequence needs
    assert_split_and_whole(run_emulated, case, (parts, partition), parts * partition, dtype)


@pytest.mark.parametrize("kv_cache_dtype", ["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("block_size", (8, 16))  # 8: fp8 values as 8-byte vectors
@pytest.mark.parametrize("head_size", (64, 192, 256))
def test_fp8_caches(head_size, block_size, dtype, kv_cache_dtype) -> None:
    lens = lengths(block_size, 128)
    case = fp8_paged_case(host_case, lens, head_size, block_size, dtype, kv_cache_dtype)
    assert_split_and_whole(run_emulated, case, (4, 128), 512, dtype)


@pytest.mark.parametrize("group", [1, 3, 6, 8, 12, 16])  # 12 and 16: two blocks of 6 and 8
def test_gqa_ratios(group: int) -> None:
    case = host_case([5, 333, 1000], 2 * group, 2, 128, 16, torch.float16, seed=group)
    assert_split_and_whole(run_emulated, case, (4, 256), 1024, torch.float16)


@pytest.mark.parametrize("head_size", (80, 256))
def test_merge_of_hundreds_of_partitions(head_size: int) -> None:
    """260 partitions: the merge's 16-dimension slices, eight streams, rounds of loads with the
    running maximum rescaled between them; one sequence of 1 token leaves seven streams empty.
    37 partitions: 32-dimension slices, four streams."""
    case = host_case([1, 1000, 4100], 6, 1, head_size, 16, torch.float32)
    want = reference(case)
    assert_close(run_emulated(case, 260, 16), want, torch.float32)
    assert_close(run_emulated(case, 37, 112), want, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_alibi_and_scale(dtype: torch.dtype) -> None:
    case = host_case([1, 17, 300, 999], 8, 2, 128, 16, dtype)
    check_both_orders(case, 5, 208, dtype, scale=0.05, alibi_slopes=slopes_for(8))


def test_empty_partitions_past_every_end() -> None:
    """A split sized for 32K over sequences of 3 and 40 tokens: blocks past an end return at
    once and the merge reads only partitions that hold tokens."""
    case = host_case([3, 40], 24, 4, 256, 16, torch.float16, extra_table_blocks=2048)
    check_both_orders(case, 128, 256, torch.float16)


@pytest.mark.parametrize(
    ("kv_cache_dtype", "dtype"),
    [("auto", torch.float16), ("fp8_e4m3", torch.bfloat16), ("auto", torch.float32)],
    ids=str,
)
def test_qwen_shape_in_both_thread_orders(kv_cache_dtype: str, dtype: torch.dtype) -> None:
    """Qwen3.6's 24 / 4 heads at head 256 over a 2000-token window boundary (kPageWindow pages
    at block 8: the page ids are restaged mid-partition) and partial last tiles."""
    if kv_cache_dtype != "auto":
        skip_without_float8()
    case = host_case(
        [2100, 129, 7], 24, 4, 256, 8, dtype, kv_cache_dtype=kv_cache_dtype,
        k_scale=0.5 if kv_cache_dtype != "auto" else 1.0,
    )  # fmt: skip
    check_both_orders(case, 3, 1024, dtype)
    check_both_orders(case, 1, 3072, dtype)


def test_lengths_past_the_table_are_read_up_to_its_end() -> None:
    """A length beyond the table row is clamped to it (the kernel stays inside the memory the
    caller passed whatever the lengths say; the ASan run checks that too): the result is the
    reference at the table's capacity."""
    case = make_paged_case([40, 200], 8, 2, 128, 16, torch.float16, extra_table_blocks=3)
    capacity = case.block_tables.shape[1] * 16
    want = reference(replace(case, seq_lens=torch.tensor([capacity] * 2, dtype=torch.int32)))
    case.seq_lens = torch.tensor([capacity + 1, 1 << 30], dtype=torch.int32)
    assert_close(run_emulated(case, 1, capacity), want, torch.float16)


def test_strided_query_and_out() -> None:
    """vLLM slices q out of a fused qkv projection and passes an ``empty_like`` of it as out."""
    assert_fused_qkv_query_and_out(host_case, run_emulated)


def test_arguments_the_library_refuses_raise_with_its_reason() -> None:
    """A partition size that is not a multiple of the block size: the library's own check
    (attn_native_decode) answers before any launch, and the loader names it."""
    case = host_case([40], 8, 2, 128, 16, torch.float16)
    with pytest.raises(NativeError, match="invalid argument"):
        run_emulated(case, 2, 24)
    assert emulated_decode(4).platform == "iluvatar-corex"  # the configuration emulated
