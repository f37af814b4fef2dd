"""A hang is a HANG whatever the suite's record says; a broken or partial ``suite.json`` is
reported inside the result, never crashes the runner; records are replaced atomically."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hil import runner
from hil.config import Step, Suite, Target
from hil.runner import run_all, write_result
from hil.status import Counts, RunOutcome, Status, SuiteResult, exit_code

BROKEN_RECORDS = {
    "not-json": '{"steps": [',
    "no-status": json.dumps({"steps": [{"name": "s"}]}),
    "steps-not-a-list": json.dumps({"steps": 7}),
    "not-an-object": "[1, 2]",
    "deep-nesting": "[" * 100_000 + "]" * 100_000,
    "not-utf8": b"\xff\xfe{".decode("latin-1"),
}


class BrokenRecordExecutor:
    """Writes ``record`` as suite.json, then hangs (the watchdog fires) or exits ``code``."""

    def __init__(self, record: str, hang_in: str = "a", code: int = 1):
        self.record, self.hang_in, self.code, self.calls = record, hang_in, code, []

    def run(self, suite, timeout_s, out: Path, env, name) -> RunOutcome:
        self.calls.append(out.name)
        out.mkdir(parents=True, exist_ok=True)
        (out / "started").write_text("0")
        if out.name != self.hang_in:
            (out / "suite.json").write_text(json.dumps({"steps": []}))
            return RunOutcome(started=True, exit_code=0)
        (out / "suite.json").write_bytes(self.record.encode("latin-1"))
        if self.code is None:
            return RunOutcome(started=True, watchdog_fired=True, duration_s=timeout_s)
        return RunOutcome(started=True, exit_code=self.code)


def install(monkeypatch, ex) -> None:
    monkeypatch.setattr(runner, "make_executor", lambda target, ctx, suites: (ex, None))


def suites(*names):
    return [Suite(n, (Step(name="s", pytest=("x",)),), 10.0) for n in names]


@pytest.mark.parametrize("kind", sorted(BROKEN_RECORDS))
def test_hang_with_a_broken_record_is_a_hang_with_result_and_quarantine(
    monkeypatch, make_ctx, kind
):
    ex = BrokenRecordExecutor(BROKEN_RECORDS[kind], code=None)
    install(monkeypatch, ex)
    ctx = make_ctx()
    results = run_all([Target("t")], suites("a", "b"), ctx)
    assert [r.status for r in results] == [Status.HANG, Status.NOT_RUN]
    assert "suite.json" in results[0].detail  # the broken record is named, not hidden
    assert ex.calls == ["probe-before", "a"]  # no after-probe on a hung target
    on_disk = json.loads((ctx.out / "t" / "a" / "result.json").read_text())
    assert on_disk["status"] == "HANG"
    assert ctx.store.get("t")["reason"] == "suite a hung"


@pytest.mark.parametrize("kind", sorted(BROKEN_RECORDS))
def test_broken_record_of_a_finished_suite_is_an_error_that_says_so(monkeypatch, make_ctx, kind):
    """Results that cannot be read are ERROR (status.py), exit 2: bad input, not test failures."""
    install(monkeypatch, BrokenRecordExecutor(BROKEN_RECORDS[kind], code=0))
    ctx = make_ctx()
    results = run_all([Target("t")], suites("a"), ctx)
    assert results[0].status == Status.ERROR
    assert "results could not be read" in results[0].detail
    assert "suite.json" in results[0].detail
    assert exit_code(results) == 2
    assert ctx.store.get("t") is None  # not the device's fault: no quarantine
    assert (ctx.out / "t" / "a" / "result.json").exists()


def test_local_step_that_breaks_its_record_and_hangs_is_a_hang(make_ctx):
    code = (
        "import pathlib, sys, time; "
        "pathlib.Path(sys.argv[1], 'suite.json').write_text('{\"steps\": [{\"name\"'); "
        "time.sleep(60)"
    )
    step = Step(name="breaks", command=("{python}", "-c", code, "{out}"))
    ctx = make_ctx("local")
    results = run_all([Target("local")], [Suite("hangs", (step,), 3.0)], ctx)
    assert results[0].status == Status.HANG, results[0].detail
    assert "suite.json" in results[0].detail
    assert json.loads((Path(results[0].artifacts) / "result.json").read_text())["status"] == "HANG"
    assert ctx.store.get("local") is not None


def test_result_is_replaced_atomically_not_rewritten_in_place(tmp_path):
    art = tmp_path / "art"
    art.mkdir()
    other = tmp_path / "other.json"
    other.write_text("kept")
    os.link(other, art / "result.json")  # an in-place write would change both names
    write_result(SuiteResult("t", "s", Status.PASS, Counts(), 0.0, "", str(art)))
    assert other.read_text() == "kept"
    assert json.loads((art / "result.json").read_text())["status"] == "PASS"
    assert [p.name for p in art.iterdir()] == ["result.json"]  # no temporary file left


def test_suite_runner_replaces_its_record_atomically(tmp_path):
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "suites"))
    import run_suite

    out = tmp_path / "out"
    out.mkdir()
    other = tmp_path / "other.json"
    other.write_text("kept")
    os.link(other, out / "suite.json")
    spec = {
        "suite": "s",
        "out": str(out),
        "payload": str(tmp_path),
        "test_timeout_s": 0,
        "steps": [{"name": "ok", "command": [sys.executable, "-c", "pass"]}],
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert run_suite.main(str(tmp_path / "spec.json")) == 0
    assert other.read_text() == "kept"
    assert json.loads((out / "suite.json").read_text())["steps"][0]["status"] == "passed"
