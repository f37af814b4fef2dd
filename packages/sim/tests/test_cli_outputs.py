"""Issue 18, classes 5 and 8 (sim): inputs are checked before any output exists; an empty
``--out`` is refused, not the working directory; impossible profiles and facts are refused
naming the field; ``report`` prints a summary and where the full report is; the tests run
outside the repository."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from _cli import assert_bad_input, run, stop_before

from attn_sim import report
from attn_sim.report_text import COREX_CAVEAT

REPO = Path(__file__).resolve().parents[3]
SAMPLE = Path(__file__).parent / "data" / "device_facts_sample.json"


def test_tests_run_outside_the_repository():
    cwd = Path.cwd().resolve()
    assert cwd != REPO and REPO not in cwd.parents


@pytest.mark.parametrize(
    "argv",
    [
        ("report", "--out", ""),
        ("report", "--out", "  "),
        ("sweep", "--profile", "bi-v100", "--out", ""),
        ("calibrate", "m.json", "--out", ""),
        ("profile-from", str(SAMPLE), "--base", "h200", "--out", ""),
        ("update-baseline", "--baseline", ""),
    ],
)
def test_an_empty_out_is_refused_and_nothing_is_written(tmp_path, argv):
    Path("m.json").write_text("[]")
    before = sorted(os.listdir(tmp_path))
    with stop_before(
        "attn_sim.report.build", "attn_sim.sweep.sweep_plan", "attn_sim.calibrate.run"
    ):
        r = run(*argv)
    assert_bad_input(r, "--out" if "--out" in argv else "--baseline")
    assert sorted(os.listdir(tmp_path)) == before


@pytest.mark.parametrize(
    "argv, named",
    [
        (("calibrate", "missing.json", "--out", "o/cal"), "missing.json"),
        (("calibrate", "adir", "--out", "o/cal"), "adir"),
        (("profile-from", "missing.json", "--out", "o/p.json"), "missing.json"),
        (("gates", "--gates", "missing.toml", "--out", "o/g"), "missing.toml"),
        (("report", "--profile", "missing.json", "--out", "o/r"), "missing.json"),
    ],
)
def test_a_bad_input_is_refused_before_any_output_exists(tmp_path, argv, named):
    (tmp_path / "adir").mkdir()
    r = run(*argv)
    assert_bad_input(r, named)
    assert not (tmp_path / "o").exists()


def _bad_profile(tmp_path, fields: dict) -> str:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"base": "bi-v100", "name": "bi-v100+bad", "fields": fields}))
    return str(path)


@pytest.mark.parametrize(
    "fields, field",
    [
        ({"warp_size": 4096, "max_threads_per_sm": 64}, "warp_size"),
        ({"max_threads_per_block": 1}, "max_threads_per_block"),
        ({"sm_count": 10**30}, "sm_count"),
        ({"shared_mem_per_block": 2**20}, "shared_mem_per_block"),
    ],
)
def test_profile_option_refuses_an_impossible_profile(tmp_path, fields, field):
    path = _bad_profile(tmp_path, fields)
    assert_bad_input(run("report", "--profile", path, "--out", "o"), path, field)
    assert not Path("o").exists()


@pytest.mark.parametrize(
    "facts, field",
    [
        ({"warp_size": 4096, "max_threads_per_sm": 64}, "warp_size"),
        ({"max_threads_per_block": 1}, "max_threads_per_block"),
        ({"sm_count": 10**30}, "sm_count"),
        ({"shared_mem_per_block": 10**7, "shared_mem_per_sm": 10**6}, "shared_mem_per_block"),
        ({"hbm_bandwidth": 1e30}, "hbm_bandwidth"),
    ],
)
def test_profile_from_refuses_impossible_facts(tmp_path, facts, field):
    data = json.loads(SAMPLE.read_text())
    for name, value in facts.items():
        data["facts"][name]["value"] = value
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(data))
    r = run("profile-from", str(path), "--base", "h200", "--out", "o/p.json")
    assert_bad_input(r, str(path), field)
    assert not Path("o").exists()


def test_report_prints_a_summary_and_where_the_full_report_is(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "DECODE_CONTEXTS", (1024, 102400))
    monkeypatch.setattr(report, "DECODE_BATCHES", (1, 8))
    monkeypatch.setattr(report, "PREFILL_CASES", [(1, 4096)])
    monkeypatch.setattr(report, "DESIGN_CONTEXTS", (8192, 102400))
    r = run("report", "--out", "rep")
    assert r.code == 0, r.err
    full = Path("rep/report.md").read_text()
    assert "## Assumptions" in full and "## Assumptions" not in r.out
    assert "Decode per layer" in r.out and str(Path("rep") / "report.md") in r.out
    assert len(r.out.splitlines()) < len(full.splitlines()) / 2
    assert r.out.splitlines()[0] == COREX_CAVEAT  # said first, once
    assert r.out.count(COREX_CAVEAT) == 1 and r.out.splitlines()[-1].startswith("verdict: ")
    r = run("report", "--out", "rep", "--full")
    assert r.code == 0 and full.replace(f"{COREX_CAVEAT}\n\n", "").strip() in r.out
    assert r.out.splitlines()[0] == COREX_CAVEAT


@pytest.mark.parametrize("argv0, name", [("/usr/bin/attn-sim", "attn-sim"), ("x.py", "python -m")])
def test_usage_line_uses_the_name_it_was_started_by(monkeypatch, argv0, name):
    monkeypatch.setattr("sys.argv", [argv0])
    r = run("--help")
    assert r.code == 0 and r.out.startswith(f"usage: {name}"), r.out[:80]
    r = run("report", "--out", "")
    assert r.err.startswith(f"usage: {name}"), r.err[:80]
