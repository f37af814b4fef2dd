"""Shared fixtures: a reachable Docker engine (or a skip / CI failure), light test targets.

Engine: ``$DOCKER_HOST``, else the CI engine's socket (``.ci/docker-engine.sh``). Without one
the docker tests skip with the reason, and fail under ``CI=true``: CI must not go green by
skipping them. Fault-injection targets use a light image (the base plus pytest wheels, no
torch, no packages): it builds in seconds, and where the engine falls back to the vfs storage
driver every container is a full copy of its image; the real suites use the full image once.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest
from hil_helpers import DEFAULT_SOCKET, ENGINE_COMMAND, LIGHT_WHEELS, REPO, light_target

from hil.logs import Console
from hil.quarantine import QuarantineStore
from hil.runner import RunContext


def _engine_host() -> str:
    return os.environ.get("DOCKER_HOST") or DEFAULT_SOCKET


def _unavailable(why: str):
    msg = f"{why}; run `{ENGINE_COMMAND}` and export the DOCKER_HOST it prints"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and the HIL docker tests cannot run: {msg}")
    pytest.skip(msg)


@pytest.fixture(scope="session")
def engine():
    """(DockerClient, endpoint) of a reachable engine that has the base image."""
    import docker

    host = _engine_host()
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


@pytest.fixture(autouse=True)
def wheels_where_the_engine_script_left_none(monkeypatch, tmp_path_factory):
    """The shipped cpu-local target reads its wheels from ``$HIL_WHEELS`` or the engine script's
    /var/cache/hil/wheels, and a Docker run or plan of a target whose wheels directory is missing
    is refused. On a machine without that directory (a laptop), the CLI tests that plan or fake
    runs of cpu-local get an empty one; where the engine script ran, nothing changes."""
    if not os.environ.get("HIL_WHEELS") and not Path("/var/cache/hil/wheels").is_dir():
        monkeypatch.setenv("HIL_WHEELS", str(tmp_path_factory.mktemp("no-wheels")))


# --- HIL_TEST_REMOVE_IMAGES=1 (set by .ci/run): leave the engine's disk as the run found it.
# The suite image holds torch (the docker tests peak at +2.9 GB of disk under overlay2; the
# image alone is ~4.4 GB under the vfs fallback, each of its six layers a full copy), and a
# one-shot CI machine needs that disk for the later sessions (the torch 2.1 install alone
# unpacks to 4.7 GB). Elsewhere the images stay, so the next run reuses them. Runs once, in the
# process that is not an xdist worker, after every worker has finished.

_IMAGES_BEFORE = pytest.StashKey[set]()


def _remove_images_requested(config) -> bool:
    return os.environ.get("HIL_TEST_REMOVE_IMAGES") == "1" and not hasattr(config, "workerinput")


def _image_ids(client) -> set[str]:
    """Every top-level image, tagged or dangling (a failed build leaves its layers untagged);
    removing one removes the untagged layers below it."""
    return {image.id for image in client.images.list()}


def _client_or_none():
    try:
        import docker

        client = docker.DockerClient(base_url=_engine_host())
        client.ping()
        return client
    except Exception:  # no engine: the engine fixture reports it; nothing to clean here
        return None


def pytest_sessionstart(session):
    if _remove_images_requested(session.config) and (client := _client_or_none()):
        session.config.stash[_IMAGES_BEFORE] = _image_ids(client)


def pytest_sessionfinish(session, exitstatus):
    before = session.config.stash.get(_IMAGES_BEFORE, None)
    if before is None or not (client := _client_or_none()):
        return
    import docker

    built, removed = _image_ids(client) - before, 0
    for image_id in built:
        try:
            client.images.remove(image_id, force=True)
            removed += 1
        except docker.errors.APIError as exc:  # the tests' verdict stands; say what stays
            print(f"\nHIL_TEST_REMOVE_IMAGES=1: could not remove {image_id}: {exc}")
    print(f"\nHIL_TEST_REMOVE_IMAGES=1: removed {removed} of the {len(built)} image(s) built")
