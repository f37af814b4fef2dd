"""plan_prefill: tiles within the transient budget, backend choice and its reasons, streaming."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from plan_helpers import prefill_plan

from attn_core import KernelStep, PrefillPlan, get_device_spec
from attn_core.prefill.plan import BACKEND_ENV

SHAPES = ((24, 4, 256), (16, 2, 256), (32, 8, 128), (8, 1, 80))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("chunk", (1, 17, 2048, 8192, 65536))
@pytest.mark.parametrize("budget", (64 << 20, 1 << 30))
def test_workspace_fits_budget_for_any_chunk(shape, chunk, budget) -> None:
    heads, kvh, hs = shape
    plan = prefill_plan(heads, kvh, hs, torch.float16, chunk, budget_bytes=budget)
    assert plan.workspace_bytes <= budget
    assert plan.query_tile >= 1 and plan.key_tile >= 1
    assert plan.query_tile <= max(1, 1 << (chunk - 1).bit_length())


def test_qwen_shape_tiles_on_device() -> None:
    """The bench's shape: 2-byte scores, the 4096-key tile, the largest query tile that fits."""
    plan = prefill_plan(24, 4, 256, torch.float16, 8192, device=torch.device("meta"))
    assert plan.score_dtype == torch.float16 and plan.key_tile == 4096
    assert plan.workspace_bytes <= 1 << 30
    bigger = dataclasses.replace(plan, query_tile=plan.query_tile * 2)
    assert (
        prefill_plan(
            24,
            4,
            256,
            torch.float16,
            8192,
            device=torch.device("meta"),
            query_tile=bigger.query_tile,
            key_tile=4096,
        ).workspace_bytes
        > 1 << 30
    )


def test_budget_override() -> None:
    plan = prefill_plan(24, 4, 256, torch.float16, 8192, budget_bytes=32 << 20)
    assert plan.budget_bytes == 32 << 20 and plan.workspace_bytes <= 32 << 20
    with pytest.raises(ValueError, match="PrefillOverrides.budget_bytes must be None or an int"):
        prefill_plan(24, 4, 256, torch.float16, 8192, budget_bytes=0)


def test_cpu_plans_torch_backend_with_reason() -> None:
    plan = prefill_plan(8, 2, 64, torch.float16, 100)
    assert plan.backend == "torch" and "cpu" in plan.backend_reason
    assert plan.score_dtype == torch.float32  # CPU: fp32 matmuls are the fast ones
    alibi = prefill_plan(8, 2, 64, torch.float16, 100, alibi=True)
    assert alibi.backend == "torch" and "alibi" in alibi.backend_reason
    window = prefill_plan(8, 2, 64, torch.float16, 100, sliding_window=64)
    assert window.backend == "torch" and "sliding_window" in window.backend_reason


def test_fused_backend_from_capabilities() -> None:
    plan = prefill_plan(8, 2, 64, torch.float16, 100, device="cuda", fused=("vendor_flash",))
    assert plan.backend == "vendor_flash" and plan.key_tile == 0
    alibi = prefill_plan(8, 2, 64, torch.float16, 100, device="cuda", fused=("sdpa",), alibi=True)
    assert alibi.backend == "torch"


def test_forced_backends() -> None:
    plan = prefill_plan(8, 2, 64, torch.float16, 100, backend="sdpa")
    assert plan.backend == "sdpa" and BACKEND_ENV in plan.backend_reason
    assert plan.key_tile == 0  # the fused kernel tiles keys itself
    with pytest.raises(ValueError, match="supports neither alibi nor sliding_window"):
        prefill_plan(8, 2, 64, torch.float16, 100, alibi=True, backend="sdpa")
    with pytest.raises(ValueError, match="PrefillOverrides.backend must be None or one of"):
        prefill_plan(8, 2, 64, torch.float16, 100, backend="triton")


def test_forced_fused_backend_that_cannot_run_raises() -> None:
    """Forcing a fused backend where it is unavailable fails loudly, never falls back."""
    from prefill_helpers import run_prefill

    from attn_core.reference import make_prefill_case

    case = make_prefill_case(((10, 5),), 4, 2, 64, 16, torch.float16)
    for name in ("sdpa", "vendor_flash"):
        plan = prefill_plan(4, 2, 64, torch.float16, case.max_query_len, backend=name)
        with pytest.raises(ValueError, match=f"'{name}' is not available"):
            run_prefill(case, plan=plan)


def test_streaming_decision() -> None:
    per_token = 2 * 4 * 256 * 2  # K and V, 4 KV heads, head 256, fp16
    small = prefill_plan(24, 4, 256, torch.float16, 2048, max_context_len=100_000)
    assert small.stream_chunk == 0  # 100K context = 400 MB gathered: within 1 GiB
    huge = prefill_plan(24, 4, 256, torch.float16, 2048, max_context_len=1_000_000)
    assert huge.stream_chunk > 0 and huge.stream_chunk * per_token <= huge.budget_bytes
    assert huge.stream_chunk % huge.key_tile == 0
    on = prefill_plan(24, 4, 256, torch.float16, 2048, max_context_len=10, stream=True)
    assert on.stream_chunk > 0
    off = prefill_plan(24, 4, 256, torch.float16, 16, max_context_len=10**7, stream=False)
    assert off.stream_chunk == 0


# (query dtype, GEMM writes fp32, forced score dtype) -> (matmul, score, pv) at a scale > 1
F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
LARGE_SCALE_DTYPES = [
    ((F16, True, None), (F16, F32, F32)),  # fp32 scores straight from the 2-byte GEMM
    ((F16, False, None), (F32, F32, F32)),  # no fp32 GEMM output (BI-V100's torch 2.1)
    ((BF16, True, None), (BF16, F32, F32)),  # already fp32 scores: unchanged
    ((BF16, False, None), (F32, F32, F32)),
    ((F16, True, F16), (F16, F32, F32)),  # a forced 2-byte score tile would overflow too
    ((F16, False, F16), (F32, F32, F32)),
]


@pytest.mark.parametrize("inputs, want", LARGE_SCALE_DTYPES, ids=str)
def test_large_scale_plans_fp32_scores(inputs, want) -> None:
    """Issue 18's rule is the planner's: a scale > 1 scores in fp32 on the torch plan, and the
    tiles are sized for those scores (the plan records what runs)."""
    dtype, gemm_fp32, forced = inputs
    kw = dict(device="cuda", bmm_writes_fp32=gemm_fp32, score_dtype=forced, backend="torch")
    small = prefill_plan(24, 4, 256, dtype, 8192, **kw)
    large = prefill_plan(24, 4, 256, dtype, 8192, large_scale=True, **kw)
    assert (large.matmul_dtype, large.score_dtype, large.pv_dtype) == want
    assert large.workspace_bytes <= large.budget_bytes
    if small.score_dtype != F32:
        assert small.score_dtype == (forced or dtype)  # scale <= 1 keeps the 2-byte tile
        assert large.query_tile <= small.query_tile
        tiles = dict(query_tile=small.query_tile, key_tile=small.key_tile)
        same_tiles = prefill_plan(24, 4, 256, dtype, 8192, large_scale=True, **kw, **tiles)
        assert same_tiles.workspace_bytes > small.workspace_bytes  # sized for 4-byte scores
    else:
        assert large == small


def test_large_scale_leaves_fused_plans_alone() -> None:
    """The fused kernels apply the scale in fp32 already: the same plan either way."""
    kw = dict(device="cuda", fused=("sdpa",), bmm_writes_fp32=True)
    small = prefill_plan(24, 4, 256, torch.float16, 8192, **kw)
    assert small.backend == "sdpa"
    assert prefill_plan(24, 4, 256, torch.float16, 8192, large_scale=True, **kw) == small


def test_steps_describe_one_tile_update() -> None:
    spec = get_device_spec("bi-v100")
    plan = prefill_plan(
        24, 4, 256, torch.float16, 2048, device_spec=spec, query_tile=512, key_tile=1024
    )
    assert plan.device_name == "bi-v100"
    assert all(isinstance(s, KernelStep) for s in plan.steps)
    qk = next(s for s in plan.steps if s.name == "prefill_qk")
    assert qk.grid == (6 * 512 // 128, 1024 // 128, 4)
    assert all(s.threads_per_block <= spec.max_threads_per_block for s in plan.steps)
    # Causal skip: a 2048-token chunk over 1000 context tokens.
    assert plan.num_tile_updates(2048, 1000) == 4 * 1 + (1 + 1 + 2 + 2)


def test_plan_is_frozen() -> None:
    plan = prefill_plan(8, 2, 64, torch.float16, 100)
    assert isinstance(plan, PrefillPlan)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.query_tile = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_heads": 6, "num_kv_heads": 4}, "num_heads must be a multiple of num_kv_heads"),
        ({"head_size": 100}, "head_size must be one of"),
        ({"dtype": torch.int8}, "dtype must be one of"),
        ({"max_query_len": 0}, "max_query_len must be a positive int"),
        ({"budget_bytes": 0}, r"budget_bytes must be None or an int in \[1, 1125899906842624\]"),
    ],
)
def test_bad_arguments(kwargs, match) -> None:
    args = {
        "num_heads": 8,
        "num_kv_heads": 2,
        "head_size": 64,
        "dtype": torch.float16,
        "max_query_len": 10,
    }
    budget = kwargs.pop("budget_bytes", None)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        prefill_plan(**args, budget_bytes=budget)
