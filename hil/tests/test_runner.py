"""The per-target sequence with a scripted executor: quarantine, NOT_RUN, results on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hil import runner
from hil.config import Step, Suite, Target
from hil.runner import run_all
from hil.status import RunOutcome, Status, exit_code


class ScriptedExecutor:
    """Plays back outcomes per run label; writes what a real suite runner would write."""

    def __init__(self, script: dict):
        self.script, self.calls = script, []

    def run(self, suite, timeout_s, out: Path, env, name) -> RunOutcome:
        label = out.name
        self.calls.append(label)
        kind = self.script.get(label, "pass")
        out.mkdir(parents=True, exist_ok=True)
        if kind == "raise":
            raise RuntimeError("executor bug")
        if kind == "hang":
            return RunOutcome(started=True, watchdog_fired=True, duration_s=timeout_s)
        (out / "started").write_text("0")
        failed = kind == "fail"
        case = (
            '<testcase name="a"><failure message="x"/></testcase>'
            if failed
            else '<testcase name="a"/>'
        )
        (out / "s.xml").write_text(f"<testsuites><testsuite>{case}</testsuite></testsuites>")
        steps = [{"name": "s", "status": "failed" if failed else "passed"}]
        (out / "suite.json").write_text(json.dumps({"steps": steps}))
        return RunOutcome(started=True, exit_code=int(failed), duration_s=0.1)


def suites(*names):
    return [Suite(n, (Step(name="s", pytest=("x",)),), 10.0) for n in names]


@pytest.fixture
def scripted(monkeypatch):
    def install(script):
        ex = ScriptedExecutor(script)
        monkeypatch.setattr(runner, "make_executor", lambda target, ctx, suites: (ex, None))
        return ex

    return install


def run(make_ctx, names, **ctx_changes):
    ctx = make_ctx(**ctx_changes)
    return ctx, run_all([Target("t")], suites(*names), ctx)


def test_all_pass_probes_around_every_suite(scripted, make_ctx):
    ex = scripted({})
    ctx, results = run(make_ctx, ["a", "b"])
    assert [r.status for r in results] == [Status.PASS, Status.PASS]
    assert ex.calls == ["probe-before", "a", "probe-after-a", "b", "probe-after-b"]
    assert exit_code(results) == 0
    assert json.loads((ctx.out / "t" / "a" / "result.json").read_text())["status"] == "PASS"


def test_hang_quarantines_and_skips_the_rest(scripted, make_ctx):
    ex = scripted({"b": "hang"})
    ctx, results = run(make_ctx, ["a", "b", "c"])
    assert [r.status for r in results] == [Status.PASS, Status.HANG, Status.NOT_RUN]
    assert ex.calls == ["probe-before", "a", "probe-after-a", "b"]
    assert ctx.store.get("t")["reason"] == "suite b hung"
    assert (ctx.out / "t" / "a" / "result.json").exists()  # completed results kept
    assert exit_code(results) == 2


def test_failing_probe_after_a_suite_keeps_its_result(scripted, make_ctx):
    scripted({"probe-after-a": "fail"})
    ctx, results = run(make_ctx, ["a", "b"])
    got = [(r.suite, r.status) for r in results]
    assert got == [("a", Status.PASS), ("probe-after-a", Status.ERROR), ("b", Status.NOT_RUN)]
    assert "quarantined" in results[1].detail
    assert ctx.store.get("t") is not None


def test_quarantined_target_is_refused_until_recheck(scripted, make_ctx, tmp_path):
    ex = scripted({})
    ctx = make_ctx()
    ctx.store.quarantine("t", "probe hung")
    results = run_all([Target("t")], suites("a"), ctx)
    assert [r.status for r in results] == [Status.NOT_RUN]
    assert "reset-target t" in results[0].detail and ex.calls == []
    results = run_all([Target("t")], suites("a"), make_ctx(store=ctx.store, recheck=True))
    assert [r.status for r in results] == [Status.PASS]
    assert ctx.store.get("t") is None


def test_failed_recheck_keeps_the_quarantine(scripted, make_ctx):
    scripted({"probe-before": "hang"})
    ctx = make_ctx(recheck=True)
    ctx.store.quarantine("t", "old reason")
    results = run_all([Target("t")], suites("a"), ctx)
    assert [r.status for r in results] == [Status.HANG, Status.NOT_RUN]
    assert "probe" in ctx.store.get("t")["reason"]


def test_test_failures_exit_1_and_executor_bugs_are_errors(scripted, make_ctx):
    scripted({"a": "fail", "b": "raise"})
    _, results = run(make_ctx, ["a", "b", "c"])
    assert [r.status for r in results] == [Status.FAIL, Status.ERROR, Status.PASS]
    assert "executor bug" in results[1].detail
    assert exit_code(results[:1]) == 1 and exit_code(results) == 2


def test_infrastructure_error_marks_every_suite(monkeypatch, make_ctx):
    monkeypatch.setattr(runner, "make_executor", lambda t, c, s: (None, "daemon unreachable at x"))
    ctx, results = run(make_ctx, ["a", "b"])
    assert [r.status for r in results] == [Status.ERROR, Status.ERROR]
    assert ctx.store.get("t") is None  # not the device's fault


def test_targets_run_concurrently_one_worker_each(monkeypatch, make_ctx):
    import threading

    barrier = threading.Barrier(2, timeout=10)

    class Meeting(ScriptedExecutor):
        def run(self, suite, timeout_s, out, env, name):
            if out.name == "a":
                barrier.wait()  # both targets must be inside a suite at once
            return super().run(suite, timeout_s, out, env, name)

    monkeypatch.setattr(runner, "make_executor", lambda t, c, s: (Meeting({}), None))
    ctx = make_ctx()
    results = run_all([Target("t1"), Target("t2")], suites("a"), ctx)
    assert [(r.target, r.status) for r in results] == [("t1", Status.PASS), ("t2", Status.PASS)]


def test_a_runner_bug_on_one_target_leaves_the_others(monkeypatch, make_ctx):
    def make(target, ctx, suites):
        if target.name == "broken":
            raise KeyError("surprise")
        return ScriptedExecutor({}), None

    monkeypatch.setattr(runner, "make_executor", make)
    results = run_all([Target("broken"), Target("fine")], suites("a"), make_ctx())
    assert [(r.target, r.status) for r in results] == [
        ("broken", Status.ERROR),
        ("fine", Status.PASS),
    ]
    assert "KeyError" in results[0].detail
