"""``--executor local``: the same suites as subprocesses under the same watchdog, no Docker."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hil_helpers import OK, fault_suite

from hil.config import Target
from hil.runner import run_all
from hil.status import Status, exit_code


def processes_of_run(run_id: str) -> list:
    """Live processes working inside this run's payload directory (their cwd names the run)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cwd = os.readlink(proc / "cwd")
                state = (proc / "stat").read_text().split(") ", 1)[1][0]
            except OSError:
                continue
            if f"hil-{run_id}-" in cwd and state != "Z":
                found.append(proc.name)
    return found


def test_pass_fail_and_segfault_locally(make_ctx):
    suites = [
        fault_suite("ok", OK),
        fault_suite("fails", ("fail", "fault_fails.py", None), OK),
        fault_suite("segfault", ("crash", "fault_segfault.py", None), OK),
    ]
    results = run_all([Target("local", test_timeout_s=30.0)], suites, make_ctx("local"))
    assert [r.status for r in results] == [Status.PASS, Status.FAIL, Status.FAIL]
    assert [r.counts.passed for r in results] == [2, 2, 2]
    assert "SIGSEGV" in (Path(results[2].artifacts) / "crash.xml").read_text()
    assert "crash (pytest signal SIGSEGV" in results[2].detail
    assert exit_code(results) == 1


def test_hang_kills_every_process_of_the_run(make_ctx):
    suites = [
        fault_suite("hang", ("block", "fault_native_block.py", 0), timeout_s=4.0),
        fault_suite("after", OK),
    ]
    ctx = make_ctx("local")
    results = run_all([Target("local")], suites, ctx)
    assert [r.status for r in results] == [Status.HANG, Status.NOT_RUN]
    # the blocked pytest ran in a session of its own; the watchdog found it all the same
    assert processes_of_run(ctx.run_id) == []
    assert ctx.store.get("local") is not None


def test_per_test_timeout_fails_only_its_step(make_ctx):
    suites = [fault_suite("t", ("block", "fault_native_block.py", 2), OK, timeout_s=60.0)]
    results = run_all([Target("local")], suites, make_ctx("local"))
    assert results[0].status == Status.FAIL
    steps = json.loads((Path(results[0].artifacts) / "suite.json").read_text())["steps"]
    assert [s["status"] for s in steps] == ["failed", "passed"]


def test_long_context_quick_writes_calibration_records(make_ctx):
    from hil.config import load_config

    repo = Path(__file__).resolve().parents[2]
    config = load_config(
        repo / "hil" / "targets.toml", repo / "hil" / "suites" / "suites.toml", environ={}
    )
    ctx = make_ctx("local", quick=True)
    results = run_all([Target("local")], [config.suites["long-context"]], ctx)
    assert results[0].status == Status.PASS, results[0].detail
    records = json.loads((Path(results[0].artifacts) / "long_context_metrics.json").read_text())
    assert {r["kind"] for r in records} == {"decode", "prefill"}
    want = {
        "kind",
        "num_seqs",
        "context_len",
        "query_len",
        "num_heads",
        "num_kv_heads",
        "head_size",
        "block_size",
        "dtype",
        "median_s",
        "kv_bytes",
        "peak_bytes",
        "rel_error",
        "device",
    }
    for r in records:
        assert want <= set(r)
        assert r["rel_error"] <= r["tolerance"] and r["median_s"] > 0


def test_interrupt_kills_the_running_suite_and_skips_the_rest(make_ctx):
    """Ctrl-C in the runner sets ctx.cancel: the running tree dies, the rest is NOT_RUN."""
    import threading
    import time

    suites = [
        fault_suite("hang", ("block", "fault_native_block.py", 0), timeout_s=300.0),
        fault_suite("after", OK),
    ]
    ctx = make_ctx("local")

    def interrupt_once_hung():
        started = ctx.out / "local" / "hang" / "started"
        deadline = time.monotonic() + 120
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # inside the blocked test by now
        ctx.cancel.set()

    threading.Thread(target=interrupt_once_hung, daemon=True).start()
    results = run_all([Target("local")], suites, ctx)
    assert [r.status for r in results] == [Status.ERROR, Status.NOT_RUN]
    assert "interrupted" in results[0].detail and results[0].duration_s < 60
    assert processes_of_run(ctx.run_id) == []
    assert ctx.store.get("local") is None  # an interrupt says nothing about the device


def test_a_relative_out_is_where_the_runner_writes(make_ctx, tmp_path, monkeypatch):
    """The local runner works inside its payload directory: an ``--out`` relative to the caller's
    directory (bench/device_facts_h200.sh passes ``results/hil``) must still receive its start
    marker and reports, not a copy under the payload (found on the H100, 2026-12-05: the probe
    passed, then was classified "exited (code 0) before the suite started")."""
    monkeypatch.chdir(tmp_path)
    ctx = make_ctx("local")
    ctx.out = Path("relative-results") / ctx.run_id
    results = run_all([Target("local", test_timeout_s=30.0)], [fault_suite("ok", OK)], ctx)
    assert [r.status for r in results] == [Status.PASS], results
    assert (tmp_path / "relative-results" / ctx.run_id).is_dir()
