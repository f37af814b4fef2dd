"""The CPU side of bench/occupancy_check.py (the GPU side runs on the H200).

A fake CuPy stands in for the device: properties as CuPy returns them (``name`` NUL-padded
bytes, ``uuid`` raw bytes starting 0xe5 as on GPU run 1's H200), kernels whose attributes and
driver answers come from a table, and failures injected where the real ones could happen.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest

from attn_core.device.spec import get_device_spec
from attn_sim.occupancy import blocks_per_sm

SCRIPT = Path(__file__).resolve().parents[3] / "bench" / "occupancy_check.py"
H200 = get_device_spec("h200")
H200_PROPS = {
    "name": b"NVIDIA H200" + b"\0" * 245,
    "uuid": bytes.fromhex("e5a1c3ff00112233445566778899aabb"),  # not UTF-8: run 1's crash
    "luid": b"\0" * 8,
    "multiProcessorCount": 132,
    "warpSize": 32,
    "maxThreadsPerMultiProcessor": 2048,
    "maxThreadsPerBlock": 1024,
    "regsPerMultiprocessor": 65536,
    "regsPerBlock": 65536,
    "sharedMemPerMultiprocessor": 233472,
    "sharedMemPerBlock": 49152,
    "sharedMemPerBlockOptin": 232448,
    "reservedSharedMemPerBlock": 1024,
    "maxBlocksPerMultiProcessor": 32,
}


def load():
    spec = importlib.util.spec_from_file_location("occupancy_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def h200_sim(threads, regs, smem, opt_in):
    profile = H200.with_overrides(shared_mem_per_block=232448) if opt_in else H200
    occ = blocks_per_sm(profile, threads, regs, smem)
    return occ.blocks_per_sm, occ.limiter


def fake_cupy(props, *, regs=64, broken_source=None, driver_fails_at=None, wrong=0):
    """A CuPy whose driver answers with attn_sim's own rule (``wrong`` added at 256 threads)."""

    class Kernel:
        def __init__(self, source, name, options=()):
            if broken_source and broken_source in source:
                raise RuntimeError("NVRTC_ERROR_COMPILATION")
            static = int(source.split("STATIC_FLOATS ")[1].split("\n")[0]) * 4
            self.attributes = {
                "num_regs": regs,
                "shared_size_bytes": static,
                "max_threads_per_block": 1024,
            }
            self.max_dynamic_shared_size_bytes = 0
            self.kernel = types.SimpleNamespace(ptr=self)

    def occupancy(kern, threads, dynamic):
        if driver_fails_at == threads:
            raise RuntimeError("CUDA_ERROR_INVALID_VALUE")
        smem = kern.attributes["shared_size_bytes"] + dynamic
        blocks, _ = h200_sim(threads, regs, smem, smem > 49152)
        return blocks + (wrong if threads == 256 else 0)

    def get_props(device_id):
        if isinstance(props, Exception):
            raise props
        return props

    runtime = types.SimpleNamespace(getDeviceProperties=get_props)
    driver = types.SimpleNamespace(occupancyMaxActiveBlocksPerMultiprocessor=occupancy)
    cuda = types.SimpleNamespace(
        Device=lambda: types.SimpleNamespace(id=0), runtime=runtime, driver=driver
    )
    return types.SimpleNamespace(cuda=cuda, RawKernel=Kernel)


@pytest.fixture
def script(monkeypatch):
    mod = load()
    monkeypatch.setattr(mod, "ACCUMULATORS", (4,))
    monkeypatch.setattr(mod, "MAX_REGS", (None,))
    monkeypatch.setattr(mod, "STATIC_FLOATS", (0, 11264))
    monkeypatch.setattr(mod, "THREADS", (128, 256))
    return mod


def run_main(mod, monkeypatch, tmp_path, cupy):
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    code = mod.main(["--out", str(tmp_path)])
    return code, json.loads((tmp_path / "occupancy_check.json").read_text())


def test_compare_rows_flags_disagreement_and_skips_failed_rows():
    mod = load()
    rows = [
        {"threads": 256, "regs": 64, "static": 0, "dynamic": 0, "opt_in": False, "driver": 4},
        {"threads": 256, "regs": 64, "static": 0, "dynamic": 0, "opt_in": False, "driver": 5},
        {"threads": 256, "regs": 64, "static": 0, "dynamic": 0, "opt_in": False, "driver": None},
    ]
    out = mod.compare_rows(rows, h200_sim)
    assert [r["match"] for r in out] == [True, False, None]
    assert out[0]["limiter"] == "registers"


def test_property_values_never_raise():
    mod = load()
    assert mod.property_value(b"NVIDIA H200\0\0\0") == "NVIDIA H200"
    assert mod.property_value(H200_PROPS["uuid"]) == "e5a1c3ff00112233445566778899aabb"
    assert mod.property_value(b"ab\0cd") == "61620063" + "64"  # a NUL inside: binary
    assert mod.property_value(b"\x01\x02") == "0102"  # decodes, but not text
    assert mod.property_value({"x": [b"\xff", 3]}) == {"x": ["ff", 3]}
    assert mod.property_value(7) == 7


def test_kernel_source_and_profile_check():
    mod = load()
    src = mod.kernel_source(24, 1024)
    assert "#define NACC 24" in src and "#define STATIC_FLOATS 1024" in src
    props = {"multiProcessorCount": 132, "warpSize": 32, "sharedMemPerMultiprocessor": 233472}
    checked = {r["constant"]: r["match"] for r in mod.profile_check(H200, props)}
    assert checked["sm_count"] and checked["warp_size"] and checked["shared_mem_per_sm"]
    assert checked["l2_bytes"] is None  # not reported by the device: not compared
    props["multiProcessorCount"] = 114  # an H100 PCIe would not match the profile
    props["warpSize"] = "n/a"  # unreadable: not compared, not a crash
    checked = {r["constant"]: r["match"] for r in mod.profile_check(H200, props)}
    assert checked["sm_count"] is False and checked["warp_size"] is None


def test_main_compares_despite_binary_properties(script, monkeypatch, tmp_path):
    code, out = run_main(script, monkeypatch, tmp_path, fake_cupy(dict(H200_PROPS)))
    s = out["summary"]
    # 2 kernels x 2 thread counts x 7 dynamic sizes, minus the ones past the opt-in maximum
    assert code == 0 and s["mismatches"] == 0 and s["compared"] == s["matches"] > 20
    assert any(r["opt_in"] for r in out["rows"])
    assert out["device"] == "NVIDIA H200" and out["properties"]["uuid"].startswith("e5a1")
    assert not s["constant_mismatches"] and not out["errors"]


def test_main_reports_a_mismatch(script, monkeypatch, tmp_path):
    code, out = run_main(script, monkeypatch, tmp_path, fake_cupy(dict(H200_PROPS), wrong=1))
    assert code == 1
    assert {r["threads"] for r in out["rows"] if r["match"] is False} == {256}


def test_failures_are_recorded_not_fatal(script, monkeypatch, tmp_path):
    cupy = fake_cupy(dict(H200_PROPS), broken_source="STATIC_FLOATS 11264", driver_fails_at=128)
    code, out = run_main(script, monkeypatch, tmp_path, cupy)
    assert code == 0  # the 256-thread rows of the kernel that compiled still compare
    assert [e["where"] for e in out["errors"]] == ["kernel acc4/s11264"]
    failed = [r for r in out["rows"] if r.get("error")]
    assert failed and all(r["threads"] == 128 and r["match"] is None for r in failed)
    assert out["summary"]["compared"] > 0


def test_no_properties_at_all_still_compares(script, monkeypatch, tmp_path):
    code, out = run_main(script, monkeypatch, tmp_path, fake_cupy(RuntimeError("no device")))
    assert code == 0 and out["summary"]["compared"] > 0
    assert out["errors"][0]["where"] == "getDeviceProperties"
    assert all(c["match"] is None for c in out["constants"])


def test_nothing_compared_exits_2(script, monkeypatch, tmp_path):
    cupy = fake_cupy(dict(H200_PROPS), broken_source="probe")
    code, out = run_main(script, monkeypatch, tmp_path, cupy)
    assert code == 2 and out["summary"]["compared"] == 0
