"""Shared fixtures: a reachable Docker engine (or a skip / CI failure), light test targets.

Engine: ``$DOCKER_HOST``, else the CI engine's socket (``.ci/docker-engine.sh``). Without one
the docker tests skip with the reason, and fail under ``CI=true``: CI must not go green by
skipping them. Fault-injection targets use a light image (the base plus pytest wheels, no
torch, no packages) because under the vfs storage driver every container is a full copy of
its image; the real suites use the full image once.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

from hil.config import Step, Suite, Target
from hil.logs import Console
from hil.quarantine import QuarantineStore
from hil.runner import RunContext

REPO = Path(__file__).resolve().parents[2]
FAULTS = "hil/tests/faults"
DEFAULT_SOCKET = "unix:///run/hil-docker.sock"
LIGHT_WHEELS = ("pytest-", "pytest_timeout-", "pluggy-", "iniconfig-", "packaging-", "pygments-")


def _unavailable(why: str):
    msg = f"{why}; run `bash .ci/docker-engine.sh` and export the DOCKER_HOST it prints"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and the HIL docker tests cannot run: {msg}")
    pytest.skip(msg)


@pytest.fixture(scope="session")
def engine():
    """(DockerClient, endpoint) of a reachable engine that has the base image."""
    import docker

    host = os.environ.get("DOCKER_HOST") or DEFAULT_SOCKET
    try:
        client = docker.DockerClient(base_url=host, timeout=300)
        client.ping()
    except Exception as exc:  # any failure to reach it is the same "no engine" here
        _unavailable(f"no reachable Docker engine at {host} ({type(exc).__name__}: {exc})")
    base = os.environ.get("HIL_BASE_IMAGE", "hil-base:bookworm")
    try:
        client.images.get(base)
    except docker.errors.ImageNotFound:
        _unavailable(f"the engine at {host} has no base image {base}")
    return client, host


@pytest.fixture(scope="session")
def wheels_dir():
    path = Path(os.environ.get("HIL_WHEELS", "/var/cache/hil/wheels"))
    if not any(path.glob("torch-*.whl")):
        _unavailable(f"no torch wheel in {path} (HIL_WHEELS)")
    return path


@pytest.fixture(scope="session")
def light_wheels(wheels_dir, tmp_path_factory):
    """pytest and pytest-timeout with their dependencies, nothing else."""
    out = tmp_path_factory.mktemp("light-wheels")
    for whl in wheels_dir.glob("*.whl"):
        if whl.name.startswith(LIGHT_WHEELS):
            shutil.copy(whl, out / whl.name)
    return out


def light_target(host: str, wheels: Path, name: str = "", **changes) -> Target:
    fields = dict(
        name=name or f"light-{uuid.uuid4().hex[:6]}",
        endpoint=host,
        device="cpu",
        base_image=os.environ.get("HIL_BASE_IMAGE", "hil-base:bookworm"),
        wheels=str(wheels),
        build_args={"PACKAGES": "", "STATUS_CHECK": "0"},
        probe=("{python}", "-c", "print('probe ok')"),
        probe_timeout_s=60.0,
        test_timeout_s=60.0,
        mem_limit="512m",
    )
    fields.update(changes)
    return Target(**fields)


@pytest.fixture(scope="session")
def light_image(engine, light_wheels):
    """Build the light image once per session, so tests measure runs and not the build."""
    from hil.image import ensure_image

    client, host = engine
    t = light_target(host, light_wheels)
    args = {"BASE_IMAGE": t.base_image, "PYTHON": t.python, **t.build_args}
    return ensure_image(
        client,
        REPO,
        REPO / "hil/docker/Dockerfile",
        str(light_wheels),
        args,
        lambda line: None,
        900,
    )


def fault_suite(name: str, *steps: tuple, timeout_s: float = 120.0) -> Suite:
    """Suite of pytest steps over fault files: ``(step name, file, per-test timeout or None)``."""
    built = tuple(Step(name=s, pytest=(f"{FAULTS}/{f}",), timeout_s=t) for s, f, t in steps)
    return Suite(name, built, timeout_s, payload=(FAULTS,))


OK = ("ok", "fault_ok.py", None)


@pytest.fixture
def make_ctx(tmp_path):
    def make(executor: str = "docker", **changes) -> RunContext:
        run_id = f"t{uuid.uuid4().hex[:8]}"
        fields = dict(
            repo=REPO,
            out=tmp_path / "results" / run_id,
            run_id=run_id,
            store=QuarantineStore(tmp_path / "state.json"),
            console=Console(echo=os.environ.get("HIL_TEST_ECHO") == "1"),
            executor=executor,
        )
        fields.update(changes)
        return RunContext(**fields)

    return make


def leftovers(client, run_id: str) -> list:
    """Containers of this run still on the engine (there must be none)."""
    found = client.containers.list(all=True, filters={"label": "bi100-hil"})
    return [c.name for c in found if c.name.startswith(f"hil-{run_id}-")]
