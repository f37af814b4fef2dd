"""The fused-backend machinery: the part decomposition and log-sum-exp merge, the one-time
reference check, forcing and fallback. On the CPU a float64 stand-in plays the fused kernel; on a
CUDA device the real backends run (``-m cuda``)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import assert_close, requires_cuda
from plan_helpers import prefill_plan
from prefill_helpers import reference, run_prefill

from attn_core import (
    AttentionShape,
    Capabilities,
    PrefillLengths,
    PrefillOverrides,
    prefill_plan_for,
    probe_capabilities,
)
from attn_core.core import verify_once
from attn_core.device.iluvatar import is_iluvatar
from attn_core.prefill import backends as prefill_backends
from attn_core.prefill import verify as prefill_verify
from attn_core.prefill.backends import FusedBackend
from attn_core.reference import make_prefill_case
from attn_core.runtime.prefill import verify_prefill_backend

MIXED = ((0, 13), (37, 1), (16, 17), (95, 33), (1, 7), (64, 64))


def _math_attend(q, k, v, scale, causal, lse_shift=0.0):
    """The attend contract in float64: q [t, h, d], k/v [kvh, n, d] -> ([h, t, d], [h, t])."""
    group = q.shape[1] // k.shape[0]
    qh = q.transpose(0, 1).double()
    kh = k.double().repeat_interleave(group, 0)
    vh = v.double().repeat_interleave(group, 0)
    s = qh @ kh.transpose(1, 2) * scale
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, -1)
    return (torch.softmax(s, -1) @ vh).float(), lse.float() + lse_shift


@pytest.fixture
def fake_sdpa(monkeypatch, request):
    """Replace the sdpa backend with the float64 stand-in, available everywhere; fresh checks
    (the stand-in's verdicts are dropped again afterwards)."""
    request.addfinalizer(lambda: verify_once.forget(prefill_verify.KIND))

    def install(attend=_math_attend):
        fake = FusedBackend("sdpa", "float64 stand-in", attend)
        monkeypatch.setitem(prefill_backends.BACKENDS, "sdpa", fake)
        verify_once.forget(prefill_verify.KIND)
        monkeypatch.setattr(prefill_verify, "fused_unavailable_reason", lambda n, d, t: None)

    return install


def verified_on_cpu(dtype: torch.dtype, head_size: int) -> tuple[str, ...]:
    """The verification step above the planner, for a CPU offering the (fake) sdpa backend."""
    caps = Capabilities(device_type="cpu", fused_prefill=("sdpa",))
    cpu = torch.device("cpu")
    return prefill_verify.verified_capabilities(caps, cpu, dtype, head_size).fused_prefill


def verdicts() -> dict:
    return {
        f"{config[0]} {device}": ("ok " if v.ok else "failed ") + v.detail
        for kind, device, config, v in verify_once.verdicts()
        if kind == prefill_verify.KIND
    }


@pytest.mark.parametrize("query_tile, stream_chunk", [(64, 0), (8, 0), (8, 32), (5, 48)])
def test_parts_merge_to_the_reference(fake_sdpa, query_tile, stream_chunk) -> None:
    fake_sdpa()
    case = make_prefill_case(MIXED, 8, 2, 64, 16, torch.float32, seed=3)
    plan = prefill_plan(8, 2, 64, torch.float32, case.max_query_len, backend="sdpa")
    plan = dataclasses.replace(plan, query_tile=query_tile, stream_chunk=stream_chunk)
    assert_close(run_prefill(case, plan), reference(case), torch.float32)


def test_auto_plan_uses_a_verified_fused_backend(fake_sdpa) -> None:
    fake_sdpa()
    fused = verified_on_cpu(torch.float16, 64)
    plan = prefill_plan(8, 2, 64, torch.float16, 50, fused=fused)
    assert plan.backend == "sdpa" and "verified" in plan.backend_reason
    assert any(k.startswith("sdpa cpu") and v.startswith("ok") for k, v in verdicts().items())


def test_wrong_fused_backend_is_rejected(fake_sdpa, monkeypatch) -> None:
    """A kernel whose causal-part log-sum-exp is off (a uniform shift would cancel in the merge)
    fails the check: auto falls back to torch, forced raises."""
    fake_sdpa(lambda q, k, v, scale, causal: _math_attend(q, k, v, scale, causal, 0.7 * causal))
    assert verified_on_cpu(torch.float16, 64) == ()
    case = make_prefill_case(MIXED, 8, 2, 64, 16, torch.float16, seed=3)
    forced = prefill_plan(8, 2, 64, torch.float16, case.max_query_len, backend="sdpa")
    with pytest.raises(ValueError, match="did not match the reference"):
        run_prefill(case, forced)


def test_raising_fused_backend_is_rejected(fake_sdpa) -> None:
    def broken(*args):
        raise RuntimeError("no kernel image for this device")

    fake_sdpa(broken)
    assert verified_on_cpu(torch.float16, 64) == ()
    assert any("no kernel image" in v for v in verdicts().values())


def _cpu_flash(q, k, v, causal, scale):
    """torch's CPU flash kernel: same layouts and log-sum-exp as the CUDA op."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, causal, scale=scale
    )


@pytest.mark.skipif(
    not hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"),
    reason="this torch has no CPU flash-attention op",
)
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
@pytest.mark.parametrize("shape", ((24, 4, 256), (8, 1, 80), (8, 8, 64)), ids=str)
def test_sdpa_layouts_with_cpu_flash(fake_sdpa, monkeypatch, shape, dtype) -> None:
    """The real sdpa attend (query folding, K/V expansion, lse reshapes) on torch's CPU kernel."""
    fake_sdpa(prefill_backends._sdpa_attend)
    monkeypatch.setattr(prefill_backends, "_flash_with_lse", _cpu_flash)
    heads, kvh, hs = shape
    case = make_prefill_case(MIXED, heads, kvh, hs, 16, dtype, seed=hs)
    plan = prefill_plan(heads, kvh, hs, dtype, case.max_query_len, backend="sdpa")
    plan = dataclasses.replace(plan, query_tile=16, stream_chunk=48)
    assert_close(run_prefill(case, plan), reference(case), dtype)


# --- on a CUDA device ----------------------------------------------------------------------

CUDA_DTYPES = (torch.float16, torch.bfloat16)


@pytest.mark.cuda
@requires_cuda
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=str)
@pytest.mark.parametrize("shape", ((24, 4, 256), (16, 2, 128), (8, 1, 80), (8, 8, 64)), ids=str)
@pytest.mark.parametrize("backend", ("torch", "sdpa"))
def test_cuda_backends(backend, shape, dtype) -> None:
    heads, kvh, hs = shape
    cuda = torch.device("cuda")
    case = make_prefill_case(MIXED, heads, kvh, hs, 16, dtype, device="cuda", seed=hs)
    plan = prefill_plan_for(
        AttentionShape(heads, kvh, hs, 16, dtype),
        PrefillLengths(case.max_query_len),
        cuda,
        overrides=PrefillOverrides(backend=backend),
    )
    if backend == "sdpa":
        verify_prefill_backend("sdpa", cuda, dtype, hs)
    if backend == "torch":
        fp32_scores = dtype == torch.bfloat16 and probe_capabilities(cuda, dtype).bmm_writes_fp32
        assert plan.matmul_dtype == dtype
        assert plan.score_dtype == (torch.float32 if fp32_scores else dtype)
    got = run_prefill(case, plan)
    # Device paths round scores (torch backend) or probabilities (flash) to 2 bytes.
    torch.testing.assert_close(got.double().cpu(), reference(case), atol=2e-2, rtol=2e-2)


@pytest.mark.cuda
@requires_cuda
@pytest.mark.parametrize("window", (0, 16, 64, 2048))
@pytest.mark.parametrize("alibi", (False, True), ids=("no-alibi", "alibi"))
def test_cuda_torch_windows_alibi_fp8(window, alibi) -> None:
    seqs = ((0, 300), (1500, 257), (20, 1))
    for kv_cache_dtype in ("auto", "fp8"):
        case = make_prefill_case(
            seqs,
            24,
            4,
            256,
            16,
            torch.float16,
            device="cuda",
            alibi=alibi,
            sliding_window=window,
            kv_cache_dtype=kv_cache_dtype,
            seed=5,
        )
        got = run_prefill(case)
        torch.testing.assert_close(got.double().cpu(), reference(case), atol=2e-2, rtol=2e-2)


@pytest.mark.cuda
@requires_cuda
def test_cuda_auto_plan_on_nvidia_picks_verified_sdpa() -> None:
    cuda = torch.device("cuda")
    plan = prefill_plan_for(
        AttentionShape(24, 4, 256, 16, torch.float16),
        PrefillLengths(8192),
        cuda,
        overrides=PrefillOverrides(),
    )
    if is_iluvatar(cuda):
        pytest.skip("Iluvatar: sdpa is never chosen there")
    assert plan.backend == "sdpa", (plan.backend_reason, verdicts())
