"""The resolver's native prefill step with a fake library and verifier (no GPU): loads only
variants that could win, verifies once through the registry, never during capture; a forced
native that cannot run is an error naming why."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attn_core import AttentionShape, NativePrefillPlan, PrefillLengths, get_device_spec
from attn_core.core import verify_once
from attn_core.core.settings import PrefillOverrides
from attn_core.device.capabilities import Capabilities
from attn_core.native import loader
from attn_core.native import prefill as native_prefill
from attn_core.native.loader import NativeStatus
from attn_core.native.prefill import PrefillLibrary
from attn_core.prefill.plan import plan_prefill
from attn_core.reference import make_prefill_case
from attn_core.runtime import resolve
from attn_core.runtime.prefill import paged_prefix_prefill

QWEN = AttentionShape(24, 4, 256, 16, torch.float16)
SLOW_HBM = get_device_spec("h200").with_overrides(name="slow-hbm", hbm_bandwidth=0.3e12)
# HBM fast enough that the torch path's elementwise traffic is free: its GEMMs (0.75 of the
# matrix rate) then beat the native tile (0.177; on the real H200 native is priced below torch)
FAST_HBM = get_device_spec("h200").with_overrides(name="fast-hbm", hbm_bandwidth=100e12)
CUDA = torch.device("cuda", 0)
LENGTHS = PrefillLengths(8192, 100_000)


class FakeLib:
    VERIFY_KIND = PrefillLibrary.VERIFY_KIND
    verify_config = PrefillLibrary.verify_config

    def __init__(self, mma: str) -> None:
        self.mma = mma
        self.path = Path(f"/fake/libattn_prefill_{mma}.so")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch):
    """Fake loader and check; records what was loaded and checked."""
    seen = {"loaded": [], "checked": [], "ok": True, "capturing": False}

    def load(cls, mma, settings, device, **kw):
        assert cls is PrefillLibrary
        seen["loaded"].append(mma)
        return FakeLib(mma), NativeStatus(True, f"fake {mma}")

    def check(device, config, lib):
        seen["checked"].append(config)
        return verify_once.Verdict(seen["ok"], "fake check")

    monkeypatch.setattr(loader, "load_library", load)
    monkeypatch.setattr(verify_once, "is_capturing", lambda device: seen["capturing"])
    verify_once.register(PrefillLibrary.VERIFY_KIND, check)
    verify_once.forget(PrefillLibrary.VERIFY_KIND)
    yield seen
    verify_once.forget(PrefillLibrary.VERIFY_KIND)
    verify_once.register(PrefillLibrary.VERIFY_KIND, native_prefill._check)


def native_caps(spec, overrides=None, lengths=LENGTHS):
    base = Capabilities(device_type="cuda", bmm_writes_fp32=True)
    o = overrides if overrides is not None else PrefillOverrides()
    return resolve.native_prefill_caps(base, QWEN, lengths, spec, o, CUDA)


def test_verified_cheapest_variant_is_loaded_once_and_others_not(fake) -> None:
    caps, libs = native_caps(SLOW_HBM)
    assert caps.native_prefill == ("wmma",) and isinstance(libs["wmma"], FakeLib)
    assert fake["loaded"] == ["wmma"]  # the cheapest verified one ends the search
    native_caps(SLOW_HBM)
    assert len(fake["checked"]) == 1  # the verdict is kept per (device, config)
    assert fake["checked"][0] == ("libattn_prefill_wmma.so", torch.float16, "auto", 256, 16, 6)


def test_variants_priced_above_the_torch_path_are_not_loaded(fake) -> None:
    caps, libs = native_caps(FAST_HBM)
    assert caps.native_prefill == () and fake["loaded"] == []
    assert "wmma priced above torch, not loaded" in caps.native_prefill_why


def test_unverified_takes_torch_with_the_reason(fake) -> None:
    fake["ok"] = False
    caps, _ = native_caps(SLOW_HBM)
    assert caps.native_prefill == ()
    why = "wmma not verified: it did not match the float64 reference (fake check)"
    assert why in caps.native_prefill_why
    p = plan_prefill(QWEN, LENGTHS, SLOW_HBM, caps)
    assert p.backend == "torch" and "wmma not verified" in p.backend_reason


def test_no_verification_during_capture(fake) -> None:
    fake["capturing"] = True
    caps, _ = native_caps(SLOW_HBM)
    assert fake["checked"] == [] and caps.native_prefill == ()
    assert "CUDA graph is being captured" in caps.native_prefill_why
    fake["capturing"] = False  # the capture's answer was not kept: the next call checks
    caps, _ = native_caps(SLOW_HBM)
    assert caps.native_prefill == ("wmma",) and len(fake["checked"]) == 1


def test_forced_native_tries_every_variant_until_one_verifies(fake) -> None:
    fake["ok"] = False
    caps, _ = native_caps(get_device_spec("h200"), PrefillOverrides(backend="native"))
    assert sorted(fake["loaded"]) == ["corex_wmma", "fma", "wmma"]
    assert caps.native_prefill == ()


def test_another_forced_backend_loads_nothing(fake) -> None:
    native_caps(SLOW_HBM, PrefillOverrides(backend="torch"))
    assert fake["loaded"] == []


def test_resolved_native_plan_carries_its_library(fake, monkeypatch) -> None:
    monkeypatch.setattr(
        resolve, "probe_capabilities", lambda d, dt: Capabilities(device_type="cuda")
    )
    p = resolve.prefill_plan_for(QWEN, LENGTHS, CUDA, SLOW_HBM, backend="native")
    assert isinstance(p, NativePrefillPlan) and isinstance(p.library, FakeLib)
    assert p.library.mma == p.variant == "wmma"


def test_forced_native_without_a_gpu_names_why() -> None:
    """On this CPU machine the real readiness answers; the forced backend raises with it."""
    case = make_prefill_case([(5, 3)], 4, 2, 64, 16, torch.float16, "cpu")
    with pytest.raises(ValueError, match=r"'native'.*no MMA variant.*needs a CUDA device, got cpu"):
        paged_prefix_prefill(*case.args(), backend="native")


def test_forced_native_by_the_environment(settings_env) -> None:
    settings_env.set("ATTN_CORE_PREFILL_BACKEND", "native")
    case = make_prefill_case([(5, 3)], 4, 2, 64, 16, torch.float16, "cpu")
    with pytest.raises(ValueError, match=r"ATTN_CORE_PREFILL_BACKEND.*needs a CUDA device"):
        paged_prefix_prefill(*case.args())
    out = paged_prefix_prefill(*case.args(), backend="torch")  # the argument wins
    assert torch.isfinite(out).all()
