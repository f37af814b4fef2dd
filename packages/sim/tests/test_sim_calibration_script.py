"""The CPU side of bench/sim_calibration.py: its records feed calibrate, failures are recorded.

The GPU timing itself runs on the H200; here ``measure_case`` is replaced by times the cost
model predicts from known constants, so the whole flow (records -> JSON -> fit -> verdicts) runs.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from attn_sim import calibrate
from attn_sim.profiles import load_profile
from attn_sim.workloads import Case

SCRIPT = Path(__file__).resolve().parents[3] / "bench" / "sim_calibration.py"
H200 = load_profile("h200")
TRUE = {
    "hbm_bandwidth": 3.0e12,
    "fp16_flops": 600e12,
    "fp32_flops": 50e12,
    "launch_gap_s": 2.5e-6,
    "launch_overhead_s": 28e-6,
}


@pytest.fixture
def script(monkeypatch):
    spec = importlib.util.spec_from_file_location("sim_calibration", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "QUICK_CONTEXTS", (1024, 4096, 16384))
    monkeypatch.setattr(mod, "QUICK_BATCHES", (1, 4))
    return mod


def modelled(num_seqs, context, device, iters):
    """What the H200 would measure if the cost model were exact with TRUE constants."""
    launches = calibrate.launches_of(H200, Case("decode", num_seqs, context))
    rec = {
        "eager_s": calibrate.predict(launches, TRUE, "eager"),
        "graph_s": calibrate.predict(launches, TRUE, "graph"),
        "device_launches": len(launches),
    }
    if (num_seqs, context) == (4, 1024):
        rec.update(graph_s=None, graph_error="RuntimeError: operation not permitted")
    if (num_seqs, context) == (4, 4096):
        raise RuntimeError("CUDA error: out of memory")
    return rec


def test_records_hold_both_times_failures_and_skips(script, monkeypatch):
    monkeypatch.setattr(script, "measure_case", modelled)
    import torch

    records = script.measure(torch.device("cpu"), quick=True, budget_s=1e9)
    by_case = {(r["case"]["num_seqs"], r["case"]["context"]): r for r in records}
    assert len(records) == 6
    assert by_case[(4, 1024)]["graph_error"].startswith("RuntimeError")
    assert by_case[(4, 4096)]["skipped"].startswith("failed: RuntimeError")
    assert by_case[(1, 1024)]["graph_s"] < by_case[(1, 1024)]["eager_s"]
    timings = calibrate.parse_timings({"records": records})
    assert len(timings) == 5  # the failed case is out, the capture failure keeps its eager time
    assert [t.graph_s is None for t in timings].count(True) == 1


def test_time_budget_skips_the_rest(script, monkeypatch):
    monkeypatch.setattr(script, "measure_case", modelled)
    import torch

    records = script.measure(torch.device("cpu"), quick=True, budget_s=-1.0)
    assert all(r["skipped"].startswith("time budget") for r in records)


def test_main_calibrates_on_both_times(script, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(script, "measure_case", modelled)
    assert script.main(["--quick", "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "eager: validation half" in text and "graph: validation half" in text
    assert "1 graph captures failed" not in text  # --quick: expected on a CPU, not reported
    saved = json.loads((tmp_path / "calibration.json").read_text())
    s = saved["summary"]
    assert s["validate_graph_calibrated_err_pct_max"] < 5  # exact model: only the fit's slack
    assert s["validate_eager_calibrated_err_pct_max"] < 5
    assert saved["fields"]["launch_overhead_s"] == pytest.approx(28e-6, rel=0.1)
