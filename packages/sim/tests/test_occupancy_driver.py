"""attn_sim's occupancy against the CUDA driver's own answer (runs where CUDA and CuPy are)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from attn_core.device.spec import get_device_spec
from attn_sim.occupancy import blocks_per_sm

cupy = pytest.importorskip("cupy", reason="needs CuPy (the driver comparison runs on a GPU)")
SCRIPT = Path(__file__).resolve().parents[3] / "bench" / "occupancy_check.py"


@pytest.mark.cuda
def test_blocks_per_sm_matches_the_driver(monkeypatch):
    try:
        name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    except Exception as err:  # no device or no driver: nothing to compare
        pytest.skip(f"no CUDA device: {err}")
    name = name.decode() if isinstance(name, bytes) else name
    if "H200" not in name and "H100" not in name:
        pytest.skip(f"the h200 profile describes H100/H200, this is {name}")
    spec = importlib.util.spec_from_file_location("occupancy_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "ACCUMULATORS", (4, 96))  # a register-light and a heavy kernel
    monkeypatch.setattr(mod, "MAX_REGS", (None, 64))
    monkeypatch.setattr(mod, "STATIC_FLOATS", (0, 5000))
    h200 = get_device_spec("h200")

    def sim(threads, regs, smem, opt_in):
        profile = h200.with_overrides(shared_mem_per_block=227 * 1024) if opt_in else h200
        occ = blocks_per_sm(profile, threads, regs, smem)
        return occ.blocks_per_sm, occ.limiter

    rows = mod.compare_rows(mod.measure(cupy), sim)
    bad = [r for r in rows if not r["match"]]
    assert rows and not bad, bad[:5]
