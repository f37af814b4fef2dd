"""The CPU side of bench/occupancy_check.py (the GPU side runs on the H200)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from attn_core.device_spec import get_device_spec
from attn_sim.occupancy import blocks_per_sm

SCRIPT = Path(__file__).resolve().parents[3] / "bench" / "occupancy_check.py"


def load():
    spec = importlib.util.spec_from_file_location("occupancy_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_compare_rows_flags_disagreement():
    mod = load()
    h200 = get_device_spec("h200")

    def sim(threads, regs, smem, opt_in):
        occ = blocks_per_sm(h200, threads, regs, smem)
        return occ.blocks_per_sm, occ.limiter

    rows = [
        {"threads": 256, "regs": 64, "static": 0, "dynamic": 0, "opt_in": False, "driver": 4},
        {"threads": 256, "regs": 64, "static": 0, "dynamic": 0, "opt_in": False, "driver": 5},
    ]
    out = mod.compare_rows(rows, sim)
    assert [r["match"] for r in out] == [True, False]
    assert out[0]["limiter"] == "registers"


def test_kernel_source_and_profile_check():
    mod = load()
    src = mod.kernel_source(24, 1024)
    assert "#define NACC 24" in src and "#define STATIC_FLOATS 1024" in src
    h200 = get_device_spec("h200")
    props = {"multiProcessorCount": 132, "warpSize": 32, "sharedMemPerMultiprocessor": 233472}
    checked = {r["constant"]: r["match"] for r in mod.profile_check(h200, props)}
    assert checked["sm_count"] and checked["warp_size"] and checked["shared_mem_per_sm"]
    props["multiProcessorCount"] = 114  # an H100 PCIe would not match the profile
    assert not {r["constant"]: r["match"] for r in mod.profile_check(h200, props)}["sm_count"]
