"""Issue 11, hil config: every bad value is refused at load time with the file, the dotted key,
what was expected and what was found; through the CLI that is exit 2 without a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from hil_helpers import REPO

from hil import cli
from hil.config import ConfigError, load_config

SUITES = REPO / "hil" / "suites" / "suites.toml"
GOOD = '[targets.t]\nendpoint = "unix:///x.sock"\n'
STEP = '[suites.s]\ntimeout_s = 5\n[[suites.s.steps]]\nname = "a"\n'


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "targets.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "extra, key, expected, actual",
    [
        ("probe_timeout_s = -5", "targets.t.probe_timeout_s", "> 0 seconds", "-5"),
        ("probe_timeout_s = 0", "targets.t.probe_timeout_s", "> 0 seconds", "0"),
        ("test_timeout_s = 0", "targets.t.test_timeout_s", "> 0 seconds", "0"),
        ("build_timeout_s = -1", "targets.t.build_timeout_s", "> 0 seconds", "-1"),
        ("build_timeout_s = nan", "targets.t.build_timeout_s", "finite", "nan"),
        ("test_timeout_s = inf", "targets.t.test_timeout_s", "finite", "inf"),
        ("probe_timeout_s = true", "targets.t.probe_timeout_s", "float", "True"),
        ('mem_limit = "lots"', "targets.t.mem_limit", "Docker memory size", "'lots'"),
        ('shm_size = "-1g"', "targets.t.shm_size", "Docker memory size", "'-1g'"),
        ("mem_limit = 4", "targets.t.mem_limit", "must be str", "4"),
        ("environment = { A = [1] }", "targets.t.environment.A", "a string", "[1]"),
        ("environment = { A = 2 }", "targets.t.environment.A", "a string", "2"),
        ("build_args = { A = true }", "targets.t.build_args.A", "a string", "True"),
        ("suite_timeouts = { s = 0 }", "targets.t.suite_timeouts.s", "> 0 seconds", "0"),
        ('suite_timeouts = { s = "1" }', "targets.t.suite_timeouts.s", "float", "'1'"),
        ('endpoint2 = "x"', "targets.t", "expected some of", "endpoint2"),
        ('wheels = "${NOPE_NOT_SET}"', "targets.t.wheels", "not set", "NOPE_NOT_SET"),
        ("probe = [1, 2]", "targets.t.probe", "list of strings", "item 1"),
    ],
)
def test_target_values_refused_at_load(tmp_path, extra, key, expected, actual):
    path = write(tmp_path, GOOD + extra + "\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, SUITES, environ={})
    msg = str(err.value)
    assert str(path) in msg and key in msg and expected in msg and actual in msg, msg


@pytest.mark.parametrize(
    "text, key, expected",
    [
        ('targets = "x"', "targets", "must be a table"),
        ("suites = { foo = 1 }\n" + GOOD, "suites.foo", "must be a table"),
        ("suites = 3\n" + GOOD, "suites", "must be a table"),
        (GOOD + STEP + "command = [1, 2]", "suites.s.steps[0].command", "list of strings"),
        (GOOD + STEP + 'command = "echo"', "suites.s.steps[0].command", "must be list"),
        (GOOD + STEP + 'command = ["x"]\ntimeout_s = -1', "suites.s.steps[0].timeout_s", ">= 0"),
        (GOOD + "[suites.s]\nsteps = [1]", "suites.s.steps[0]", "must be a table"),
        ("[targets]\nv = 3\n" + GOOD, "targets.v", "must be a table"),
        ("[targets.t\n", "not valid TOML", ""),
    ],
)
def test_structure_errors_name_file_and_key(tmp_path, text, key, expected):
    path = write(tmp_path, text + "\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, SUITES, environ={})
    msg = str(err.value)
    assert str(path) in msg and key in msg and expected in msg, msg


def test_command_placeholders_are_not_expanded(tmp_path):
    path = write(tmp_path, GOOD + STEP + 'command = ["{python}", "${X}"]\n')
    step = load_config(path, SUITES, environ={}).suites["s"].steps[0]
    assert step.command == ("{python}", "${X}")


@pytest.mark.parametrize("good", ["4g", "512m", "1.5g", "1024", "100K", "7b", "4gb", "64GB"])
def test_docker_memory_strings_accepted(tmp_path, good):
    path = write(tmp_path, GOOD + f'mem_limit = "{good}"\n')
    assert load_config(path, SUITES, environ={}).targets["t"].mem_limit == good
    docker_utils = pytest.importorskip("docker.utils")
    assert docker_utils.parse_bytes(good) > 0  # what the engine call will do with it


def test_bad_suites_toml_is_named(tmp_path):
    config = write(tmp_path, GOOD)
    suites = tmp_path / "suites.toml"
    suites.write_text("[suites.x]\nsteps = []\n")
    with pytest.raises(ConfigError, match=f"{suites}: suites.x.steps must list"):
        load_config(config, suites, environ={})


@pytest.mark.parametrize(
    "text, key",
    [
        ('targets = "x"', "targets"),
        ("suites = { foo = 1 }\n" + GOOD, "suites.foo"),
        (GOOD + "probe_timeout_s = -5", "targets.t.probe_timeout_s"),
        (GOOD + STEP + "command = [1, 2]", "suites.s.steps[0].command"),
        ("= broken", "not valid TOML"),
    ],
)
@pytest.mark.parametrize("mode", [["--dry-run"], ["--list-targets"], []])
def test_cli_bad_config_exits_2_naming_file_and_key(tmp_path, capsys, monkeypatch, text, key, mode):
    def must_not_run(*a, **k):
        raise AssertionError("a bad config must stop before anything runs")

    monkeypatch.setattr(cli, "run_all", must_not_run)
    path = write(tmp_path, text + "\n")
    argv = ["--config", str(path), "--state", str(tmp_path / "s.json"), "--executor", "local"]
    code = cli.main([*argv, "--out", str(tmp_path / "out"), *mode])
    err = capsys.readouterr().err
    assert code == 2
    assert str(path) in err and key in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_cli_config_path_that_cannot_be_read(tmp_path, capsys, kind):
    path = tmp_path / "targets.toml"
    if kind == "directory":
        path.mkdir()
    code = cli.main(["--config", str(path), "--list-targets", "--state", str(tmp_path / "s")])
    err = capsys.readouterr().err
    assert code == 2 and f"config file {path} (--config" in err, err
