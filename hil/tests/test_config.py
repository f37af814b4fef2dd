"""Config parsing: the shipped files, environment expansion, and errors that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from hil.config import expand, load_config, parse_config

REPO = Path(__file__).resolve().parents[2]
SUITES = REPO / "hil" / "suites" / "suites.toml"


def test_shipped_targets_and_suites_parse():
    config = load_config(REPO / "hil" / "targets.toml", SUITES, environ={})
    assert {"cpu-local", "bi-v100-lab", "nvidia-gpu", "h200-local"} <= set(config.targets)
    assert {"functional", "long-context"} <= set(config.suites)
    lab = config.targets["bi-v100-lab"]
    assert lab.devices == ("/dev/iluvatar0",)
    assert lab.mounts == ("/usr/local/corex:/usr/local/corex:ro",)
    assert lab.endpoint.startswith("ssh://")
    assert config.targets["nvidia-gpu"].gpus == ("0",)
    assert config.targets["cpu-local"].network == "none"
    assert config.targets["cpu-local"].suite_timeout(config.suites["long-context"]) == 600.0


def test_environment_overrides_defaults():
    env = {"DOCKER_HOST": "tcp://10.0.0.5:2375", "HIL_WHEELS": "/w"}
    config = load_config(REPO / "hil" / "targets.toml", SUITES, environ=env)
    assert config.targets["cpu-local"].endpoint == "tcp://10.0.0.5:2375"
    assert config.targets["cpu-local"].wheels == "/w"


def test_expand():
    assert expand("${A}-${B:-b}", {"A": "a"}) == "a-b"
    assert expand("${A:-x}", {"A": ""}) == "x"
    with pytest.raises(ValueError, match="environment variable NOPE is not set"):
        expand("${NOPE}", {})


def target(**fields) -> dict:
    return {"targets": {"t": {"endpoint": "unix:///x.sock", **fields}}}


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"device": "gpu"}, r"targets.t.device must be one of \('cpu', 'cuda'\), got 'gpu'"),
        ({"endpoint": "http://x"}, "targets.t.endpoint must be unix://, tcp://, ssh:// or 'env'"),
        ({"devices": "/dev/iluvatar0"}, "targets.t.devices must be list, got str"),
        ({"devices": [0]}, r"targets.t.devices must be a list of strings, got item 0"),
        ({"memlimit": "1g"}, r"targets.t has unknown keys \['memlimit'\]"),
        ({"mounts": ["/a"]}, "targets.t.mounts entries must be 'host:container"),
        ({"suite_timeouts": {"functional": -1}}, "targets.t.suite_timeouts.functional must be"),
        ({"probe_timeout_s": "5"}, "targets.t.probe_timeout_s must be float, got str"),
    ],
)
def test_target_errors_name_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        parse_config(target(**fields), environ={})


@pytest.mark.parametrize(
    "suite, message",
    [
        ({"steps": []}, "suites.s.steps must list at least one step, got none"),
        ({"steps": [{"name": "a"}]}, r"suites.s.steps\[0\] must have exactly one of"),
        ({"steps": [{"name": "a", "pytest": ["x"], "command": ["y"]}]}, "exactly one of"),
        ({"steps": [{"pytest": ["x"]}]}, r"suites.s.steps\[0\].name must be one path component"),
        (
            {"steps": [{"name": "a", "pytest": ["x"]}, {"name": "a", "command": ["y"]}]},
            "names must be unique",
        ),
        ({"steps": [{"name": "a", "pytest": ["x"]}], "timeout_s": 0}, "timeout_s must be > 0"),
    ],
)
def test_suite_errors_name_the_field(suite, message):
    with pytest.raises(ValueError, match=message):
        parse_config({**target(), "suites": {"s": suite}}, environ={})


def test_config_needs_a_target():
    with pytest.raises(ValueError, match="at least one"):
        parse_config({"targets": {}}, environ={})


def test_extra_suites_and_step_fields():
    data = {
        **target(),
        "suites": {
            "mine": {
                "timeout_s": 30,
                "payload": ["hil/tests/faults"],
                "steps": [{"name": "a", "pytest": ["p.py"], "markers": "not long", "timeout_s": 0}],
            }
        },
    }
    suite = parse_config(data, environ={}).suites["mine"]
    assert suite.timeout_s == 30.0 and suite.payload == ("hil/tests/faults",)
    assert suite.steps[0].timeout_s == 0.0 and suite.steps[0].markers == "not long"
