"""Sweeps: the best candidate fits and is the fastest that fits."""

from __future__ import annotations

from attn_sim import sweep
from attn_sim.profiles import load_profile
from attn_sim.workloads import Case

BI = load_profile("bi-v100")


def test_design_sweep_rules_out_what_overflows():
    rows = sweep.sweep_design(BI)
    assert all(not r["fits"] for r in rows if r["tile_tokens"] == 32)  # 36 KB > 32 KiB
    (best,) = [r for r in rows if r["best"]]
    assert best["fits"]
    assert best["time_us"] == min(r["time_us"] for r in rows if r["fits"])
    rows48 = sweep.sweep_design(load_profile("bi-v100-smem48k"))
    assert any(r["fits"] for r in rows48 if r["tile_tokens"] == 32)


def test_plan_sweep_defaults_are_the_reference(monkeypatch):
    monkeypatch.setattr(sweep, "CANDIDATES", {"ATTN_CORE_DECODE_PARTITION_SIZE": [None, 512, 2048]})
    rows = sweep.sweep_plan(BI, [Case("decode", 1, 8192), Case("decode", 4, 32768)])
    by_value = {r["value"]: r for r in rows}
    assert by_value["default"]["relative_time"] == 1.0
    assert sum(r["best"] for r in rows) == 1
    best = next(r for r in rows if r["best"])
    assert best["relative_time"] == min(r["relative_time"] for r in rows if r["fits"])
