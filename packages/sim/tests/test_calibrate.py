"""Calibration recovers known constants from synthetic measurements; every file format parses."""

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
    "launch_gap_s": 2e-6,
    "launch_overhead_s": 7e-6,
}
# GPU run 1's H200 host: ~28 us to issue a launch, so every eager batch-1 step is host-bound
HOST_BOUND = {**TRUE, "launch_overhead_s": 28e-6}
CASES = [Case("decode", b, c) for b in (1, 4, 16) for c in (1024, 4096, 16384)]
SCATTER = (1.04, 0.97, 1.0)  # deterministic +-4 %


def synthetic(true=TRUE, mode="eager"):
    """``(case, seconds)`` from ``true`` constants, with +-4 % scatter."""
    out = []
    for i, case in enumerate(CASES):
        t = calibrate.predict(calibrate.launches_of(H200, case), true, mode)
        out.append((case, t * SCATTER[i % 3]))
    return out


def synthetic_timings(true=HOST_BOUND):
    """Both kinds of time per case, scattered independently (the graph ones by 3 %)."""
    eager, graph = synthetic(true, "eager"), synthetic(true, "graph")
    return [
        calibrate.Timing(c, eager_s=e, graph_s=g * SCATTER[(i + 1) % 3] / SCATTER[i % 3])
        for i, ((c, e), (_, g)) in enumerate(zip(eager, graph, strict=True))
    ]


@pytest.fixture(scope="module")
def fitted():
    return calibrate.calibrate(H200, synthetic(), "synthetic")


@pytest.fixture(scope="module")
def fitted_both():
    return calibrate.calibrate(H200, synthetic_timings(), "synthetic")


def test_fit_recovers_bandwidth_and_launch_overhead(fitted):
    spec, rows, prov = fitted
    assert spec.hbm_bandwidth == pytest.approx(TRUE["hbm_bandwidth"], rel=0.2)
    assert spec.launch_overhead_s == pytest.approx(TRUE["launch_overhead_s"], rel=0.2)
    assert spec.name == "h200+calibrated"
    assert set(prov) == set(calibrate.EAGER_ONLY_TERMS)  # eager times only: the gap is kept
    assert spec.launch_gap_s == H200.launch_gap_s
    assert all("calibrated from synthetic" in prov[k] for k in prov)


def test_validation_half_within_tolerance_and_better_than_uncalibrated(fitted):
    _, rows, _ = fitted
    val = [r for r in rows if r["split"] == "validate"]
    assert len(val) == len(CASES) // 2
    assert max(abs(r["eager_calibrated_err_pct"]) for r in val) < 10
    worst_before = max(abs(r["eager_uncalibrated_err_pct"]) for r in rows)
    assert worst_before > 25  # datasheet constants are far off a torch path
    assert all(
        r["graph_measured_ms"] is None and r["graph_calibrated_err_pct"] is None for r in rows
    )


def test_graph_times_fix_device_terms_and_eager_times_the_host(fitted_both):
    spec, rows, prov = fitted_both
    assert set(prov) == set(CALIBRATABLE)
    assert "CUDA-graph" in prov["hbm_bandwidth"] and "eager" in prov["launch_overhead_s"]
    assert spec.hbm_bandwidth == pytest.approx(TRUE["hbm_bandwidth"], rel=0.15)
    assert spec.launch_gap_s == pytest.approx(TRUE["launch_gap_s"], rel=0.3)
    assert spec.launch_overhead_s == pytest.approx(HOST_BOUND["launch_overhead_s"], rel=0.15)
    # bounded: no rate above the datasheet, however little the data constrains it
    assert spec.fp16_flops <= H200.fp16_flops and spec.fp32_flops <= H200.fp32_flops
    s = calibrate.summary(rows)
    assert s["validate_graph_calibrated_err_pct_max"] < 10
    assert s["validate_eager_calibrated_err_pct_max"] < 10
    assert s["validate_graph_cases"] == s["validate_eager_cases"] == len(CASES) // 2
    assert s["validate_eager_uncalibrated_err_pct_max"] > 50  # 4 us assumed, 28 us real


def test_cost_model_graph_time_is_the_calibration_graph_model():
    from attn_sim.cost import step_cost
    from attn_sim.workloads import trace_case

    case = Case("decode", 1, 8192)
    record, _ = trace_case(H200, case)
    constants = {k: getattr(H200, k) for k in CALIBRATABLE}
    launches = calibrate.launches_of(H200, case)
    graph = calibrate.predict(launches, constants, "graph")
    cost = step_cost(H200, record)
    assert graph == pytest.approx(cost.graph_time_s, rel=1e-9)
    assert graph >= len(launches) * H200.launch_gap_s  # every launch pays the device gap
    assert cost.time_s > graph  # eager adds host issue on top


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
    assert all(t.graph_s is None for t in calibrate.parse_timings(hil))
    assert (c1.shape.num_heads, c1.shape.num_kv_heads, c1.context, t1) == (16, 2, 32768, 0.002)
    assert (c2.path, c2.context, c2.query_len, t2) == ("prefill", 32768 + 2048, 2048, 0.05)
    parsed = calibrate.parse_measurements(bench)
    assert [(c.num_seqs, c.context, t) for c, t in parsed] == [(2, 1000, 1e-3), (8, 8192, 1.5e-3)]
    assert all(c.shape.num_heads == 16 and c.shape.num_kv_heads == 2 for c, _ in parsed)
    forced = calibrate.parse_measurements(bench, variant="attn_core ps=256")
    assert [(c.num_seqs, t) for c, t in forced] == [(2, 1e-3), (8, 1.7e-3)]


def test_parse_graph_times_of_both_writers():
    bench = {  # decode_bench.py: the graph replay is a variant row of its own
        "shape": {"heads": 24, "kv_heads": 4, "head_size": 256, "block_size": 16},
        "rows": [
            {"variant": "attn_core plan", "batch": 1, "context": 8192, "ms": 1.96},
            {"variant": "attn_core plan, CUDA graph", "batch": 1, "context": 8192, "ms": 0.209},
            {"variant": "attn_core plan, CUDA graph", "batch": 8, "context": 8192, "ms": 0.49},
            {"variant": "repeat_interleave, CUDA graph", "batch": 1, "context": 8192, "ms": 9},
        ],
    }
    got = [(t.case.num_seqs, t.eager_s, t.graph_s) for t in calibrate.parse_timings(bench)]
    assert got == [(1, 1.96e-3, pytest.approx(0.209e-3)), (8, None, pytest.approx(0.49e-3))]
    assert calibrate.parse_measurements(bench) == [(Case("decode", 1, 8192), 1.96e-3)]
    script = {  # bench/sim_calibration.py: both times per record, a failed capture says why
        "records": [
            {
                "case": {"path": "decode", "num_seqs": 4, "context": 8192},
                "eager_s": 2e-3,
                "graph_s": 3e-4,
                "device_launches": 24,
            },
            {
                "case": {"path": "decode", "num_seqs": 1, "context": 8192},
                "eager_s": 2e-3,
                "graph_s": None,
                "graph_error": "RuntimeError: capture failed",
            },
            {
                "case": {"path": "decode", "num_seqs": 64, "context": 102400},
                "skipped": "does not fit in free device memory",
            },
        ]
    }
    got = [
        (t.case.num_seqs, t.eager_s, t.graph_s, t.device_launches)
        for t in calibrate.parse_timings(script)
    ]
    assert got == [(1, 2e-3, None, None), (4, 2e-3, 3e-4, 24)]


def test_too_few_cases_is_an_error():
    with pytest.raises(ValueError, match="measurements"):
        calibrate.calibrate(H200, synthetic()[:1], "x")


def measurement_file(folder):
    """Four synthetic measurements as ``calibrate`` reads them: ``folder/m.json``."""
    records = [
        {"case": {"path": c.path, "num_seqs": c.num_seqs, "context": c.context}, "measured_s": t}
        for c, t in synthetic()[:4]
    ]
    src = folder / "m.json"
    src.write_text(json.dumps(records))
    return src


def test_cli_writes_a_profile_that_loads(tmp_path):
    src = measurement_file(tmp_path)
    assert main(["calibrate", str(src), "--profile", "h200", "--out", str(tmp_path)]) == 0
    spec = load_profile(str(tmp_path / "calibrated_profile.json"))
    assert spec.name == "h200+calibrated" and spec.sm_count == H200.sm_count
    assert spec.hbm_bandwidth != H200.hbm_bandwidth
    assert "calibrated" in spec.provenance["hbm_bandwidth"]


def test_cli_reads_both_times_and_prints_both_verdicts(tmp_path, capsys):
    records = [
        {
            "case": {"path": "decode", "num_seqs": t.case.num_seqs, "context": t.case.context},
            "eager_s": t.eager_s,
            "graph_s": t.graph_s,
        }
        for t in synthetic_timings()
    ]
    src = tmp_path / "m.json"
    src.write_text(json.dumps({"records": records}))
    assert main(["calibrate", str(src), "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "eager: validation half" in text and "graph: validation half" in text
    spec = load_profile(str(tmp_path / "calibrated_profile.json"))
    assert spec.launch_gap_s != H200.launch_gap_s  # the device gap travels in the profile
    saved = json.loads((tmp_path / "calibration.json").read_text())
    assert saved["fitted_terms"] == sorted(CALIBRATABLE)


def test_calibration_model_is_the_cost_model():
    from attn_sim.cost import step_cost
    from attn_sim.workloads import trace_case

    case = Case("decode", 4, 8192)
    record, _ = trace_case(H200, case)
    constants = {k: getattr(H200, k) for k in CALIBRATABLE}
    predicted = calibrate.predict(calibrate.launches_of(H200, case), constants)
    assert predicted == pytest.approx(step_cost(H200, record).time_s, rel=1e-9)


def test_launch_warnings_flag_measurements_of_other_code():
    rows = [
        {"case": "a", "traced_launches": 25, "device_launches": 64},  # run 1 vs dd81135
        {"case": "b", "traced_launches": 25, "device_launches": 27},  # memsets: fine
        {"case": "c", "traced_launches": 25, "device_launches": None},
    ]
    lines = calibrate.launch_warnings(rows)
    assert len(lines) == 2 and lines[1] == "a: 64 kernels measured, 25 traced"
    assert calibrate.launch_warnings(rows[1:]) == []


def test_measured_tier_is_traced_and_both_halves_get_each_tier():
    bench = {  # decode_bench.py run 2: the plan's tier, and the other tier replayed
        "rows": [
            {
                "variant": "attn_core plan",
                "batch": 8,
                "context": c,
                "ms": 1.0,
                "tier": "partitioned",
            }
            for c in (1024, 2048)
        ]
        + [
            {
                "variant": "graph, tier=one_pass",
                "batch": 8,
                "context": c,
                "ms": 0.5,
                "tier": "one_pass",
            }
            for c in (1024, 2048)
        ]
    }
    timings = calibrate.parse_timings(bench)
    assert [(t.case.context, t.case.tier, t.eager_s, t.graph_s) for t in timings] == [
        (1024, "one_pass", None, 0.5e-3),
        (1024, "partitioned", 1e-3, None),
        (2048, "one_pass", None, 0.5e-3),
        (2048, "partitioned", 1e-3, None),
    ]
    assert calibrate.fit_half(timings) == [0, 1]  # the first of each tier
    one_pass = calibrate.launches_of(H200, timings[0].case)
    partitioned = calibrate.launches_of(H200, timings[1].case)
    assert len(one_pass) < len(partitioned)  # the forced tier is what gets traced
