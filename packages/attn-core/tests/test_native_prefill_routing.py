"""The native prefill through attn-core's entry point, on the GPU: paged_prefix_prefill with
backend="native" (each MMA variant forced by ATTN_CORE_PREFILL_MMA) against the float64
reference; the resolver's plan carries a verified library; a split plan's partials come from
the workspace and stay within the plan's bytes; a caller's pure plan gets its library.
CPU-only machines skip these with the reason."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import assert_close, requires_cuda, skip_without_float8
from native_prefill_helpers import MMAS, cuda_prefill_case, prefill_library, reference

from attn_core import AttentionShape, NativePrefillPlan, PrefillLengths, paged_prefix_prefill
from attn_core.core import verify_once
from attn_core.core.settings import PrefillOverrides
from attn_core.core.workspace import Workspace
from attn_core.device.capabilities import Capabilities
from attn_core.device.detect import detect_device_spec
from attn_core.native.prefill import PrefillLibrary
from attn_core.prefill.plan import plan_prefill
from attn_core.runtime.prefill import prefill_plan_for

pytestmark = [pytest.mark.cuda, requires_cuda]

SEQS = [(0, 1), (1, 15), (15, 16), (16, 17), (37, 20), (0, 21), (2000, 19)]


def run(case, **kw) -> torch.Tensor:
    out = torch.full_like(case.query, math.nan)
    return paged_prefix_prefill(*case.args(), **case.kwargs(), out=out, **kw)


@pytest.mark.parametrize("mma", MMAS)
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=str)
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_size"), ((24, 4, 256), (8, 8, 128), (16, 1, 64))
)
def test_backend_native_matches_the_reference(settings_env, mma, dtype, heads, kv_heads, head_size):
    prefill_library(mma)  # skips with the reason where this variant does not build
    settings_env.set("ATTN_CORE_PREFILL_MMA", mma)
    case = cuda_prefill_case(SEQS, heads, kv_heads, head_size, 16, dtype, seed=head_size)
    assert_close(run(case, backend="native"), reference(case), dtype)
    shape = AttentionShape(heads, kv_heads, head_size, 16, dtype)
    plan = prefill_plan_for(shape, PrefillLengths(21, 2000, num_seqs=7, num_tokens=109),
                            case.query.device, backend="native")  # fmt: skip
    assert isinstance(plan, NativePrefillPlan) and plan.variant == mma
    assert plan.library is not None and plan.library.mma == mma
    config = (plan.library.path.name, dtype, "auto", head_size, 16, heads // kv_heads)
    assert verify_once.kept(PrefillLibrary.VERIFY_KIND, case.query.device, config).ok


@pytest.mark.parametrize("mma", MMAS)
@pytest.mark.parametrize("feature", ("alibi", "window", "fp8_e4m3", "fp8_e5m2"))
def test_features_through_the_entry_point(settings_env, mma, feature):
    prefill_library(mma)
    settings_env.set("ATTN_CORE_PREFILL_MMA", mma)
    fp8 = feature.startswith("fp8")
    if fp8:
        skip_without_float8()
    case = cuda_prefill_case(
        SEQS, 8, 2, 128, 16, torch.float16, alibi=feature == "alibi",
        sliding_window=300 if feature == "window" else None,
        kv_cache_dtype=feature if fp8 else "auto", k_scale=0.5 if fp8 else 1.0,
        v_scale=0.25 if fp8 else 1.0,
    )  # fmt: skip
    assert_close(run(case, backend="native"), reference(case), torch.float16)


def test_split_plan_takes_its_partials_from_the_workspace(settings_env):
    """A short chunk over a long context splits the key range (H200: 132 SMs, few query
    tiles); the partials are the workspace's, at most the plan's bytes."""
    settings_env.set("ATTN_CORE_PREFILL_MMA", "wmma")
    prefill_library("wmma")
    case = cuda_prefill_case([(30_000, 40)], 24, 4, 256, 16, torch.float16)
    ws = Workspace()
    out = run(case, backend="native", workspace=ws)
    plan = prefill_plan_for(AttentionShape(24, 4, 256, 16, torch.float16),
                            PrefillLengths(40, 30_000, num_tokens=40), case.query.device,
                            backend="native")  # fmt: skip
    assert plan.num_splits > 1, plan
    assert 0 < ws.nbytes <= plan.workspace_bytes
    assert_close(out, reference(case), torch.float16)
    before = ws.allocations
    run(case, backend="native", workspace=ws)  # steady state: nothing new
    assert ws.allocations == before


def test_a_callers_pure_plan_gets_its_library():
    prefill_library("wmma")
    case = cuda_prefill_case(SEQS, 8, 2, 128, 16, torch.float16)
    shape = AttentionShape(8, 2, 128, 16, torch.float16)
    caps = Capabilities(device_type="cuda", native_prefill=("wmma",))
    spec = detect_device_spec(case.query.device, None)
    plan = plan_prefill(shape, PrefillLengths(21, 2000, num_seqs=7, num_tokens=109), spec, caps,
                        PrefillOverrides(backend="native"))  # fmt: skip
    assert isinstance(plan, NativePrefillPlan) and plan.library is None
    assert_close(run(case, plan=plan), reference(case), torch.float16)
    small = plan_prefill(
        shape, PrefillLengths(4, 10), spec, caps, PrefillOverrides(backend="native")
    )
    with pytest.raises(ValueError, match=r"plan must be made for at least this call's"):
        run(case, plan=small)
