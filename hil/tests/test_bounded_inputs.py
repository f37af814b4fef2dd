"""Config and state files with numbers too big to use or nesting past the parser's recursion
limit are bad input: a named error and exit 2, never a traceback; timeouts are bounded."""

from __future__ import annotations

import json

import pytest
from hil_helpers import REPO

from hil import cli
from hil.config import MAX_MEMORY_BYTES, MAX_SECONDS, ConfigError, load_config
from hil.quarantine import QuarantineStore, StateError

SUITES = REPO / "hil" / "suites" / "suites.toml"
TARGET = '[targets.t]\nendpoint = "unix:///x.sock"\n'
STEP = '[suites.s]\ntimeout_s = 5\n[[suites.s.steps]]\nname = "a"\ncommand = ["true"]\n'
HUGE = "9" * 400
DEEP_TOML = "x = " + "[" * 100_000 + "]" * 100_000 + "\n"
DEEP_JSON = '{"quarantine": ' + "[" * 100_000 + "]" * 100_000 + "}"


@pytest.mark.parametrize(
    "text, key",
    [
        (TARGET + f"probe_timeout_s = {HUGE}\n", "targets.t.probe_timeout_s"),
        (TARGET + f"test_timeout_s = {HUGE}\n", "targets.t.test_timeout_s"),
        (TARGET + "build_timeout_s = 1e300\n", "targets.t.build_timeout_s"),
        (TARGET + f"suite_timeouts = {{ s = {HUGE} }}\n" + STEP, "targets.t.suite_timeouts.s"),
        (TARGET + STEP.replace("timeout_s = 5", f"timeout_s = {HUGE}"), "suites.s.timeout_s"),
        (TARGET + STEP + f"timeout_s = {HUGE}\n", "suites.s.steps[0].timeout_s"),
        (TARGET + f'mem_limit = "{HUGE}g"\n', "targets.t.mem_limit"),
        (TARGET + 'shm_size = "2048000000g"\n', "targets.t.shm_size"),
    ],
)
def test_numbers_past_the_bound_name_the_key_and_the_limit(tmp_path, text, key):
    path = tmp_path / "targets.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path, SUITES, environ={})
    limit = f"{MAX_MEMORY_BYTES}" if "mem" in key or "shm" in key else f"{MAX_SECONDS:g}"
    assert key in str(err.value) and limit in str(err.value)


def test_deeply_nested_config_is_a_config_error(tmp_path):
    path = tmp_path / "targets.toml"
    path.write_text(TARGET + DEEP_TOML)
    with pytest.raises(ConfigError, match="nested"):
        load_config(path, SUITES, environ={})


@pytest.mark.parametrize(
    "text",
    [
        DEEP_JSON,
        '{"quarantine": {"t": {"reason": "r", "since": ' + "9" * 5000 + "}}}",
    ],
    ids=["deep", "5000-digit-int"],
)
def test_state_files_past_the_parser_are_state_errors(tmp_path, text):
    path = tmp_path / "s.json"
    path.write_text(text)
    with pytest.raises(StateError, match="reset-target --repair"):
        QuarantineStore(path).all()


@pytest.mark.parametrize("what", ["config-huge", "config-deep", "state-deep", "state-digits"])
def test_cli_exits_2_without_a_traceback(tmp_path, capsys, monkeypatch, what):
    config = tmp_path / "targets.toml"
    config.write_text(
        TARGET
        + {"config-huge": f"probe_timeout_s = {HUGE}\n", "config-deep": DEEP_TOML}.get(what, "")
    )
    state = tmp_path / "s.json"
    state.write_text(
        {
            "state-deep": DEEP_JSON,
            "state-digits": json.dumps({"quarantine": {}})[:-1] + ', "n": ' + "9" * 5000 + "}",
        }.get(what, "{}")
    )
    monkeypatch.setattr(cli, "run_all", lambda *a: pytest.fail("ran"))
    argv = ["--config", str(config), "--state", str(state), "--suite", "functional"]
    assert cli.main([*argv, "--list-targets"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hil: ") and "Traceback" not in err
    assert str(config if what.startswith("config") else state) in err
