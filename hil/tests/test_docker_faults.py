"""Injected faults against a real Docker engine: status, exit code, intact results, cleanup.

Every run here uses a light test image and short timeouts; each test also checks that none of
its containers is left on the engine.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hil_helpers import OK, fault_suite, leftovers, light_target

from hil import cli
from hil.runner import run_all
from hil.status import EXIT_HANG_OR_INFRA, EXIT_TEST_FAILURES, Status, exit_code

pytestmark = pytest.mark.docker

HANG_TIMEOUT_S = 12.0


def statuses(results) -> list:
    return [(r.suite, r.status) for r in results]


def step_statuses(result) -> dict:
    steps = json.loads((Path(result.artifacts) / "suite.json").read_text())["steps"]
    return {s["name"]: s["status"] for s in steps}


def test_native_hang_is_killed_quarantined_and_earlier_results_kept(
    engine, light_wheels, light_image, make_ctx
):
    client, host = engine
    target = light_target(host, light_wheels)
    suites = [
        fault_suite("before", OK),
        # per-test timeout off: only the outer watchdog can stop a call blocked in a driver
        fault_suite("hang", ("block", "fault_native_block.py", 0), timeout_s=HANG_TIMEOUT_S),
        fault_suite("after", OK),
    ]
    ctx = make_ctx()
    results = run_all([target], suites, ctx)

    assert statuses(results) == [
        ("before", Status.PASS),
        ("hang", Status.HANG),
        ("after", Status.NOT_RUN),
    ]
    assert exit_code(results) == EXIT_HANG_OR_INFRA
    before = results[0]
    assert before.counts.passed == 2
    assert json.loads((Path(before.artifacts) / "result.json").read_text())["status"] == "PASS"
    assert (Path(before.artifacts) / "ok.xml").exists()
    assert "hung" in ctx.store.get(target.name)["reason"]
    assert leftovers(client, ctx.run_id) == []

    # a later run refuses the quarantined target, with the way out in the message
    again = make_ctx(store=ctx.store)
    refused = run_all([target], [fault_suite("before", OK)], again)
    assert statuses(refused) == [("before", Status.NOT_RUN)]
    assert "reset-target" in refused[0].detail

    # --recheck: the probe passes, the quarantine is lifted and the suite runs
    rechecked = run_all(
        [target], [fault_suite("before", OK)], make_ctx(store=ctx.store, recheck=True)
    )
    assert statuses(rechecked) == [("before", Status.PASS)]
    assert ctx.store.get(target.name) is None


@pytest.fixture(scope="module")
def crash_run(engine, light_wheels, light_image, tmp_path_factory):
    """One run: a per-test timeout, then a segfault, an OOM kill and a plain failure, each
    step followed by more steps that must still run (few suites: every container is a copy)."""
    import uuid

    from hil_helpers import REPO

    from hil.logs import Console
    from hil.quarantine import QuarantineStore
    from hil.runner import RunContext

    client, host = engine
    target = light_target(host, light_wheels, mem_limit="384m")
    suites = [
        fault_suite("test-timeout", ("block", "fault_native_block.py", 3), OK),
        fault_suite(
            "crashes",
            ("segfault", "fault_segfault.py", None),
            ("oom", "fault_oom.py", None),
            ("fails", "fault_fails.py", None),
            OK,
        ),
    ]
    tmp = tmp_path_factory.mktemp("crash")
    run_id = f"t{uuid.uuid4().hex[:8]}"
    ctx = RunContext(
        repo=REPO,
        out=tmp / run_id,
        run_id=run_id,
        store=QuarantineStore(tmp / "state.json"),
        console=Console(echo=False),
    )
    results = run_all([target], suites, ctx)
    return client, ctx, target, {r.suite: r for r in results}, results


def test_per_test_timeout_fails_its_step_and_the_suite_goes_on(crash_run):
    _, _, _, by_suite, _ = crash_run
    result = by_suite["test-timeout"]
    assert result.status == Status.FAIL, result.detail
    assert step_statuses(result) == {"block": "failed", "ok": "passed"}
    assert result.counts.passed == 2 and result.counts.failed == 1
    assert "Timeout" in (Path(result.artifacts) / "log.txt").read_text()


def test_segfault_oom_and_failure_are_failures_with_their_reasons(crash_run):
    _, _, _, by_suite, _ = crash_run
    result = by_suite["crashes"]
    assert result.status == Status.FAIL, result.detail
    want = {"segfault": "failed", "oom": "failed", "fails": "failed", "ok": "passed"}
    assert step_statuses(result) == want
    assert "SIGSEGV" in (Path(result.artifacts) / "segfault.xml").read_text()
    assert "SIGSEGV" in result.detail and "SIGKILL" in result.detail
    assert "OOM-killed" in result.detail
    assert result.counts.passed == 2 and result.counts.failed == 3


def test_crashes_leave_no_quarantine_and_no_containers(crash_run):
    client, ctx, target, _, results = crash_run
    assert [r.suite for r in results] == ["test-timeout", "crashes"]  # probes all passed
    assert exit_code(results) == EXIT_TEST_FAILURES
    assert ctx.store.get(target.name) is None
    assert leftovers(client, ctx.run_id) == []


def test_failing_probe_quarantines_and_runs_nothing(engine, light_wheels, light_image, make_ctx):
    client, host = engine
    target = light_target(host, light_wheels, probe=("{python}", "-c", "raise SystemExit(3)"))
    ctx = make_ctx()
    results = run_all([target], [fault_suite("ok", OK)], ctx)
    assert statuses(results) == [("probe-before", Status.ERROR), ("ok", Status.NOT_RUN)]
    assert exit_code(results) == EXIT_HANG_OR_INFRA
    assert "probe" in ctx.store.get(target.name)["reason"]
    assert leftovers(client, ctx.run_id) == []
    # reset-target lifts it
    assert cli.main(["reset-target", target.name, "--state", str(ctx.store.path)]) == 0
    assert ctx.store.get(target.name) is None


def test_hanging_probe_is_a_hang(engine, light_wheels, light_image, make_ctx):
    client, host = engine
    target = light_target(host, light_wheels, probe=("sleep", "600"), probe_timeout_s=5.0)
    ctx = make_ctx()
    results = run_all([target], [fault_suite("ok", OK)], ctx)
    assert statuses(results) == [("probe-before", Status.HANG), ("ok", Status.NOT_RUN)]
    assert ctx.store.get(target.name) is not None
    assert leftovers(client, ctx.run_id) == []


def test_container_exiting_before_the_suite_starts_is_an_error(
    engine, light_wheels, light_image, make_ctx
):
    client, host = engine
    # the interpreter the container runs is `false`: it exits 1 before the runner starts
    target = light_target(
        host,
        light_wheels,
        python="false",
        probe=("true",),
        build_args={"PACKAGES": "", "STATUS_CHECK": "0", "PYTHON": "python3"},
    )
    ctx = make_ctx()
    results = run_all([target], [fault_suite("ok", OK)], ctx)
    assert results[0].status == Status.ERROR
    assert "before the suite started" in results[0].detail
    assert exit_code(results) == EXIT_HANG_OR_INFRA
    assert ctx.store.get(target.name) is None  # infrastructure, not the device's health
    assert leftovers(client, ctx.run_id) == []


def test_dockerfile_that_fails_to_build_is_an_error(engine, light_wheels, make_ctx, tmp_path):
    client, host = engine
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nRUN echo broken step && exit 3\n")
    target = light_target(host, light_wheels, dockerfile=str(dockerfile))
    ctx = make_ctx()
    results = run_all([target], [fault_suite("ok", OK), fault_suite("ok2", OK)], ctx)
    assert [r.status for r in results] == [Status.ERROR, Status.ERROR]
    assert "image build failed" in results[0].detail
    assert "broken step" in (ctx.out / target.name / "build.log").read_text()
    assert exit_code(results) == EXIT_HANG_OR_INFRA
    assert leftovers(client, ctx.run_id) == []


def test_unreachable_daemon_is_an_error_through_the_cli(tmp_path):
    config = tmp_path / "targets.toml"
    config.write_text(
        '[targets.gone]\nendpoint = "unix:///nonexistent/hil-docker.sock"\ndevice = "cpu"\n'
    )
    out = tmp_path / "out"
    code = cli.main(
        [
            "--config",
            str(config),
            "--suite",
            "long-context",
            "--out",
            str(out),
            "--run-id",
            "r1",
            "--state",
            str(tmp_path / "s.json"),
            "--quiet",
        ]
    )
    assert code == EXIT_HANG_OR_INFRA
    summary = json.loads((out / "r1" / "summary.json").read_text())
    assert summary["results"][0]["status"] == "ERROR"
    assert "unreachable" in summary["results"][0]["detail"]
