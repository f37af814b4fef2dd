"""``~`` in a path hil reads from the environment, the command line or the config is the home
directory, never a folder named ``~`` in the working directory."""

from __future__ import annotations

from pathlib import Path

import pytest
from hil_helpers import REPO

from hil import cli
from hil.config import ConfigError, load_config
from hil.quarantine import default_state_path
from hil.status import Counts, Status, SuiteResult

SUITES = REPO / "hil" / "suites" / "suites.toml"


@pytest.fixture
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    monkeypatch.delenv("HIL_STATE", raising=False)
    monkeypatch.delenv("HIL_CONFIG", raising=False)
    return home


@pytest.fixture
def fake_run(monkeypatch):
    seen = []

    def fake_run_all(targets, suites, ctx):
        seen.append(ctx)
        return [SuiteResult(targets[0].name, "functional", Status.PASS, Counts(passed=1))]

    monkeypatch.setattr(cli, "run_all", fake_run_all)
    return seen


@pytest.mark.parametrize(
    "environ, want",
    [
        ({"HIL_STATE": "~/s.json"}, "s.json"),
        ({"XDG_STATE_HOME": "~/st"}, "st/bi100-hil/state.json"),
    ],
)
def test_state_path_from_the_environment(home, environ, want):
    assert default_state_path(environ) == home / want


def test_environment_and_options_expand_home(home, monkeypatch, fake_run):
    (home / "t.toml").write_text((REPO / "hil" / "targets.toml").read_text())
    monkeypatch.setenv("HIL_STATE", "~/s.json")
    monkeypatch.setenv("HIL_CONFIG", "~/t.toml")
    monkeypatch.setenv("HIL_REPO", str(REPO))
    argv = ["--target", "cpu-local", "--suite", "functional", "--out", "~/o", "--run-id", "r"]
    assert cli.main(argv) == 0
    assert fake_run[0].out == home / "o" / "r"
    assert fake_run[0].store.path == home / "s.json"
    assert (home / "s.json.lock").exists()
    assert not (Path.cwd() / "~").exists()


def test_state_and_config_options_expand_home(home, fake_run):
    (home / "t.toml").write_text((REPO / "hil" / "targets.toml").read_text())
    argv = ["--config", "~/t.toml", "--state", "~/q.json", "--target", "cpu-local"]
    argv += ["--suite", "functional", "--out", "~/o", "--run-id", "r"]
    assert cli.main(argv) == 0
    assert fake_run[0].store.path == home / "q.json"
    assert not (Path.cwd() / "~").exists()


def test_reset_target_state_expands_home(home, monkeypatch):
    monkeypatch.setenv("HIL_STATE", "~/s.json")
    assert cli.main(["reset-target", "--all"]) == 0
    assert (home / "s.json.lock").exists() and not (Path.cwd() / "~").exists()


def test_config_paths_expand_home(home, tmp_path):
    (home / "wheels").mkdir()
    (home / "Dockerfile").write_text((REPO / "hil" / "docker" / "Dockerfile").read_text())
    path = tmp_path / "targets.toml"
    path.write_text(
        '[targets.t]\nendpoint = "unix:///x.sock"\nwheels = "~/wheels"\n'
        'dockerfile = "~/Dockerfile"\n'
    )
    t = load_config(path, SUITES, environ={}, repo=REPO).targets["t"]
    assert t.wheels == str(home / "wheels") and not t.unusable
    assert t.dockerfile == str(home / "Dockerfile")


def test_mount_from_home_is_refused_by_name(home, tmp_path):
    """A mount's host path is on the Docker host (the lab, over ssh), whose home this machine
    does not know: ``~`` there is an error, not this machine's home."""
    path = tmp_path / "targets.toml"
    path.write_text('[targets.t]\nendpoint = "unix:///x.sock"\nmounts = ["~/c:/c:ro"]\n')
    with pytest.raises(ConfigError, match=r"targets\.t\.mounts.*absolute.*'~/c:/c:ro'"):
        load_config(path, SUITES, environ={}, repo=REPO)
