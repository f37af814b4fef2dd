"""DockerExecutor against a fake client: the watchdog kills, containers always go away."""

from __future__ import annotations

from pathlib import Path

import docker
import pytest

from hil.config import Step, Suite, Target
from hil.executor_docker import DockerExecutor, container_kwargs
from hil.logs import Console

REPO = Path(__file__).resolve().parents[2]
SUITE = Suite("s", (Step(name="a", command=("true",)),), 1.0)


class FakeContainer:
    def __init__(self, exits_after: int = 10**9, start_error=None):
        self.name, self.polls, self.exits_after = "c", 0, exits_after
        self.killed = self.removed = False
        self.start_error = start_error
        self.attrs = {"State": {"Status": "created"}}

    def put_archive(self, path, data):
        return True

    def start(self):
        if self.start_error:
            raise self.start_error
        self.attrs["State"] = {"Status": "running"}

    id = "c0ffee"

    def reload(self):
        self.polls += 1
        if self.killed or self.polls > self.exits_after:
            self.attrs["State"] = {
                "Status": "exited",
                "ExitCode": 137 if self.killed else 0,
                "OOMKilled": False,
            }

    def kill(self):
        self.killed = True

    def get_archive(self, path):
        raise docker.errors.NotFound("no /hil/out")

    def remove(self, force):
        self.removed = True


class FakeClient:
    def __init__(self, container=None, create_error=None):
        self.container, self.create_error = container, create_error
        self.containers = self
        self.api = self

    def logs(self, container_id, stream, follow):
        return iter([b"hello\n", b"world"])

    def create(self, image, command, name, **kwargs):
        if self.create_error:
            raise self.create_error
        self.kwargs = kwargs
        return self.container


def executor(client, **target_fields):
    return DockerExecutor(client, "img", Target("t", **target_fields), REPO, Console(echo=False))


def test_watchdog_kills_a_container_that_never_exits(tmp_path, monkeypatch):
    monkeypatch.setattr("hil.executor_docker.POLL_S", 0.01)
    c = FakeContainer()
    outcome = executor(FakeClient(c)).run(SUITE, 0.2, tmp_path, {}, "n")
    assert outcome.watchdog_fired and c.killed and c.removed
    assert outcome.exit_code is None
    assert (tmp_path / "log.txt").read_bytes() == b"hello\nworld"


def test_a_normal_exit_is_not_a_hang(tmp_path, monkeypatch):
    monkeypatch.setattr("hil.executor_docker.POLL_S", 0.01)
    c = FakeContainer(exits_after=2)
    outcome = executor(FakeClient(c)).run(SUITE, 30.0, tmp_path, {}, "n")
    assert not outcome.watchdog_fired and outcome.exit_code == 0 and c.removed
    assert not outcome.started  # the fake wrote no start marker
    assert "no results directory" in outcome.notes[0]


@pytest.mark.parametrize("where", ["create", "start"])
def test_start_failures_are_infrastructure_errors(tmp_path, where):
    err = docker.errors.APIError("no such device /dev/iluvatar0")
    c = FakeContainer(start_error=err if where == "start" else None)
    client = FakeClient(c, create_error=err if where == "create" else None)
    outcome = executor(client).run(SUITE, 30.0, tmp_path, {}, "n")
    assert "container did not start" in outcome.infra_error
    assert c.removed == (where == "start")


def test_container_arguments_carry_devices_mounts_limits():
    t = Target(
        "lab",
        devices=("/dev/iluvatar0",),
        mounts=("/usr/local/corex:/usr/local/corex:ro",),
        gpus=("all",),
        mem_limit="8g",
        shm_size="1g",
    )
    kw = container_kwargs(t, {"A": "1"})
    assert kw["devices"] == ["/dev/iluvatar0:/dev/iluvatar0:rwm"]
    assert kw["volumes"] == ["/usr/local/corex:/usr/local/corex:ro"]
    assert kw["network_mode"] == "none" and kw["init"] is True
    assert kw["mem_limit"] == kw["memswap_limit"] == "8g" and kw["shm_size"] == "1g"
    req = kw["device_requests"][0]
    assert req["Driver"] == "nvidia" and req["Count"] == -1


def test_cancel_kills_and_removes_the_running_container(tmp_path, monkeypatch):
    import threading

    monkeypatch.setattr("hil.executor_docker.POLL_S", 0.01)
    c = FakeContainer()
    ex = executor(FakeClient(c))
    ex.cancel = threading.Event()
    ex.cancel.set()
    outcome = ex.run(SUITE, 300.0, tmp_path, {}, "n")
    assert "interrupted" in outcome.infra_error and not outcome.watchdog_fired
    assert c.killed and c.removed
