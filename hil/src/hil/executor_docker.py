"""Run one suite in a fresh container: create, copy in, start, stream, watch, copy out, remove.

The watchdog polls the container's state against a deadline and kills it when the deadline
passes: ``Container.wait(timeout=)`` only bounds the HTTP request, it stops nothing. The
container is removed in every case (``finally``), also when the daemon failed mid-run; a
removal that fails is reported in the run's notes.
"""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Optional

import docker
import requests

from hil.config import Suite, Target
from hil.logs import Console, LogPump
from hil.payload import (
    OUT_ROOT,
    PAYLOAD_ROOT,
    RUNNER,
    SPEC_NAME,
    build_payload,
    extract_safely,
    suite_spec,
)
from hil.status import RunOutcome

LABEL = "bi100-hil"
POLL_S = 0.5
LOG_JOIN_S = 5.0
INFRA_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException, OSError)


def ssh_support_missing(endpoint: str) -> str:
    """Why docker-py cannot open ``endpoint``, or "". docker 7.x's ssh transport module imports
    paramiko at its top, so without paramiko there is no ssh adapter at all, even with
    ``use_ssh_client = true`` (which only changes how the adapter connects: the system ssh)."""
    if not endpoint.startswith("ssh://"):
        return ""
    try:
        import paramiko  # noqa: F401
    except ImportError:
        return (
            "ssh:// endpoints need the paramiko package, also with use_ssh_client = true "
            "(docker-py 7.x imports it either way): pip install './hil[ssh]' "
            "(nox -s hil installs it)"
        )
    return ""


def connect(target: Target, timeout_s: Optional[float] = 60.0):
    """A pinged DockerClient for the target; raises with the endpoint named when unreachable.

    ``timeout_s`` bounds each API request; None (no bound) is for the log stream, which may be
    silent for longer than any request timeout while a 256K reference runs.
    """
    timeout = None if timeout_s is None else int(timeout_s)
    missing = ssh_support_missing(target.endpoint)
    if missing:
        raise ConnectionError(f"docker daemon unreachable at {target.endpoint}: {missing}")
    try:
        if target.endpoint == "env":
            client = docker.from_env(timeout=timeout)
        else:
            client = docker.DockerClient(
                base_url=target.endpoint,
                timeout=timeout,
                use_ssh_client=target.use_ssh_client,
            )
        client.ping()
        return client
    except INFRA_ERRORS as exc:
        raise ConnectionError(f"docker daemon unreachable at {target.endpoint}: {exc}") from exc


def container_kwargs(target: Target, env: dict) -> dict:
    """``containers.create`` arguments for the target's devices, mounts, limits and network."""
    kwargs = {
        "network_mode": target.network,
        "environment": env,
        "labels": {LABEL: "1"},
        "init": True,  # docker-init reaps zombies and forwards signals to the suite runner
        "working_dir": "/" + str(PAYLOAD_ROOT),
    }
    if target.devices:
        kwargs["devices"] = [d if ":" in d else f"{d}:{d}:rwm" for d in target.devices]
    if target.mounts:
        kwargs["volumes"] = list(target.mounts)
    if target.gpus:
        ids = None if target.gpus == ("all",) else list(target.gpus)
        count = -1 if ids is None else None
        kwargs["device_requests"] = [
            docker.types.DeviceRequest(
                driver="nvidia", count=count, device_ids=ids, capabilities=[["gpu"]]
            )
        ]
    if target.mem_limit:
        kwargs["mem_limit"] = target.mem_limit
        kwargs["memswap_limit"] = target.mem_limit  # no swap: an overrun is an OOM kill
    if target.shm_size:
        kwargs["shm_size"] = target.shm_size
    return kwargs


def container_payload(repo: Path, suite: Suite, target: Target) -> bytes:
    """The payload archive for a container (fixed paths: /hil/payload, /hil/out)."""
    spec = suite_spec(suite, "/" + str(PAYLOAD_ROOT), "/" + str(OUT_ROOT), target.test_timeout_s)
    return build_payload(repo, suite, spec)


class DockerExecutor:
    """``log_client``: a client without request timeout for the log stream (default: client)."""

    def __init__(
        self,
        client,
        image: str,
        target: Target,
        repo: Path,
        console: Console,
        log_client=None,
        archives: Optional[dict] = None,
    ):
        self.client, self.image, self.target = client, image, target
        self.repo, self.console = repo, console
        self.log_client = log_client or client
        self.archives = archives or {}  # suite name -> payload taken with the image's context
        self.cancel = None  # a threading.Event: when set, the running container is killed

    def run(self, suite: Suite, timeout_s: float, out: Path, env: dict, name: str) -> RunOutcome:
        out.mkdir(parents=True, exist_ok=True)
        payload_dir = "/" + str(PAYLOAD_ROOT)
        archive = self.archives.get(suite.name) or container_payload(self.repo, suite, self.target)
        prefix = f"{self.target.name}/{suite.name}"
        outcome = RunOutcome()
        container = None
        pump: Optional[LogPump] = None
        t0 = time.monotonic()
        try:
            container = self.client.containers.create(
                self.image,
                command=[
                    self.target.python,
                    f"{payload_dir}/{RUNNER}",
                    f"{payload_dir}/{SPEC_NAME}",
                ],
                name=name,
                **container_kwargs(self.target, env),
            )
            if not container.put_archive("/", archive):
                raise docker.errors.DockerException("put_archive refused the payload")
            container.start()
        except INFRA_ERRORS as exc:
            outcome.infra_error = f"container did not start: {exc}"
            self._remove(container, outcome)
            return outcome
        try:
            logs = self.log_client.api.logs(container.id, stream=True, follow=True)
            pump = LogPump(logs, out / "log.txt", self.console, prefix)
            pump.start()
            state = self._watch(container, t0 + timeout_s, outcome)
            outcome.exit_code = state.get("ExitCode") if not outcome.watchdog_fired else None
            outcome.oom_killed = bool(state.get("OOMKilled"))
            self._copy_out(container, out, outcome)
        except INFRA_ERRORS as exc:
            outcome.infra_error = f"lost the container mid-run: {exc}"
        finally:
            outcome.duration_s = time.monotonic() - t0
            if pump is not None:
                pump.join(LOG_JOIN_S)
                if pump.error is not None:
                    outcome.notes.append(f"live log not kept: {pump.error}")
            self._remove(container, outcome)
        outcome.started = (out / "started").exists()
        return outcome

    def _watch(self, container, deadline: float, outcome: RunOutcome) -> dict:
        while True:
            container.reload()
            state = container.attrs["State"]
            if state["Status"] in ("exited", "dead"):
                return state
            if self.cancel is not None and self.cancel.is_set():
                outcome.infra_error = "interrupted: the container was killed"
                container.kill()
                container.reload()
                return container.attrs["State"]
            if time.monotonic() > deadline:
                self.console.line(container.name, "suite timeout reached: killing the container")
                outcome.watchdog_fired = True
                try:
                    container.kill()
                    container.reload()
                except INFRA_ERRORS as exc:  # a process stuck in the driver may not die
                    outcome.notes.append(f"kill after the suite timeout failed: {exc}")
                return container.attrs["State"]
            time.sleep(POLL_S)

    def _copy_out(self, container, out: Path, outcome: RunOutcome) -> None:
        try:
            chunks, _ = container.get_archive("/" + str(OUT_ROOT))
            data = io.BytesIO(b"".join(chunks))
        except docker.errors.NotFound:
            outcome.notes.append("no results directory in the container")
            return
        extract_safely(data, out, strip=OUT_ROOT.name)

    def _remove(self, container, outcome: RunOutcome) -> None:
        if container is None:
            return
        for attempt in range(3):
            try:
                container.remove(force=True)
                return
            except docker.errors.NotFound:
                return
            except INFRA_ERRORS as exc:
                if attempt == 2:
                    outcome.notes.append(f"container {container.name} NOT removed: {exc}")
                time.sleep(1.0)
