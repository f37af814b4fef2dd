"""``paged_decode`` on the native backend (CUDA): the planner's split, through the public API,
against the float64 reference, beside the torch path on the same inputs.

The kernel's own corner cases (every head size, block size, fp8 format, explicit partitionings)
are test_native_decode.py's; here every call goes through a plan, as vLLM's calls do.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import assert_close, requires_cuda, skip_without_float8
from decode_helpers import decode_on, plan_of, slopes_for
from native_helpers import cuda_case, native_library, reference

from attn_core import paged_decode
from attn_core.core.shapes import AttentionShape
from attn_core.core.workspace import Workspace
from attn_core.decode.plan import DecodeLengths
from attn_core.native.split import native_split
from attn_core.runtime.resolve import decode_plan_for

pytestmark = [pytest.mark.cuda, requires_cuda]


def decode(case, p, max_seq_len, **kwargs):
    out = torch.full_like(case.query, math.nan)  # poisoned: every element must be written
    return decode_on(
        case, max_seq_len, out=out, plan=p, workspace=Workspace(), k_scale=case.k_scale,
        v_scale=case.v_scale, kv_cache_dtype=case.kv_cache_dtype, **kwargs,
    )  # fmt: skip


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16, torch.float32), ids=str)
@pytest.mark.parametrize("group", (1, 3, 6, 8, 12))
def test_native_and_torch_backends_match_the_reference(group, dtype):
    native_library(group)  # skips with the reason where the kernel is unavailable
    lens = [1, 15, 17, 1000, 4099]  # odd sizes, partial blocks, several partitions
    case = cuda_case(lens, 2 * group, 2, 128, 16, dtype, non_contiguous_tables=True, seed=group)
    want = reference(case)
    for backend in ("native", "torch"):
        p = plan_of(case, 4099, backend=backend)
        assert p.backend == backend
        assert_close(decode(case, p, 4099), want, dtype)


@pytest.mark.parametrize("kv_cache_dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_native_fp8_through_the_plan(kv_cache_dtype):
    skip_without_float8()
    native_library(6)
    case = cuda_case(
        [33, 2000], 24, 4, 256, 16, torch.float16, kv_cache_dtype=kv_cache_dtype,
        k_scale=0.5, v_scale=1.7,
    )  # fmt: skip
    p = plan_of(case, 2000, backend="native")
    assert_close(decode(case, p, 2000), reference(case), torch.float16)


def test_qwen_shape_long_context_one_and_many_partitions():
    native_library(6)
    for batch, ctx in ((1, 40_000), (48, 3000)):
        case = cuda_case([ctx - 7 * i for i in range(batch)], 24, 4, 256, 16, torch.float16)
        p = plan_of(case, ctx, backend="native")
        split = native_split(AttentionShape(), batch, ctx, p.device_spec)
        assert p.native == split
        assert_close(decode(case, p, ctx), reference(case), torch.float16)


def test_alibi_and_odd_scale_through_the_plan():
    native_library(4)
    case = cuda_case([5, 300, 999], 8, 2, 128, 16, torch.float16)
    slopes = slopes_for(8, "cuda")
    got = decode(case, plan_of(case, 999, backend="native"), 999, scale=0.07, alibi_slopes=slopes)
    assert_close(got, reference(case, scale=0.07, alibi_slopes=slopes), torch.float16)


def test_default_plan_on_cuda_takes_the_native_kernel():
    native_library(6)
    case = cuda_case([100, 200], 24, 4, 256, 16, torch.float16)
    num_seqs = case.query.shape[0]
    p = decode_plan_for(AttentionShape(), DecodeLengths(num_seqs, 200), torch.device("cuda"))
    assert p.backend == "native"


def test_native_plan_captures_and_replays_in_a_cuda_graph():
    native_library(6)
    # vLLM captures at a max_seq_len its block tables can hold: the table is as wide as the
    # capture size (decode_checks refuses a max_seq_len beyond the table's capacity)
    capture = 4096
    case = cuda_case([900, 1000, 64], 24, 4, 256, 16, torch.float16,
                     extra_table_blocks=capture // 16)  # fmt: skip
    assert case.block_tables.shape[1] * 16 >= capture
    p = plan_of(case, capture, backend="native")
    assert p.native is not None and p.native.merged
    ws, out = Workspace(), torch.full_like(case.query, math.nan)

    def step():
        paged_decode(case.query, case.key_cache, case.value_cache, case.block_tables,
                     case.seq_lens, capture, out=out, plan=p, workspace=ws)  # fmt: skip

    step()  # warm-up: the partials are allocated outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for new in ([1, 999, 64], [900, 1, 13]):
        case.seq_lens.copy_(torch.tensor(new, dtype=torch.int32))
        out.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        assert_close(out, reference(case), torch.float16)
