"""Issue 18, classes 2-4 (hil part): names from the config that become paths are single safe
path components, refused at load time with the file and the key; directories and files the
config names are checked when it loads; every key of a map-valued setting is checked against
the known ones; ``${...}`` either expands completely or is refused, never kept literally."""

from __future__ import annotations

import json
import re
import string
from pathlib import Path

import pytest
from hil_helpers import REPO
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from hil import cli
from hil.config import ConfigError, Suite, Target, expand, load_config
from hil.image import PACKAGES

SUITES = REPO / "hil" / "suites" / "suites.toml"
SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
BAD_NAMES = [
    "../../x",
    "..",
    ".",
    "a/b",
    "/abs",
    "",
    ".hidden",
    "-rf",
    "a\\b",
    "a\x00b",
    "a b",
    "x" * 101,
    "tab\there",
    "new\nline",
]


def toml_key(name: str) -> str:
    return json.dumps(name)  # a TOML basic string is a JSON string for these characters


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "targets.toml"
    path.write_text(text)
    return path


def load(tmp_path: Path, text: str, environ=None):
    return load_config(write(tmp_path, text), SUITES, environ=environ or {})


def refused(tmp_path: Path, text: str, *needles: str, environ=None) -> str:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, text, environ)
    msg = str(err.value)
    assert str(tmp_path / "targets.toml") in msg, msg
    for needle in needles:
        assert needle in msg, (needle, msg)
    return msg


# class 2: names that become paths


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_target_names_that_are_not_one_path_component_are_refused(tmp_path, name):
    refused(tmp_path, f'[targets.{toml_key(name)}]\nendpoint = "unix:///x.sock"\n', "targets.")


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_suite_and_step_names_are_refused(tmp_path, name):
    good = '[targets.t]\nendpoint = "unix:///x.sock"\n'
    suite = f'[suites.{toml_key(name)}]\n[[suites.{toml_key(name)}.steps]]\nname = "a"\n'
    refused(tmp_path, good + suite + 'command = ["true"]\n', "suites.")
    step = f'[suites.s]\n[[suites.s.steps]]\nname = {toml_key(name)}\ncommand = ["true"]\n'
    refused(tmp_path, good + step, "suites.s.steps[0].name")


@pytest.mark.parametrize("name", ["../../x", "a/b", ".."], ids=repr)
def test_cli_refuses_a_bad_target_name_with_exit_2_and_writes_nothing(tmp_path, capsys, name):
    config = write(tmp_path, f'[targets.{toml_key(name)}]\nendpoint = "unix:///x.sock"\n')
    out = tmp_path / "deep" / "out"
    argv = ["--config", str(config), "--out", str(out), "--state", str(tmp_path / "s.json")]
    for extra in (["--list-targets"], ["--dry-run"], ["--run-id", "r"]):
        assert cli.main([*argv, *extra]) == 2
        err = capsys.readouterr().err
        assert str(config) in err and "targets." in err and "Traceback" not in err
    assert not out.exists() and not (tmp_path / "x").exists()


@pytest.mark.parametrize("name", ["../x", "a/b", "", "."], ids=repr)
def test_targets_and_suites_built_in_code_refuse_path_names_too(name):
    with pytest.raises(ValueError, match="name"):
        Target(name=name)
    with pytest.raises(ValueError, match="name"):
        Suite(name=name, steps=(), timeout_s=1.0)


@pytest.mark.parametrize(
    "packages",
    ["../../etc", "attn-core ../x", "/etc", "nope", "attn-core/../sim", ".", "attn-core attn-core"],
)
def test_packages_build_arg_names_only_the_repositorys_packages(tmp_path, packages):
    text = f'[targets.t]\nendpoint = "unix:///x.sock"\nbuild_args = {{ PACKAGES = "{packages}" }}\n'
    msg = refused(tmp_path, text, "targets.t.build_args.PACKAGES")
    assert all(p in msg for p in PACKAGES), msg


@pytest.mark.parametrize("packages", ["", "sim", "attn-core engine-patch", " attn-core  sim "])
def test_packages_build_arg_good_values(tmp_path, packages):
    text = f'[targets.t]\nendpoint = "unix:///x.sock"\nbuild_args = {{ PACKAGES = "{packages}" }}\n'
    assert load(tmp_path, text).targets["t"].build_args["PACKAGES"] == packages


def test_a_missing_dockerfile_is_refused_at_load(tmp_path):
    text = '[targets.t]\nendpoint = "unix:///x.sock"\ndockerfile = "hil/docker/Nope"\n'
    refused(tmp_path, text, "targets.t.dockerfile", "hil/docker/Nope")


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_a_wheels_directory_that_is_not_one_is_refused_before_a_docker_run(tmp_path, capsys, kind):
    wheels = tmp_path / "wheels"
    if kind == "file":
        wheels.write_text("")
    config = write(tmp_path, f'[targets.t]\nendpoint = "unix:///x.sock"\nwheels = "{wheels}"\n')
    base = ["--config", str(config), "--state", str(tmp_path / "s.json"), "--out", str(tmp_path)]
    for extra in (["--dry-run"], ["--run-id", "r"]):
        assert cli.main([*base, *extra]) == 2
        err = capsys.readouterr().err
        assert str(config) in err and "targets.t.wheels" in err and str(wheels) in err, err
        assert "Errno" not in err and "Traceback" not in err
    # the target stays listable, and a local run never reads the image inputs
    assert cli.main([*base, "--list-targets"]) == 0
    assert "targets.t.wheels" in capsys.readouterr().out
    assert cli.main([*base, "--dry-run", "--executor", "local"]) == 0


def test_wheels_option_must_be_a_directory(tmp_path, capsys):
    argv = ["--dry-run", "--target", "cpu-local", "--wheels", str(tmp_path / "nope")]
    assert cli.main([*argv, "--state", str(tmp_path / "s.json")]) == 2
    assert "--wheels" in capsys.readouterr().err


def test_artifacts_stay_under_out(tmp_path):
    from hil.runner import artifact_dir

    out = tmp_path / "out" / "run"
    assert artifact_dir(out, "t", "functional") == out / "t" / "functional"
    for target, label in (("..", "x"), ("t", "../../x"), ("/abs", "x"), ("t", "a/../../b")):
        with pytest.raises(ValueError, match="outside"):
            artifact_dir(out, target, label)


# class 3: every key of a map checked


def test_suite_timeouts_with_an_unknown_suite_names_it_and_the_known_ones(tmp_path):
    text = '[targets.t]\nendpoint = "unix:///x.sock"\nsuite_timeouts = { functonal = 60 }\n'
    refused(tmp_path, text, "targets.t.suite_timeouts", "functonal", "functional", "long-context")


def test_suite_timeouts_may_name_a_suite_of_the_config_itself(tmp_path):
    text = (
        '[targets.t]\nendpoint = "unix:///x.sock"\nsuite_timeouts = { mine = 60 }\n'
        '[suites.mine]\n[[suites.mine.steps]]\nname = "a"\ncommand = ["true"]\n'
    )
    assert load(tmp_path, text).targets["t"].suite_timeouts == {"mine": 60.0}


def test_build_args_keys_are_the_dockerfiles_args(tmp_path):
    text = '[targets.t]\nendpoint = "unix:///x.sock"\nbuild_args = { PACKGES = "sim" }\n'
    refused(tmp_path, text, "targets.t.build_args", "PACKGES", "PACKAGES", "STATUS_CHECK")


@pytest.mark.parametrize("name", ["", "A=B", "=", "1A", "A B", "A-B", "a\x00"], ids=repr)
@pytest.mark.parametrize("table", ["environment", "build_args"])
def test_environment_and_build_arg_names_must_be_variable_names(tmp_path, name, table):
    text = f'[targets.t]\nendpoint = "unix:///x.sock"\n{table} = {{ {toml_key(name)} = "v" }}\n'
    refused(tmp_path, text, f"targets.t.{table}")


@SETTINGS
@given(
    key=st.text(string.ascii_letters + string.digits + "_-=. /", min_size=0, max_size=8),
    setting=st.sampled_from(["suite_timeouts", "build_args"]),
)
def test_any_unknown_map_key_is_an_error_naming_it(tmp_path_factory, key, setting):
    tmp = tmp_path_factory.mktemp("c")
    known = {"suite_timeouts": {"functional", "long-context", "device-facts"}}
    known["build_args"] = {"BASE_IMAGE", "PYTHON", "PACKAGES", "STATUS_CHECK"}
    value = 60 if setting == "suite_timeouts" else '"1"'
    entry = f"{setting} = {{ {toml_key(key)} = {value} }}"
    text = f'[targets.t]\nendpoint = "unix:///x.sock"\n{entry}\n'
    if key in known[setting]:
        load(tmp, text)
    else:
        refused(tmp, text, f"targets.t.{setting}", repr(key))


# class 4 (config part): ${...} expands completely or is refused


@pytest.mark.parametrize(
    "text, env, expected",
    [
        ("${A:-${B}}", {"B": "b"}, "b"),
        ("${A:-${B}}", {"A": "a"}, "a"),
        ("${A:-x${B:-y}z}", {}, "xyz"),
        ("${A:-${B:-${C:-deep}}}/w", {}, "deep/w"),
        ("pre-${A:-}-post", {}, "pre--post"),
        ("$HOME stays", {}, "$HOME stays"),
        ("a}b", {}, "a}b"),
    ],
)
def test_nested_defaults_expand(text, env, expected):
    assert expand(text, env) == expected


@pytest.mark.parametrize(
    "text",
    ["${A:-${B}}", "${A:-${B}", "${A", "${}", "${1A}", "${A-B}", "${A:=B}", "${A:?}", "${A:-}${"],
)
def test_unexpandable_text_is_refused(text):
    with pytest.raises(ValueError):
        expand(text, {})


def test_config_with_a_nested_default_is_refused_naming_the_key_or_expanded(tmp_path):
    text = '[targets.t]\nendpoint = "${A:-${B}}"\n'
    refused(tmp_path, text, "targets.t.endpoint", "B")
    config = load(tmp_path, text, environ={"B": "unix:///b.sock"})
    assert config.targets["t"].endpoint == "unix:///b.sock"


@SETTINGS
@given(
    text=st.text(alphabet="${}:-AB x", max_size=14),
    env=st.dictionaries(st.sampled_from(["A", "B"]), st.sampled_from(["", "v", "w x"])),
)
def test_expansion_never_keeps_a_reference(text, env):
    # every "$" of the text starts a reference (a lone "$" before "{" may be literal text)
    assume(all(text[i + 1 : i + 2] == "{" for i, c in enumerate(text) if c == "$"))
    try:
        got = expand(text, env)
    except ValueError:
        return
    if "${" not in "".join(env.values()):
        assert "${" not in got, (text, env, got)


def test_shipped_target_descriptions_name_no_person():
    config = load_config(REPO / "hil" / "targets.toml", SUITES, environ={})
    for t in config.targets.values():
        assert not re.search(r"\b(lead|my|our|his|her|their)\b|\w's\b", t.description, re.I), (
            t.name,
            t.description,
        )


@pytest.mark.parametrize("rel", ["../../etc", "/etc", "hil/../../x", "", "no/such/dir"])
def test_suite_payload_paths_stay_in_the_repository_and_exist(tmp_path, rel):
    text = (
        '[targets.t]\nendpoint = "unix:///x.sock"\n'
        f"[suites.s]\npayload = [{toml_key(rel)}]\n"
        '[[suites.s.steps]]\nname = "a"\ncommand = ["true"]\n'
    )
    refused(tmp_path, text, "suites.s.payload[0]")


def test_suite_payload_inside_the_repository_is_accepted(tmp_path):
    text = (
        '[targets.t]\nendpoint = "unix:///x.sock"\n'
        '[suites.s]\npayload = ["hil/tests/faults"]\n'
        '[[suites.s.steps]]\nname = "a"\ncommand = ["true"]\n'
    )
    assert load(tmp_path, text).suites["s"].payload == ("hil/tests/faults",)


@SETTINGS
@given(name=st.text(alphabet=string.ascii_letters + string.digits + "._-/\\ .:$~", max_size=12))
def test_a_target_name_loads_exactly_when_it_is_one_safe_path_component(tmp_path_factory, name):
    from hil.config_values import is_safe_name

    tmp = tmp_path_factory.mktemp("n")
    text = f'[targets.{toml_key(name)}]\nendpoint = "unix:///x.sock"\n'
    if is_safe_name(name):
        assert set(load(tmp, text).targets) == {name}
        assert ".." not in name and "/" not in name and not name.startswith((".", "-"))
    else:
        refused(tmp, text, "targets.")
