"""One worker per target: connect, image, probe, suites, probe; results written as they land.

Per target the order is: refuse if quarantined (unless ``--recheck``) -> connect -> image ->
probe -> for each suite: run, write its result.json, probe. A probe that fails or hangs, or a
suite that hangs, quarantines the target and the target's remaining suites are NOT_RUN; the
results of suites that completed stay on disk and in the summary.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from hil.config import Step, Suite, Target
from hil.config_values import is_safe_name
from hil.files import open_append, write_atomic
from hil.junit import count_reports
from hil.logs import Console
from hil.quarantine import QuarantineStore, refusal
from hil.status import Counts, RunOutcome, Status, SuiteResult, classify

PROBE_SCRIPT = "{payload}/hil/suites/probe.py"


@dataclass
class RunContext:
    repo: Path
    out: Path  # this run's artifacts root: <out>/<target>/<suite>/
    run_id: str
    store: QuarantineStore
    console: Console
    executor: str = "docker"  # docker | local
    recheck: bool = False
    quick: bool = False
    wheels: str = ""
    on_result: Optional[Callable[[SuiteResult], None]] = None
    extra_env: dict = field(default_factory=dict)
    cancel: threading.Event = field(default_factory=threading.Event)  # set on Ctrl-C


def artifact_dir(out: Path, *parts: str) -> Path:
    """``out/part/...``; ValueError unless every part is one safe path component, so a name
    from a config (or from code that built a Target by hand) never puts files outside --out."""
    bad = [p for p in parts if not is_safe_name(p)]
    if bad:
        raise ValueError(
            f"artifact path {out}/{'/'.join(parts)} would be outside {out} or not one path "
            f"component per level: {bad}"
        )
    return out.joinpath(*parts)


def probe_suite(target: Target) -> Suite:
    command = target.probe or ("{python}", PROBE_SCRIPT, target.device)
    return Suite("probe", (Step(name="probe", command=tuple(command)),), target.probe_timeout_s)


def suite_env(target: Target, ctx: RunContext) -> dict:
    env = dict(target.environment)
    env.update(ctx.extra_env)
    env["HIL_DEVICE"] = target.device
    env["HIL_TARGET"] = target.name
    if ctx.quick:
        env["HIL_QUICK"] = "1"
    return env


def container_name(ctx: RunContext, target: Target, label: str) -> str:
    raw = f"hil-{ctx.run_id}-{target.name}-{label}"
    return re.sub(r"[^a-zA-Z0-9_.-]", "-", raw)


def make_executor(target: Target, ctx: RunContext, suites: Sequence[Suite] = ()):
    """(executor, None) or (None, infra error message) for this target.

    For Docker, the suites' payloads (their tests) are archived before the image (their code)
    is built, so a tree edited during a long build cannot pair new tests with old code.
    """
    if ctx.executor == "local":
        from hil.executor_local import LocalExecutor

        return LocalExecutor(target, ctx.repo, ctx.console, cancel=ctx.cancel), None
    from hil.executor_docker import DockerExecutor, connect, container_payload
    from hil.image import BuildFailed, ensure_image

    archives = {s.name: container_payload(ctx.repo, s, target) for s in suites}
    archives["probe"] = container_payload(ctx.repo, probe_suite(target), target)

    build_log = artifact_dir(ctx.out, target.name, "build.log")
    build_log.parent.mkdir(parents=True, exist_ok=True)

    def say(text: str) -> None:
        ctx.console.line(f"{target.name}/image", text)
        with open_append(build_log) as f:
            f.write((text + "\n").encode())

    try:
        client = connect(target)
    except ConnectionError as exc:
        return None, str(exc)
    dockerfile = Path(target.dockerfile or "hil/docker/Dockerfile")
    dockerfile = dockerfile if dockerfile.is_absolute() else ctx.repo / dockerfile
    args = {"BASE_IMAGE": target.base_image, "PYTHON": target.python, **target.build_args}
    try:
        image = ensure_image(
            client,
            ctx.repo,
            dockerfile,
            target.wheels or ctx.wheels,
            args,
            say,
            target.build_timeout_s,
        )
    except BuildFailed as exc:
        return None, f"image build failed (log: {build_log}): {exc}"
    except Exception as exc:  # the engine failing mid-build/lookup: infrastructure all the same
        return None, f"image setup failed: {type(exc).__name__}: {exc}"
    try:
        log_client = connect(target, timeout_s=None)
    except ConnectionError as exc:
        return None, str(exc)
    executor = DockerExecutor(
        client, image, target, ctx.repo, ctx.console, log_client, archives=archives
    )
    executor.cancel = ctx.cancel
    return executor, None


def result_from_run(target: Target, suite: Suite, outcome: RunOutcome, art: Path) -> SuiteResult:
    reports = [p for p in art.glob("*.xml")]
    counts, unreadable = count_reports(reports)
    failed_steps, broken = read_steps(art / "suite.json")
    status, detail = classify(outcome, counts, failed_steps)
    if broken and status in (Status.PASS, Status.FAIL):
        # the watchdog's HANG (and an infrastructure ERROR) stand whatever the record says;
        # otherwise results that cannot be read are ERROR (exit 2), not test failures
        status, detail = Status.ERROR, f"results could not be read ({detail or 'no failures'})"
    notes = list(outcome.notes) + [f"unreadable report {n}" for n in unreadable]
    notes += [broken] if broken else []
    if notes:
        detail = "; ".join([detail, *notes]) if detail else "; ".join(notes)
    return SuiteResult(
        target.name, suite.name, status, counts, round(outcome.duration_s, 2), detail, str(art)
    )


def read_steps(path: Path) -> tuple[list, str]:
    """(the failed steps of the suite record at ``path``, why the record is broken or "").

    The record is whatever the suite left, possibly mid-write when it hung or was killed, so
    every shape is survived: a broken record is reported, never raised.
    """
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        return [], ""
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: deep nesting
        return [], f"suite record {path.name} unreadable ({type(exc).__name__}: {str(exc)[:200]})"
    steps = data.get("steps") if isinstance(data, dict) else None
    if not isinstance(steps, list):
        return [], f"suite record {path.name} has no list of steps"
    failed, partial = [], 0
    for s in steps:
        if not isinstance(s, dict) or not isinstance(s.get("name"), str) or "status" not in s:
            partial += 1
        elif s["status"] == "failed":
            failed.append(f"{s['name']} ({s['why']})" if s.get("why") else s["name"])
    why = (
        f"suite record {path.name} has {partial} step(s) without a name or status"
        if partial
        else ""
    )
    return failed, why


def write_result(result: SuiteResult) -> None:
    art = Path(result.artifacts)
    art.mkdir(parents=True, exist_ok=True)
    write_atomic(art / "result.json", json.dumps(result.to_json(), indent=1))


def run_one(executor, target, suite, ctx, label) -> SuiteResult:
    art = artifact_dir(ctx.out, target.name, label)
    timeout = target.probe_timeout_s if suite.name == "probe" else target.suite_timeout(suite)
    name = container_name(ctx, target, label)
    try:
        outcome = executor.run(suite, timeout, art, suite_env(target, ctx), name)
    except Exception as exc:  # an executor bug must not lose the other suites' results
        outcome = RunOutcome(infra_error=f"executor failed: {type(exc).__name__}: {exc}")
    result = result_from_run(target, suite, outcome, art)
    result.suite = label
    write_result(result)
    if ctx.on_result:
        ctx.on_result(result)
    return result


def probe(executor, target, ctx, label, results) -> bool:
    """Run the health probe; on failure record it, quarantine the target, return False."""
    result = run_one(executor, target, probe_suite(target), ctx, label)
    if result.status == Status.PASS:
        return True
    if result.status == Status.ERROR:
        # the probe could not even run: an infrastructure problem, not the device's health
        results.append(result)
        return False
    reason = f"health probe ({label}) {result.status.value}: {result.detail}"
    ctx.store.quarantine(target.name, reason, ctx.run_id)
    result.status = Status.HANG if result.status == Status.HANG else Status.ERROR
    result.detail = f"{reason}; target quarantined"
    write_result(result)
    results.append(result)
    return False


def unrun_results(
    target: Target, suites: Sequence[Suite], status: Status, why: str, ctx: RunContext
) -> list[SuiteResult]:
    """One row per suite that did not run (no counts, no time), naming its artifact folder."""
    return [
        SuiteResult(
            target.name,
            s.name,
            status,
            Counts(),
            0.0,
            why,
            str(artifact_dir(ctx.out, target.name, s.name)),
        )
        for s in suites
    ]


def not_run(target: Target, suites: Sequence[Suite], why: str, ctx: RunContext) -> list:
    out = []
    for result in unrun_results(target, suites, Status.NOT_RUN, why, ctx):
        write_result(result)
        if ctx.on_result:
            ctx.on_result(result)
        out.append(result)
    return out


def run_target(target: Target, suites: Sequence[Suite], ctx: RunContext) -> list[SuiteResult]:
    results: list[SuiteResult] = []
    entry = ctx.store.get(target.name)
    if entry and not ctx.recheck:
        return not_run(target, suites, refusal(target.name, entry), ctx)
    executor, error = make_executor(target, ctx, suites)
    if executor is None:
        infra = unrun_results(target, suites, Status.ERROR, error, ctx)
        for r in infra:
            write_result(r)
        return infra
    if not probe(executor, target, ctx, "probe-before", results):
        return results + not_run(target, suites, "health probe before the suites failed", ctx)
    if entry:
        ctx.store.release(target.name)
        ctx.console.line(target.name, "recheck probe passed: quarantine lifted")
    for i, suite in enumerate(suites):
        if ctx.cancel.is_set():
            return results + not_run(target, suites[i:], "interrupted before it started", ctx)
        result = run_one(executor, target, suite, ctx, suite.name)
        results.append(result)
        rest = suites[i + 1 :]
        if ctx.cancel.is_set():
            return results + not_run(target, rest, "interrupted before it started", ctx)
        if result.status == Status.HANG:
            ctx.store.quarantine(target.name, f"suite {suite.name} hung", ctx.run_id)
            return results + not_run(target, rest, f"target quarantined: {suite.name} hung", ctx)
        if not probe(executor, target, ctx, f"probe-after-{suite.name}", results):
            return results + not_run(target, rest, f"health probe after {suite.name} failed", ctx)
    return results


def run_target_safely(target: Target, suites: Sequence[Suite], ctx: RunContext) -> list:
    """run_target, with a runner bug turned into ERROR rows instead of a lost summary."""
    try:
        return run_target(target, suites, ctx)
    except Exception as exc:
        why = f"runner failed on this target: {type(exc).__name__}: {exc}"
        return unrun_results(target, suites, Status.ERROR, why, ctx)


def run_all(targets: Sequence[Target], suites: Sequence[Suite], ctx: RunContext) -> list:
    """All targets at once, one worker thread each; results in target order."""
    ctx.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, len(targets))) as pool:
        futures = [pool.submit(run_target_safely, t, suites, ctx) for t in targets]
        try:
            while not all(f.done() for f in futures):
                time.sleep(0.2)
        except KeyboardInterrupt:
            # stop the running containers / process trees; workers record ERROR and NOT_RUN
            ctx.console.line("hil", "interrupted: stopping the running suites")
            ctx.cancel.set()
        results = [r for f in futures for r in f.result()]
    ctx.console.line("hil", f"all targets done in {time.monotonic() - t0:.1f} s")
    return results
