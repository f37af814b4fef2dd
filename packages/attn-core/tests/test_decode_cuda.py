"""paged_decode on a CUDA device: correctness on the device's own matmul paths, CUDA-graph
capture and replay, workspace reuse by the caching allocator's counters, transient memory.

Run on the GPU machine: ``pytest -m cuda packages/attn-core/tests/test_decode_cuda.py``.
"""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close, poisoned_like, requires_cuda
from decode_helpers import decode_on, plan_of, reference, run_decode, slopes_for

from attn_core.core.workspace import Workspace
from attn_core.reference import make_paged_case

pytestmark = [pytest.mark.cuda, requires_cuda]
DEV = "cuda"


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16, torch.float32), ids=str)
@pytest.mark.parametrize("tier", ("single_tile", "one_pass", "partitioned"))
@pytest.mark.parametrize("kv_cache_dtype", ("auto", "fp8"))
@pytest.mark.parametrize("gather_bytes", (8, 16))
def test_matches_reference_on_device(tier, dtype, kv_cache_dtype, gather_bytes):
    ov: dict = {}  # DecodeOverrides fields for this test's plans
    ov["tier"] = tier
    ov["gather_bytes"] = gather_bytes
    ov["partition_size"] = 64
    case = make_paged_case(
        (1, 63, 64, 65, 300, 1001),
        24,
        4,
        256,
        16,
        dtype,
        DEV,
        kv_cache_dtype=kv_cache_dtype,
        k_scale=0.5,
        v_scale=2.0,
        seed=7,
        extra_table_blocks=7,  # max_seq_len 1100 must fit the tables (host check since 028dc04)
    )
    slopes = slopes_for(24, DEV)
    got = run_decode(case, max_seq_len=1100, alibi_slopes=slopes, **ov)
    assert_close(got, reference(case, alibi_slopes=slopes.cpu()), dtype)


@pytest.mark.parametrize("heads", ((24, 4), (16, 2), (6, 1), (32, 8)))
def test_default_plan_long_context(heads) -> None:
    case = make_paged_case((20_000, 3, 4097), heads[0], heads[1], 128, 16, torch.float16, DEV)
    assert_close(run_decode(case), reference(case), torch.float16)


@pytest.mark.parametrize("tier", ("one_pass", "partitioned"))
def test_masked_garbage_on_device(tier: str) -> None:
    """NaN in every slot no sequence owns, on the device's own kernels."""
    ov: dict = {}  # DecodeOverrides fields for this test's plans
    ov["tier"] = tier
    ov["partition_size"] = 64
    # 32 spare table columns: max_seq_len 1500 must fit the tables (host check since 028dc04)
    case = make_paged_case(
        (5, 100, 1000, 16), 24, 4, 128, 16, torch.float16, DEV, seed=9, extra_table_blocks=32
    )
    expected = reference(case)
    owned = torch.zeros(case.key_cache.shape[0], dtype=torch.bool, device=DEV)
    for s, n in enumerate(case.seq_lens.tolist()):
        row = case.block_tables[s].long()
        owned[row[: (n + 15) // 16]] = True
        if n % 16:
            case.key_cache[row[(n - 1) // 16], :, :, n % 16 :] = float("nan")
            case.value_cache[row[(n - 1) // 16], :, :, n % 16 :] = float("nan")
    case.key_cache[~owned] = float("nan")
    case.value_cache[~owned] = float("nan")
    assert_close(run_decode(case, max_seq_len=1500, **ov), expected, torch.float16)


def _graph_case():
    case = make_paged_case(
        (700, 5, 2048), 24, 4, 256, 16, torch.float16, DEV, extra_table_blocks=128, seed=3
    )
    # vLLM captures with max_seq_len = its capture bound, beyond every length; its graph tables
    # hold ceil(bound / block_size) blocks (256 x 16 = 4096 here; paged_decode checks it)
    return case, 4096


def _value_scale(case) -> float:
    """Largest |value| the sequences read: blocks a longer seq_len reaches through the table's
    extra entries may be make_paged_case's spare blocks, whose values are 30x larger."""
    used = case.block_tables.long().flatten()
    return float(case.value_cache[used].float().abs().amax())


def test_cuda_graph_capture_and_replay_after_seq_lens_change() -> None:
    """Replay equals an eager call on the same inputs (bitwise, or within one fp16 ulp),
    and the float64 reference within fp16's tolerance scaled to the values read.

    GPU run 1 failed this test on the reference check alone: 3/18432 elements off by at most
    0.0076 where the longer lengths reach spare blocks of |v| ~ 30 (fp16's ulp at 30 is
    0.0156, so that is half an ulp of rounding in P and the output, not a replay bug)."""
    case, capture_len = _graph_case()
    ws = Workspace()
    out = poisoned_like(case.query)

    def step(dst: torch.Tensor, workspace: Workspace) -> None:
        decode_on(case, capture_len, out=dst, workspace=workspace)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm-up: plans, probes and workspace buffers exist before capture
            step(out, ws)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(out, ws)
    eager_ws = Workspace()
    for lens in ((700, 5, 2048), (701, 1, 2100), (1, 1, 1), (3000, 17, 3168)):
        case.seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        eager = poisoned_like(case.query)
        step(eager, eager_ws)
        torch.cuda.synchronize()
        # same kernels on the same data: bitwise equal, at most one fp16 ulp apart should
        # cuBLAS pick another algorithm for the eager call's buffers
        a, b = out.float(), eager.float()
        ulp = torch.finfo(torch.float16).eps * torch.maximum(a.abs(), b.abs()) + 6e-8
        assert ((a - b).abs() <= ulp).all(), (lens, (a - b).abs().max())
        expected = reference(case)
        assert torch.isfinite(out).all()
        scale = max(1.0, _value_scale(case))
        torch.testing.assert_close(
            out.double().cpu(),
            expected,
            atol=2.5e-3 * scale,
            rtol=5e-3,
            msg=lambda m, lens=lens: f"{lens}: {m}",
        )


def test_steady_state_allocates_nothing_new() -> None:
    case = make_paged_case((5000, 77), 24, 4, 256, 16, torch.float16, DEV)
    ws = Workspace()
    run_decode(case, workspace=ws)
    torch.cuda.synchronize()
    allocations = ws.allocations
    reserved = torch.cuda.memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    run_decode(case, workspace=ws)
    torch.cuda.synchronize()
    peak_second = torch.cuda.max_memory_allocated()
    for _ in range(3):
        torch.cuda.reset_peak_memory_stats()
        run_decode(case, workspace=ws)
        torch.cuda.synchronize()
        assert torch.cuda.max_memory_allocated() == peak_second
    assert ws.allocations == allocations
    assert torch.cuda.memory_reserved() == reserved
    assert torch.cuda.memory_stats().get("num_alloc_retries", 0) == 0


def _transient_peak(case, ws, **overrides) -> int:
    out = torch.empty_like(case.query)
    max_len = case.max_seq_len
    plan = plan_of(case, **overrides)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    decode_on(case, max_len, out=out, workspace=ws, plan=plan)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


@pytest.mark.parametrize("tier", ("one_pass", "partitioned"))
def test_transient_memory_at_100k_within_budget(tier: str) -> None:
    """Issue 2: one step at 100K (24/4 heads, head 256, fp16) <= 1.25x its gathered K+V,
    counting the workspace it creates (a fresh workspace). A hidden copy of K or V inside a
    bmm (strides cuBLAS cannot take) would show up here as +0.5x."""
    ov: dict = {}  # DecodeOverrides fields for this test's plans
    ov["tier"] = tier
    case = make_paged_case((100_000,), 24, 4, 256, 16, torch.float16, DEV, seed=1)
    gathered_kv = 2 * 4 * 100_000 * 256 * 2
    peak = _transient_peak(case, Workspace(), **ov)
    assert peak <= 1.25 * gathered_kv, f"{peak / 1e6:.0f} MB vs K+V {gathered_kv / 1e6:.0f} MB"


def test_streaming_bounds_transient_memory(clean_decode_env) -> None:
    ov: dict = {}  # DecodeOverrides fields for this test's plans
    ov["stream_tokens"] = 8192
    peaks = []
    for length in (32_768, 100_000):
        case = make_paged_case((length,), 24, 4, 256, 16, torch.float16, DEV, seed=2)
        peaks.append(_transient_peak(case, Workspace(), **ov))
        assert_close(run_decode(case, **ov), reference(case), torch.float16)
        del case
    kv_chunk = 2 * 4 * 8192 * 256 * 2
    assert max(peaks) <= 1.5 * kv_chunk, peaks
    assert abs(peaks[1] - peaks[0]) <= 0.05 * kv_chunk, peaks
