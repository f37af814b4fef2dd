"""Gates pass on the real code with its own baseline, and fail on deliberately bad plans."""

from __future__ import annotations

import dataclasses
import json
from functools import partial

import pytest
import torch

import attn_core
from attn_sim import config
from attn_sim.cli import main
from attn_sim.gates import baseline_from, format_violations, run_gates
from attn_sim.profiles import load_profile
from attn_sim.workloads import plan_for, trace_case

BI = load_profile("bi-v100")


def small_gates() -> dict:
    gates = config.load_gates()
    gates["profiles"] = ["bi-v100"]
    gates["decode"]["cases"] = [[1, 8192], [4, 2048]]
    gates["prefill"]["cases"] = []
    gates["plan"].update(
        batches=[1, 4],
        context_min=1024,
        context_max=65536,
        steps_per_octave=1,
        prefill_query_lens=[],
    )
    return gates


@pytest.fixture(scope="module")
def good():
    """Thresholds at today's launches / transient, and today's predictions as the baseline.

    attn-core's decode is still changing; the checked-in thresholds are CI's business. These
    tests check the gate machinery: no false alarm on the code as it is, an alarm on any change.
    """
    gates = small_gates()
    first = run_gates([BI], gates, {"profiles": {}})
    decode = [r for r in first.results if r.path == "decode"]
    gates["decode"]["max_launches"] = max(r.launches for r in decode)
    by_tier: dict = {}
    for r in decode:
        by_tier[r.tier] = max(by_tier.get(r.tier, 0), r.launches)
    gates["decode"]["max_launches_by_tier"] = by_tier
    gates["decode"]["max_plan_launches"] = max(r.plan_launches for r in decode)
    gates["decode"]["profile"] = {
        "bi-v100": {"transient_kv_ratio": max(r.transient_bytes / r.kv_bytes for r in decode)}
    }
    return gates, baseline_from(first.results)


def test_real_code_passes_with_its_own_baseline(good):
    gates, baseline = good
    report = run_gates([BI], gates, baseline)
    assert report.ok, format_violations(report)
    assert report.checks > 20


def test_missing_baseline_fails(good):
    gates, _ = good
    report = run_gates([BI], gates, {"profiles": {}})
    assert {v.gate for v in report.violations} == {"time"}
    assert "update-baseline" in format_violations(report)


def test_overflowing_shared_memory_fails(good):
    gates, baseline = good

    def bad_planner(spec, case, tier=None):
        plan = plan_for(spec, case, tier)
        steps = tuple(
            dataclasses.replace(s, shared_mem_bytes=spec.shared_mem_per_block + 256)
            if s.name == "partition"
            else s
            for s in plan.steps
        )
        return dataclasses.replace(plan, steps=steps)

    report = run_gates([BI], gates, baseline, planner=bad_planner)
    smem = [v for v in report.violations if v.gate == "shared_memory"]
    assert smem and all(v.over_by == 256 for v in smem)
    table = format_violations(report)
    assert "FAILED" in table and "shared_memory" in table and "256" in table


def test_plan_with_extra_launches_fails(good):
    gates, baseline = good

    def bad_planner(spec, case, tier=None):
        plan = plan_for(spec, case, tier)
        return dataclasses.replace(plan, steps=plan.steps + plan.steps[-1:] * 3)

    report = run_gates([BI], gates, baseline, planner=bad_planner)
    assert any(v.gate == "plan_launches" for v in report.violations)


def test_code_that_adds_launches_fails(good):
    gates, baseline = good
    real = attn_core.paged_decode

    def slower(*args, **kwargs):
        out = real(*args, **kwargs)
        for _ in range(12):  # a regression: a dozen extra elementwise passes
            out = out * 1.0
        return out

    report = run_gates([BI], gates, baseline, tracer=partial(trace_case, decode_entry=slower))
    gates_hit = {v.gate for v in report.violations}
    assert "launches" in gates_hit


def test_one_extra_launch_fails_its_tier_under_a_loose_global_bound(good):
    gates, baseline = good
    gates = {**gates, "decode": {**gates["decode"], "max_launches": 1000}}
    real = attn_core.paged_decode

    def one_more(*args, **kwargs):
        return real(*args, **kwargs) * 1.0

    report = run_gates([BI], gates, baseline, tracer=partial(trace_case, decode_entry=one_more))
    hit = [v for v in report.violations if v.gate == "launches"]
    assert hit and all(v.over_by == 1 for v in hit)
    assert {v.detail.split("(")[1].rstrip(")") for v in hit} <= set(
        gates["decode"]["max_launches_by_tier"]
    )


def test_host_sync_fails(good):
    gates, baseline = good
    real = attn_core.paged_decode

    def syncing(query, key_cache, value_cache, block_tables, seq_lens, *args, **kwargs):
        int(seq_lens.max())  # a host read: breaks CUDA-graph capture
        return real(query, key_cache, value_cache, block_tables, seq_lens, *args, **kwargs)

    report = run_gates([BI], gates, baseline, tracer=partial(trace_case, decode_entry=syncing))
    assert any(v.gate == "syncs" for v in report.violations)


def test_cli_exit_codes(tmp_path, good):
    gates, baseline = good
    toml = tmp_path / "gates.toml"
    toml.write_text(_to_toml(gates))
    base = tmp_path / "baseline.json"
    base.write_text(json.dumps(baseline))
    args = ["gates", "--gates", str(toml), "--baseline", str(base), "--out", str(tmp_path)]
    assert main(args) == 0
    slower = json.loads(base.read_text())
    for entry in slower["profiles"]["bi-v100"].values():
        entry["time_s"] *= 0.5  # baseline twice as fast: today's code is a regression
    base.write_text(json.dumps(slower))
    assert main(args) == 1
    written = json.loads((tmp_path / "gates.json").read_text())
    assert not written["ok"] and {v["gate"] for v in written["violations"]} == {"time"}


def _to_toml(gates: dict) -> str:
    """Just enough TOML for the gates dict (tables of scalars and lists)."""

    def value(v):
        return json.dumps(v) if not isinstance(v, bool) else str(v).lower()

    lines = [f"profiles = {value(gates['profiles'])}"]
    for table in ("decode", "prefill", "plan", "time"):
        lines.append(f"[{table}]")
        for k, v in gates[table].items():
            if isinstance(v, dict):
                continue
            lines.append(f"{k} = {value(v)}")
    return "\n".join(lines) + "\n"


def test_seq_lens_are_int32_on_meta():
    # the tracer feeds attn-core meta tensors; its dtype checks must see the real dtypes
    from attn_sim.workloads import Case, decode_inputs

    args, _, shadows = decode_inputs(Case("decode", 2, 100))
    assert args[4].dtype == torch.int32 and args[4].device.type == "meta"
    assert shadows[args[4]].tolist() == [100, 100]


def test_update_baseline_replaces_a_profile_whole(good):
    _, baseline = good
    stale = {"profiles": {"bi-v100": {"decode b1 ctx3": {"time_s": 1.0}}, "a100": {"x": {}}}}
    results = [r for r in run_gates([BI], small_gates(), baseline).results]
    fresh = baseline_from(results, stale)
    assert "decode b1 ctx3" not in fresh["profiles"]["bi-v100"]
    assert fresh["profiles"]["a100"] == {"x": {}}  # profiles not simulated are kept
    assert set(fresh["profiles"]["bi-v100"]) == {r.label for r in results}


def test_cli_output_for_a_person(tmp_path, good):
    """The gates command prints what failed (not every case), says what its "N gate checks"
    are, and ends with a plain verdict and what to do next."""
    from _cli import run

    gates, baseline = good
    toml = tmp_path / "gates.toml"
    toml.write_text(_to_toml(gates))
    base = tmp_path / "baseline.json"
    base.write_text(json.dumps(baseline))
    args = ["gates", "--gates", str(toml), "--baseline", str(base), "--out", ""]
    ok = run(*args)
    assert ok.code == 0, ok.err
    lines = ok.out.strip().splitlines()
    assert "gate checks" in ok.out and "each threshold" in ok.out  # what a check is
    assert lines[-1].startswith("verdict: gates passed")
    assert "| case " not in ok.out  # no table of cases that passed
    slower = json.loads(base.read_text())
    first = sorted(slower["profiles"]["bi-v100"])[0]
    slower["profiles"]["bi-v100"][first]["time_s"] *= 0.5
    base.write_text(json.dumps(slower))
    bad = run(*args)
    assert bad.code == 1
    lines = bad.out.strip().splitlines()
    assert lines[-1].startswith("verdict: gates FAILED") and "update-baseline" in lines[-1]
    table = [ln for ln in lines if ln.startswith("| bi-v100")]
    assert table and all(first in ln for ln in table), table  # only what failed
