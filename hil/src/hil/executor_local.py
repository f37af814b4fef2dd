"""Run one suite without Docker: a subprocess in its own process group under the same watchdog.

For a GPU machine without a Docker engine (the H200 the lead measures on). The payload is the
same archive a container gets, extracted into a temporary directory; results are written
straight into the artifacts directory. Code runs from the tree: the repo's packages/*/src
directories are put in front of PYTHONPATH.

The suite runner starts each step in a session of its own (so it can kill a step's process
group), which puts steps outside the runner's group; the watchdog therefore finds every process
of the run by a token in its environment (``HIL_RUN_TOKEN``, inherited by all descendants) and
kills them all.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from pathlib import Path

from hil.config import Suite, Target
from hil.logs import Console, LogPump
from hil.payload import PAYLOAD_ROOT, RUNNER, SPEC_NAME, build_payload, suite_spec
from hil.status import RunOutcome

LOG_JOIN_S = 5.0
POLL_S = 0.2


def tree_pythonpath(repo: Path, inherited: str) -> str:
    srcs = [str(p) for p in sorted((repo / "packages").glob("*/src")) if p.is_dir()]
    return os.pathsep.join([*srcs, inherited] if inherited else srcs)


class LocalExecutor:
    def __init__(self, target: Target, repo: Path, console: Console, python: str = "", cancel=None):
        self.target, self.repo, self.console = target, repo, console
        self.python = python or sys.executable
        self.cancel = cancel  # a threading.Event: when set, the running process tree is killed

    def run(self, suite: Suite, timeout_s: float, out: Path, env: dict, name: str) -> RunOutcome:
        # the runner's cwd is its payload directory: a relative out would land there and vanish
        out = out.resolve()
        out.mkdir(parents=True, exist_ok=True)
        outcome = RunOutcome()
        with tempfile.TemporaryDirectory(prefix=f"{name}-") as work:
            payload_dir = Path(work) / PAYLOAD_ROOT
            spec = suite_spec(suite, str(payload_dir), str(out), self.target.test_timeout_s)
            with tarfile.open(fileobj=io.BytesIO(build_payload(self.repo, suite, spec))) as tar:
                tar.extractall(work)  # our own archive, built just above
            full_env = dict(os.environ)
            full_env.update(env)
            full_env["PYTHONPATH"] = tree_pythonpath(self.repo, os.environ.get("PYTHONPATH", ""))
            token = full_env["HIL_RUN_TOKEN"] = uuid.uuid4().hex
            t0 = time.monotonic()
            try:
                proc = subprocess.Popen(
                    [self.python, str(payload_dir / RUNNER), str(payload_dir / SPEC_NAME)],
                    cwd=payload_dir,
                    env=full_env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as exc:
                outcome.infra_error = f"suite runner did not start: {exc}"
                return outcome
            pump = LogPump(
                iter(lambda: proc.stdout.read1(65536), b""),
                out / "log.txt",
                self.console,
                f"{self.target.name}/{suite.name}",
            )
            pump.start()
            try:
                outcome.exit_code = self._watch(proc, t0 + timeout_s, token, outcome, name)
            finally:
                kill_run(token)  # children a finished runner left behind
                outcome.duration_s = time.monotonic() - t0
                pump.join(LOG_JOIN_S)
                if pump.error is not None:
                    outcome.notes.append(f"live log not kept: {pump.error}")
        outcome.started = (out / "started").exists()
        return outcome

    def _watch(self, proc, deadline: float, token: str, outcome: RunOutcome, name: str):
        """The exit code, or None after killing the run on the deadline or a cancel."""
        while proc.poll() is None:
            if self.cancel is not None and self.cancel.is_set():
                outcome.infra_error = "interrupted: the process tree was killed"
            elif time.monotonic() > deadline:
                self.console.line(name, "suite timeout reached: killing the process tree")
                outcome.watchdog_fired = True
            else:
                time.sleep(POLL_S)
                continue
            kill_run(token)
            proc.wait()
            return None
        return proc.returncode


def kill_run(token: str) -> int:
    """SIGKILL every process whose environment carries ``HIL_RUN_TOKEN=token``; how many."""
    needle = f"HIL_RUN_TOKEN={token}".encode()
    killed = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue  # gone already, or not ours to read
        if needle in environ.split(b"\0"):
            try:
                os.kill(int(proc.name), signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    return killed
