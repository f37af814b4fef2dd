"""Issue 11's ``attn_sim`` cases: each bad input exits 2 naming the argument, file or key.

Before the fix these were tracebacks with exit 1 (the "gate failed" code), vacuous passes, or
exit 2 with text that named nothing (``Unknown format code '%'``). Every case here runs
``main`` in-process; tests/_cli.py says how.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _cli import DELETE, SMALL, assert_bad_input, changed, run, stop_before, to_toml

from attn_sim import config


def small(tmp_path: Path, **changes) -> Path:
    """SMALL with ``changes`` (``plan__context_min=0``; None deletes the key) as a file."""
    data = SMALL
    for dunder, value in changes.items():
        data = changed(data, dunder.replace("__", "."), DELETE if value is None else value)
    path = tmp_path / "gates.toml"
    path.write_text(to_toml(data))
    return path


def test_shipped_gates_file_and_the_small_one_are_valid(tmp_path):
    config.load_gates()  # the checked-in thresholds
    assert config.load_gates(small(tmp_path))["plan"]["context_min"] == 1024


@pytest.mark.parametrize(
    ("shape", "named"),
    [
        ("24,0,256", "num_kv_heads"),  # was ZeroDivisionError, exit 1
        ("24,4,100,16", "head_size"),  # talked about a value_cache
        ("24,5,256", "num_kv_heads"),
        ("24,4,256,7", "block_size"),
        ("24,4", "heads,kv_heads,head_size"),
        ("a,b,c", "heads,kv_heads,head_size"),
        ("", "heads,kv_heads,head_size"),
    ],
)
def test_report_shape(shape, named, tmp_path):
    with stop_before("attn_sim.report.build"):
        r = run("report", "--shape", shape, "--out", str(tmp_path))
    assert_bad_input(r, "--shape", named)


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("profiles", [], "profiles"),  # was "all 0 gate checks passed", exit 0
        ("plan__context_min", 0, "plan.context_min"),  # was OverflowError
        ("time__tolerance", "ten percent", "time.tolerance"),  # was "Unknown format code '%'"
        ("decode__cases", "1x1024", "decode.cases"),  # was "not enough values to unpack"
        ("decode__cases", [[1]], "decode.cases[0]"),
        ("decode__max_syncs", None, "decode.max_syncs is missing"),  # was KeyError
        ("decode__max_launches_by_tier", {"one-pass": 3}, "decode.max_launches_by_tier"),
        ("decode__profile", {"bi-v100": {"max_syncs": 3}}, "max_syncs"),  # would be ignored
        ("plan__context_max", 512, "plan.context_max"),
        ("plan__steps_per_octave", 1.5, "plan.steps_per_octave"),
        ("prefill__cases", [[1, 4096, 1024]], "prefill.cases[0]"),
        ("time__tolerance", float("nan"), "time.tolerance"),
        ("profiles", ["bi-v100", "no-such-profile"], "profiles[1]"),
        ("surprise", 1, "unknown key surprise"),
        ("decode__max_lanches", 3, "unknown key decode.max_lanches"),
    ],
)
def test_gates_file_keys(key, value, named, tmp_path):
    path = small(tmp_path, **{key: value})
    with stop_before("attn_sim.gates.run_gates"):
        r = run("gates", "--gates", str(path), "--out", str(tmp_path / "out"))
    assert_bad_input(r, str(path), named)


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda d: d / "missing.toml", "does not exist"),
        (lambda d: d, "is a directory"),
        (lambda d: _write(d / "empty.toml", ""), "profiles is missing"),
        (lambda d: _write(d / "bad.toml", "profiles = [\n"), "cannot be parsed"),
        (lambda d: _write_bytes(d / "bin.toml", b"\xff\xfe\x00"), "cannot be parsed"),
    ],
)
def test_gates_file_itself(make, named, tmp_path):
    path = make(tmp_path)
    with stop_before("attn_sim.gates.run_gates"):
        r = run("gates", "--gates", str(path), "--out", str(tmp_path / "out"))
    assert_bad_input(r, str(path), named)


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda d: d, "is a directory"),
        (lambda d: _write(d / "b.json", "[]"), "a table"),
        (lambda d: _write(d / "b.json", "{"), "cannot be parsed"),
        (lambda d: _write(d / "b.json", '{"profiles": {"h200": {"x": {"time_s": -1}}}}'), "time_s"),
        (
            lambda d: _write(d / "b.json", '{"profiles": {"h200": {"x": {"time_s": NaN}}}}'),
            "time_s",
        ),
        (lambda d: d / "missing.json", "does not exist"),
    ],
)
def test_gates_baseline_file(make, named, tmp_path):
    path = make(tmp_path)
    with stop_before("attn_sim.gates.run_gates"):
        r = run("gates", "--gates", str(small(tmp_path)), "--baseline", str(path), "--out", "")
    assert_bad_input(r, str(path), named)


@pytest.mark.parametrize("profiles", [",", "", "bi-v100,", "bi-v100,bi-v100", "v100-typo"])
def test_gates_profiles_argument(profiles, tmp_path):
    with stop_before("attn_sim.gates.run_gates"):
        r = run("gates", "--profiles", profiles, "--out", str(tmp_path))
    assert_bad_input(r, "--profiles")


def test_out_that_cannot_be_written_is_refused_before_any_work(tmp_path):
    blocker = _write(tmp_path / "file", "")
    for argv in (
        ("report", "--out", str(blocker)),
        ("report", "--out", str(blocker / "sub")),
        ("gates", "--gates", str(small(tmp_path)), "--out", str(blocker)),
        ("calibrate", str(blocker), "--out", str(blocker / "sub")),
        ("sweep", "--profile", "bi-v100", "--out", str(blocker)),
    ):
        with stop_before(
            "attn_sim.report.build", "attn_sim.gates.run_gates", "attn_sim.sweep.sweep_plan"
        ):
            r = run(*argv)
        assert_bad_input(r, "--out", str(blocker))
        assert r.out == ""  # nothing printed: refused before the tables


def test_update_baseline_into_a_missing_directory_creates_it(tmp_path):
    target = tmp_path / "new" / "dir" / "baseline.json"
    r = run("update-baseline", "--gates", str(small(tmp_path)), "--baseline", str(target))
    assert r.code == 0, r.err
    written = json.loads(target.read_text())
    assert set(written["profiles"]["bi-v100"]) == {"decode b1 ctx1024"}
    again = run("gates", "--gates", str(small(tmp_path)), "--baseline", str(target), "--out", "")
    assert again.code == 0, again.out[-2000:]
    assert "gates on bi-v100 (from " in again.out  # says which profiles it checks


def test_update_baseline_under_a_file_says_so(tmp_path):
    blocker = _write(tmp_path / "file", "")
    with stop_before("attn_sim.simulate.simulate"):
        r = run(
            "update-baseline", "--gates", str(small(tmp_path)), "--baseline", f"{blocker}/b.json"
        )
    assert_bad_input(r, "--baseline", str(blocker))


def test_calibrated_profile_with_negative_bandwidth_is_refused(tmp_path):
    old_style = {"base": "h200", "name": "h200+calibrated", "fields": {"hbm_bandwidth": -5}}
    path = _write(tmp_path / "p.json", json.dumps(old_style))
    with stop_before("attn_sim.report.build"):
        r = run("report", "--profile", str(path), "--out", str(tmp_path))
    assert_bad_input(r, "--profile", str(path), "hbm_bandwidth")


def test_old_calibrated_profile_files_still_read(tmp_path):
    """The pre-schema form ``attn_sim calibrate`` wrote (every calibratable field)."""
    old_style = {
        "base": "h200",
        "name": "h200+calibrated",
        "fields": {
            "hbm_bandwidth": 3.13e12,
            "fp16_flops": 9.0e14,
            "fp32_flops": 5.0e13,
            "launch_gap_s": 2.74e-6,
            "launch_overhead_s": 3.2e-5,
        },
        "provenance": {"hbm_bandwidth": "measured: calibrated from decode_bench.json"},
    }
    path = _write(tmp_path / "p.json", json.dumps(old_style))
    r = run("occupancy", "--profile", str(path), "--threads", "128")
    assert r.code == 0 and "h200+calibrated: 16 blocks/SM" in r.out


def test_profile_file_named_off_its_base_is_refused(tmp_path):
    path = _write(tmp_path / "p.json", json.dumps({"base": "h200", "name": "lab", "fields": {}}))
    r = run("occupancy", "--profile", str(path), "--threads", "128")
    assert_bad_input(r, "--profile", "name must start with a built-in profile")


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (("--threads", "0"), "--threads"),
        (("--threads", "x"), "--threads"),
        (("--threads", "128", "--smem", "-1"), "--smem"),
        (("--threads", "128", "--registers", "-3"), "--registers"),
        (("--threads", "128", "--blocks", "1e3"), "--blocks"),
    ],
)
def test_occupancy_arguments(argv, named):
    assert_bad_input(run("occupancy", *argv), named)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _write_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path
