"""Run one suite's steps inside the container (or the local executor's process group).

Usage: python run_suite.py SPEC.json

SPEC (written by the host runner): {"suite": str, "out": dir, "payload": dir,
"test_timeout_s": float, "steps": [{"name", "pytest": [paths], "markers", "command": [argv],
"junit": bool, "timeout_s", "cwd"}]}.

Standard library only: it runs on the vendor image's Python 3.10 and on the CPU test image.
Writes ``OUT/started`` first (so the host can tell "exited before the suite started" from a
failure), one JUnit report per step (``OUT/<step>.xml``; synthesised when the step did not
write one, e.g. pytest killed by a per-test timeout or a segfault), and ``OUT/suite.json``.
Exit status: 0 when every step passed or skipped, 1 otherwise.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

from suite_files import write_atomic

SKIP_EXIT = 77  # a command step exiting 77 is skipped (automake's convention)
PYTEST_NO_TESTS = 5


def write_junit(path: Path, suite: str, case: str, outcome: str, message: str = "") -> None:
    """A one-testcase report; outcome is passed | failure | error | skipped."""
    body = ""
    if outcome != "passed":
        body = f"<{outcome} message={quoteattr(message)}>{escape(message)}</{outcome}>"
    write_atomic(
        path,
        f'<?xml version="1.0" encoding="utf-8"?>\n<testsuites><testsuite name={quoteattr(suite)}>'
        f"<testcase classname={quoteattr(suite)} name={quoteattr(case)}>{body}</testcase>"
        "</testsuite></testsuites>\n",
    )


def remove(path: Path) -> None:
    """Delete ``path`` if anything (a file, a link) is there."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def reports_problems(junit: Path) -> bool:
    """Whether a JUnit report holds a failure or error (so a non-zero exit is explained)."""
    text = junit.read_text(errors="replace")
    return "<failure" in text or "<error" in text


def run_with_timeout(argv, cwd: Path, env: dict, timeout_s):
    """(returncode, timed_out): the step runs in its own process group, killed whole on timeout."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=timeout_s or None), False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait(), True


def describe_rc(rc: int) -> str:
    if rc < 0:
        try:
            return f"signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"signal {-rc}"
    return f"exit code {rc}"


def pytest_argv(step: dict, junit: Path, test_timeout_s: float) -> list:
    argv = [sys.executable, "-m", "pytest", *step["pytest"], f"--junitxml={junit}"]
    argv += ["-p", "no:cacheprovider", "-rfEs", "-v", "-o", "junit_family=xunit2"]
    if step.get("markers"):
        argv += ["-m", step["markers"]]
    # a step's own timeout_s wins, 0 included (disabled: the outer watchdog is the only limit)
    timeout = test_timeout_s if step.get("timeout_s") is None else step["timeout_s"]
    if timeout:
        if importlib.util.find_spec("pytest_timeout") is not None:
            # thread method: a watchdog thread dumps stacks and exits, which works while the
            # main thread is blocked in a driver call; the signal method would wait forever
            argv += [f"--timeout={timeout}", "--timeout-method=thread"]
        else:
            argv += ["-p", "hil_test_timeout", "-o", f"hil_test_timeout={timeout}"]
    return argv


def run_pytest_step(step: dict, spec: dict, out: Path, payload: Path, env: dict) -> tuple:
    junit = out / f"{step['name']}.xml"
    missing = [p for p in step["pytest"] if not (payload / p).exists()]
    if missing:
        write_junit(junit, step["name"], "collect", "skipped", f"not in the payload: {missing}")
        return "skipped", None, f"not in the payload: {missing}"
    remove(junit)  # pytest opens its report for writing: a link there would be written through
    rc, _ = run_with_timeout(
        pytest_argv(step, junit, spec["test_timeout_s"]),
        payload / step.get("cwd", ""),
        env,
        None,
    )
    if rc == PYTEST_NO_TESTS:
        write_junit(junit, step["name"], "collect", "skipped", "no tests selected")
        return "skipped", rc, "no tests selected"
    if not junit.exists():
        msg = f"pytest ended with {describe_rc(rc)} before writing its report "
        msg += "(a per-test timeout or a crash: the log names the test)"
        write_junit(junit, step["name"], "pytest", "failure", msg)
        return "failed", rc, f"pytest {describe_rc(rc)}, no report (per-test timeout or crash)"
    if rc not in (0, 1):
        extra = out / f"{step['name']}-exit.xml"
        write_junit(extra, step["name"], "pytest-exit", "error", f"pytest {describe_rc(rc)}")
    return ("passed" if rc == 0 else "failed"), rc, "" if rc == 0 else f"pytest {describe_rc(rc)}"


PLACEHOLDER = re.compile(r"\{(python|payload|out|junit)\}")


def substitute(arg: str, fields: dict) -> str:
    """``arg`` with each known ``{name}`` replaced by ``fields[name]``; every other brace (a
    dict literal in ``python -c``, an unknown ``{name}``, ``{{``) is kept as written: commands
    are argv, not format strings, so nothing needs escaping."""
    return PLACEHOLDER.sub(lambda m: str(fields[m.group(1)]), arg)


def run_command_step(step: dict, out: Path, payload: Path, env: dict) -> tuple:
    junit = out / f"{step['name']}.xml"
    fields = {"python": sys.executable, "payload": str(payload), "out": str(out), "junit": junit}
    argv = [substitute(str(a), fields) for a in step["command"]]
    try:
        rc, timed_out = run_with_timeout(
            argv, payload / step.get("cwd", ""), env, step.get("timeout_s")
        )
    except OSError as exc:
        write_junit(junit, step["name"], "command", "error", f"cannot run {argv}: {exc}")
        return "failed", None, f"cannot run {argv[0]}: {exc}"
    if timed_out:
        msg = f"timed out after {step['timeout_s']} s: {argv}"
        write_junit(out / f"{step['name']}-timeout.xml", step["name"], "command", "failure", msg)
        return "failed", rc, f"timed out after {step['timeout_s']} s"
    if rc == SKIP_EXIT:
        if not junit.exists():
            write_junit(junit, step["name"], "command", "skipped", f"{argv[0]} asked to skip")
        return "skipped", rc, "asked to skip"
    if step.get("junit") and junit.exists():
        if rc != 0 and not reports_problems(junit):
            err = out / f"{step['name']}-exit.xml"
            write_junit(err, step["name"], "command-exit", "failure", describe_rc(rc))
        return ("passed" if rc == 0 else "failed"), rc, "" if rc == 0 else describe_rc(rc)
    outcome = "passed" if rc == 0 else "failure"
    write_junit(junit, step["name"], "command", outcome, f"{argv} ended with {describe_rc(rc)}")
    return ("passed" if rc == 0 else "failed"), rc, "" if rc == 0 else describe_rc(rc)


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    out, payload = Path(spec["out"]), Path(spec["payload"])
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "started", f"{time.time()}\n")
    env = dict(os.environ)
    # the suite directory holds the fallback per-test timeout plugin (hil_test_timeout)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [str(Path(__file__).parent), env.get("PYTHONPATH", "")] if p
    )
    env.setdefault("PYTHONFAULTHANDLER", "1")  # a segfault prints the Python stack to the log
    steps = []
    for step in spec["steps"]:
        print(f"=== hil step {step['name']} ===", flush=True)
        t0 = time.monotonic()
        if step.get("pytest"):
            status, rc, why = run_pytest_step(step, spec, out, payload, env)
        else:
            status, rc, why = run_command_step(step, out, payload, env)
        took = round(time.monotonic() - t0, 3)
        steps.append(
            {"name": step["name"], "status": status, "rc": rc, "why": why, "duration_s": took}
        )
        print(f"=== hil step {step['name']}: {status} ({took} s) ===", flush=True)
        write_atomic(out / "suite.json", json.dumps({"suite": spec["suite"], "steps": steps}))
    return 0 if all(s["status"] != "failed" for s in steps) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
