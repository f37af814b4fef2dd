"""Calibration recovers known constants from synthetic measurements; both file formats parse."""

from __future__ import annotations

import json

import pytest

from attn_sim import calibrate
from attn_sim.cli import main
from attn_sim.profiles import CALIBRATABLE, load_profile
from attn_sim.workloads import Case

H200 = load_profile("h200")
TRUE = {
    "hbm_bandwidth": 3.1e12,  # what a torch path achieves, not the 4.8 TB/s datasheet
    "fp16_flops": 400e12,
    "fp32_flops": 40e12,
    "launch_overhead_s": 7e-6,
}
CASES = [Case("decode", b, c) for b in (1, 4, 16) for c in (1024, 4096, 16384)]


def synthetic():
    """Times from TRUE constants with +-4 % deterministic scatter."""
    out = []
    for i, case in enumerate(CASES):
        t = calibrate.predict(calibrate.launches_of(H200, case), TRUE)
        out.append((case, t * (1.04 if i % 3 == 0 else 0.97 if i % 3 == 1 else 1.0)))
    return out


@pytest.fixture(scope="module")
def fitted():
    return calibrate.calibrate(H200, synthetic(), "synthetic")


def test_fit_recovers_bandwidth_and_launch_overhead(fitted):
    spec, rows, prov = fitted
    assert spec.hbm_bandwidth == pytest.approx(TRUE["hbm_bandwidth"], rel=0.2)
    assert spec.launch_overhead_s == pytest.approx(TRUE["launch_overhead_s"], rel=0.2)
    assert spec.name == "h200+calibrated"
    assert all("calibrated from synthetic" in prov[k] for k in CALIBRATABLE)


def test_validation_half_within_tolerance_and_better_than_uncalibrated(fitted):
    _, rows, _ = fitted
    val = [r for r in rows if r["split"] == "validate"]
    assert len(val) == len(CASES) // 2
    assert max(abs(r["calibrated_err_pct"]) for r in val) < 10
    worst_before = max(abs(r["uncalibrated_err_pct"]) for r in rows)
    assert worst_before > 25  # datasheet constants are far off a torch path


def test_parse_hil_and_bench_records():
    hil = [
        {
            "kind": "decode",
            "num_seqs": 1,
            "context_len": 32768,
            "query_len": 1,
            "num_heads": 16,
            "num_kv_heads": 2,
            "head_size": 256,
            "block_size": 16,
            "dtype": "float16",
            "median_s": 0.002,
        },
        {"kind": "decode", "context_len": 262144, "skipped": "does not fit"},
        {"kind": "prefill", "context_len": 32768, "query_len": 2048, "median_s": 0.05},
    ]
    bench = {  # bench/decode_bench.py's shape: the model shape once, variants per row
        "shape": {"heads": 16, "kv_heads": 2, "head_size": 256, "block_size": 16},
        "rows": [
            {"variant": "attn_core plan", "batch": 8, "context": 8192, "ms": 1.5},
            {"variant": "attn_core ps=256", "batch": 8, "context": 8192, "ms": 1.7},
            {"variant": "repeat_interleave", "batch": 8, "context": 8192, "ms": 9.0},
            {"case": {"path": "decode", "num_seqs": 2, "context": 1000}, "measured_s": 1e-3},
        ],
    }
    (c1, t1), (c2, t2) = calibrate.parse_measurements(hil)
    assert (c1.shape.num_heads, c1.shape.num_kv_heads, c1.context, t1) == (16, 2, 32768, 0.002)
    assert (c2.path, c2.context, c2.query_len, t2) == ("prefill", 32768 + 2048, 2048, 0.05)
    parsed = calibrate.parse_measurements(bench)
    assert [(c.num_seqs, c.context, t) for c, t in parsed] == [(2, 1000, 1e-3), (8, 8192, 1.5e-3)]
    assert all(c.shape.num_heads == 16 and c.shape.num_kv_heads == 2 for c, _ in parsed)
    forced = calibrate.parse_measurements(bench, variant="attn_core ps=256")
    assert [(c.num_seqs, t) for c, t in forced] == [(2, 1e-3), (8, 1.7e-3)]


def test_too_few_cases_is_an_error():
    with pytest.raises(ValueError, match="measurements"):
        calibrate.calibrate(H200, synthetic()[:1], "x")


def test_cli_writes_a_profile_that_loads(tmp_path):
    records = [
        {"case": {"path": c.path, "num_seqs": c.num_seqs, "context": c.context}, "measured_s": t}
        for c, t in synthetic()[:4]
    ]
    src = tmp_path / "m.json"
    src.write_text(json.dumps(records))
    assert main(["calibrate", str(src), "--profile", "h200", "--out", str(tmp_path)]) == 0
    spec = load_profile(str(tmp_path / "calibrated_profile.json"))
    assert spec.name == "h200+calibrated" and spec.sm_count == H200.sm_count
    assert spec.hbm_bandwidth != H200.hbm_bandwidth
    assert "calibrated" in spec.provenance["hbm_bandwidth"]


def test_calibration_model_is_the_cost_model():
    from attn_sim.cost import step_cost
    from attn_sim.workloads import trace_case

    case = Case("decode", 4, 8192)
    record, _ = trace_case(H200, case)
    constants = {k: getattr(H200, k) for k in CALIBRATABLE}
    predicted = calibrate.predict(calibrate.launches_of(H200, case), constants)
    assert predicted == pytest.approx(step_cost(H200, record).time_s, rel=1e-9)
