"""plan_prefill: tiles within the transient budget, backend choice and its reasons, streaming."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attn_core import KernelStep, PrefillPlan, get_device_spec, plan_prefill
from attn_core.plan_prefill import BACKEND_ENV, BUDGET_ENV, STREAM_ENV

SHAPES = ((24, 4, 256), (16, 2, 256), (32, 8, 128), (8, 1, 80))


@pytest.fixture(autouse=True)
def clean_prefill_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in (BUDGET_ENV, BACKEND_ENV, STREAM_ENV, "ATTN_CORE_DEVICE"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("chunk", (1, 17, 2048, 8192, 65536))
@pytest.mark.parametrize("budget", (64 << 20, 1 << 30))
def test_workspace_fits_budget_for_any_chunk(shape, chunk, budget) -> None:
    heads, kvh, hs = shape
    plan = plan_prefill(heads, kvh, hs, torch.float16, chunk, budget_bytes=budget)
    assert plan.workspace_bytes <= budget
    assert plan.query_tile >= 1 and plan.key_tile >= 1
    assert plan.query_tile <= max(1, 1 << (chunk - 1).bit_length())


def test_qwen_shape_tiles_on_device() -> None:
    """The bench's shape: 2-byte scores, the 4096-key tile, the largest query tile that fits."""
    plan = plan_prefill(24, 4, 256, torch.float16, 8192, device=torch.device("meta"))
    assert plan.score_dtype == torch.float16 and plan.key_tile == 4096
    assert plan.workspace_bytes <= 1 << 30
    bigger = dataclasses.replace(plan, query_tile=plan.query_tile * 2)
    assert (
        plan_prefill(
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


def test_budget_from_env(clean_prefill_env) -> None:
    clean_prefill_env.setenv(BUDGET_ENV, str(32 << 20))
    plan = plan_prefill(24, 4, 256, torch.float16, 8192)
    assert plan.budget_bytes == 32 << 20 and plan.workspace_bytes <= 32 << 20
    clean_prefill_env.setenv(BUDGET_ENV, "lots")
    with pytest.raises(ValueError, match=BUDGET_ENV):
        plan_prefill(24, 4, 256, torch.float16, 8192)


def test_cpu_plans_torch_backend_with_reason() -> None:
    plan = plan_prefill(8, 2, 64, torch.float16, 100)
    assert plan.backend == "torch" and "cpu" in plan.backend_reason
    assert plan.score_dtype == torch.float32  # CPU: fp32 matmuls are the fast ones
    alibi = plan_prefill(8, 2, 64, torch.float16, 100, alibi=True)
    assert alibi.backend == "torch" and "alibi" in alibi.backend_reason
    window = plan_prefill(8, 2, 64, torch.float16, 100, sliding_window=64)
    assert window.backend == "torch" and "sliding_window" in window.backend_reason


def test_forced_backends(clean_prefill_env) -> None:
    clean_prefill_env.setenv(BACKEND_ENV, "sdpa")
    plan = plan_prefill(8, 2, 64, torch.float16, 100)
    assert plan.backend == "sdpa" and BACKEND_ENV in plan.backend_reason
    assert plan.key_tile == 0  # the fused kernel tiles keys itself
    with pytest.raises(ValueError, match="supports neither alibi nor sliding_window"):
        plan_prefill(8, 2, 64, torch.float16, 100, alibi=True)
    clean_prefill_env.setenv(BACKEND_ENV, "triton")
    with pytest.raises(ValueError, match=f"{BACKEND_ENV} must be one of"):
        plan_prefill(8, 2, 64, torch.float16, 100)


def test_forced_fused_backend_that_cannot_run_raises(clean_prefill_env) -> None:
    """Forcing a fused backend where it is unavailable fails loudly, never falls back."""
    from prefill_helpers import run_prefill

    from attn_core.prefill_case import make_prefill_case

    case = make_prefill_case(((10, 5),), 4, 2, 64, 16, torch.float16)
    clean_prefill_env.setenv(BACKEND_ENV, "sdpa")
    with pytest.raises(RuntimeError, match="'sdpa' is not available"):
        run_prefill(case)
    clean_prefill_env.setenv(BACKEND_ENV, "vendor_flash")
    with pytest.raises(RuntimeError, match="'vendor_flash' is not available"):
        run_prefill(case)


def test_streaming_decision(clean_prefill_env) -> None:
    per_token = 2 * 4 * 256 * 2  # K and V, 4 KV heads, head 256, fp16
    small = plan_prefill(24, 4, 256, torch.float16, 2048, max_context_len=100_000)
    assert small.stream_chunk == 0  # 100K context = 400 MB gathered: within 1 GiB
    huge = plan_prefill(24, 4, 256, torch.float16, 2048, max_context_len=1_000_000)
    assert huge.stream_chunk > 0 and huge.stream_chunk * per_token <= huge.budget_bytes
    assert huge.stream_chunk % huge.key_tile == 0
    clean_prefill_env.setenv(STREAM_ENV, "1")
    assert plan_prefill(24, 4, 256, torch.float16, 2048, max_context_len=10).stream_chunk > 0
    clean_prefill_env.setenv(STREAM_ENV, "0")
    assert plan_prefill(24, 4, 256, torch.float16, 16, max_context_len=10**7).stream_chunk == 0


def test_steps_describe_one_tile_update() -> None:
    spec = get_device_spec("bi-v100")
    plan = plan_prefill(
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
    plan = plan_prefill(8, 2, 64, torch.float16, 100)
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
        ({"budget_bytes": 0}, "budget_bytes must be a positive int"),
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
        plan_prefill(**args, budget_bytes=budget)
