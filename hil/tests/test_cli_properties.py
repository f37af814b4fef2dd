"""Property tests (issue 11): random bad arguments and random bad config / state files fed to
``python -m hil``. Whatever comes in: no traceback, an exit code from the documented set
(0 ok, 1 test failures, 2 bad input / infrastructure), and a refusal names the offending
argument, file or dotted key. Runs are never started (run_all is replaced), so no Docker."""

from __future__ import annotations

import io
import json
import math
import re
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from unittest import mock

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from hil import cli

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TARGETS = ("t", "u")
SUITES = ("s",)
GOOD_CONFIG = {
    "targets": {"t": {"endpoint": "unix:///x.sock"}, "u": {"device": "cpu"}},
    "suites": {"s": {"timeout_s": 5, "steps": [{"name": "a", "command": ["{python}", "-V"]}]}},
}
OPTIONS = [a for action in cli.build_parser()._actions for a in action.option_strings]


# --- TOML writer for the generated configs (the standard library only reads TOML) -----------
def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        # a TOML basic string: JSON escapes U+0000-U+001F; TOML also forbids a raw DEL (U+007F)
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def toml_doc(data: dict) -> str:
    lines = [f"{k} = {toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for section, tables in data.items():
        if not isinstance(tables, dict):
            continue
        for name, table in tables.items():
            if not isinstance(table, dict):
                lines.insert(0, f"{section}.{json.dumps(name)} = {toml_value(table)}")
                continue
            lines.append(f"[{section}.{json.dumps(name)}]")
            lines += [f"{json.dumps(k)} = {toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def call(argv: list) -> tuple:
    """(exit code, stdout, stderr) of cli.main, argparse's SystemExit included."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    return code, out.getvalue(), err.getvalue()


class Sandbox:
    """A temporary directory with a good config, a state file path and an --out root."""

    def __init__(self, config: dict = GOOD_CONFIG):
        self._tmp = tempfile.TemporaryDirectory()
        self.root = Path(self._tmp.name)
        self.config = self.root / "targets.toml"
        self.config.write_text(toml_doc(config))
        self.state = self.root / "state" / "s.json"
        self.out = self.root / "out"

    def argv(self, *extra: str) -> list:
        return [
            "--config", str(self.config), "--state", str(self.state),
            "--out", str(self.out), "--executor", "local", *extra,
        ]  # fmt: skip

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._tmp.cleanup()


def fake_run_all(targets, suites, ctx):
    return []


def check(code: int, out: str, err: str) -> None:
    assert "Traceback" not in out + err, out + err
    assert code in (0, 1, 2), (code, err)


text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)


def names_oracle(raw: str, known) -> bool:
    """Whether a comma-separated --target/--suite value is acceptable (empty: the default)."""
    if not raw.strip():
        return True
    items = [x.strip() for x in raw.split(",")]
    return all(items) and len(set(items)) == len(items) and set(items) <= set(known)


@SETTINGS
@given(raw=text | st.lists(st.sampled_from([*TARGETS, "x", "", " "]), max_size=4).map(",".join))
def test_target_argument(raw):
    with Sandbox() as box, mock.patch.object(cli, "run_all", fake_run_all):
        code, out, err = call(box.argv(f"--target={raw}", "--suite", "s", "--run-id", "r"))
        check(code, out, err)
        if names_oracle(raw, TARGETS):
            assert code == 0, err
        else:
            assert code == 2 and "--target" in err, err
            assert not box.out.exists()


@SETTINGS
@given(raw=text | st.lists(st.sampled_from(["s", "functional", "x", ""]), max_size=3).map(",".join))
def test_suite_argument(raw):
    with Sandbox() as box, mock.patch.object(cli, "run_all", fake_run_all):
        code, out, err = call(box.argv(f"--suite={raw}", "--run-id", "r"))
        check(code, out, err)
        known = ("s", "functional", "long-context")
        if raw.strip() and names_oracle(raw, known):
            assert code == 0, err
        else:
            assert code == 2 and "--suite" in err, err


@SETTINGS
@given(run_id=text | st.sampled_from(["..", "../x", "../../x", "a/../../b", ".", "/etc", "a/b"]))
def test_run_id_stays_inside_out(run_id):
    """Whatever --run-id is, artifacts land in exactly one new directory directly under --out,
    or the run is refused naming --run-id."""
    with Sandbox() as box, mock.patch.object(cli, "run_all", fake_run_all):
        code, out, err = call(box.argv(f"--run-id={run_id}"))
        check(code, out, err)
        assert {p.name for p in box.root.iterdir()} <= {"out", "state", "targets.toml"}
        if code == 2:
            assert "--run-id" in err and not box.out.exists()
        else:
            (made,) = box.out.iterdir()
            assert made.resolve().parent == box.out.resolve()
            assert (made / "summary.json").is_file()
            if run_id:
                assert made.name == run_id


@SETTINGS
@given(
    option=st.sampled_from(["--executor", "--out", "--config", "--state", "--unknown", "-x"]),
    value=st.sampled_from(["bogus", "file", "missing-dir", "garbage-toml", "dir"]),
)
def test_bad_option_values_name_the_option_or_path(option, value):
    with Sandbox() as box, mock.patch.object(cli, "run_all", fake_run_all):
        paths = {
            "file": box.root / "a-file",
            "missing-dir": box.root / "no" / "such" / "x",
            "garbage-toml": box.root / "garbage.toml",
            "dir": box.root / "a-dir",
        }
        paths["file"].write_text("[not toml")
        paths["garbage-toml"].write_text("= = =")
        paths["dir"].mkdir()
        # "bogus": a plain word for --executor, a new path inside the sandbox for the others
        bogus = "bogus" if option == "--executor" else str(box.root / "bogus")
        arg = str(paths.get(value, bogus))
        code, out, err = call([*box.argv("--run-id", "r"), option, arg])
        check(code, out, err)
        if option == "--executor":
            assert code == 2 and "--executor" in err
        elif option in ("--unknown", "-x"):
            assert code == 2 and option in err
        elif option == "--out":
            if value in ("file", "garbage-toml"):
                assert code == 2 and f"--out {arg}" in err
            else:
                assert code == 0, err
        elif option == "--config":
            assert code == 2 and arg in err, err
        elif option == "--state":
            if value in ("file", "garbage-toml", "dir"):
                assert code == 2 and arg in err, err
            else:
                assert code == 0, err


@SETTINGS
@given(args=st.lists(text | st.sampled_from(OPTIONS + ["reset-target", "--all", "--repair"])))
def test_random_argument_lists(args):
    """Anything at all: documented exit code, no traceback; a run (if it comes to one) writes
    only under the sandbox's --out (run_all is replaced)."""
    assume("--help" not in args and "-h" not in args)
    with Sandbox() as box, mock.patch.object(cli, "run_all", fake_run_all):
        # the sandbox's --config/--state/--out come after, so they win over random ones
        code, out, err = call([*args, *box.argv()])
        check(code, out, err)
        if code == 2:
            assert err.strip(), "a refusal must say why"


# --- config files --------------------------------------------------------------------------
no_dollar = st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="$")
nonpositive = (
    st.integers(max_value=0)
    | st.floats(max_value=0, allow_nan=False)
    | st.sampled_from([math.nan, math.inf, -math.inf])
)
not_a_number = st.text(no_dollar, max_size=5) | st.booleans() | st.lists(st.integers(), max_size=2)
bad_timeout = nonpositive | not_a_number
bad_memory = (
    st.text(no_dollar, max_size=8).filter(
        lambda s: not re.fullmatch(r"[0-9]+(\.[0-9]+)?([kmgKMG][bB]?|[bB])?", s)
    )
    | st.integers()
    | st.booleans()
)
non_string = st.integers() | st.booleans() | st.lists(st.integers(), max_size=2) | st.floats()
bad_env = st.dictionaries(st.from_regex(r"[A-Z]{1,5}", fullmatch=True), non_string, min_size=1)
bad_list = st.lists(non_string, min_size=1, max_size=3) | st.text(no_dollar, max_size=4)

TARGET_MUTATIONS = {
    "probe_timeout_s": bad_timeout,
    "test_timeout_s": bad_timeout,
    "build_timeout_s": bad_timeout,
    "mem_limit": bad_memory,
    "shm_size": bad_memory,
    "environment": bad_env,
    "build_args": bad_env,
    "devices": bad_list,
    "mounts": bad_list,
    "gpus": bad_list,
    "probe": bad_list,
    "device": st.text(no_dollar, max_size=6).filter(lambda s: s not in ("cpu", "cuda")),
    "endpoint": st.text(no_dollar, max_size=8).filter(
        lambda s: s != "env" and not s.startswith(("unix://", "tcp://", "ssh://", "npipe://"))
    ),
    "use_ssh_client": non_string.filter(lambda v: not isinstance(v, bool)) | st.text(max_size=3),
    "suite_timeouts": st.dictionaries(st.sampled_from(["s", "x"]), bad_timeout, min_size=1),
}


@SETTINGS
@given(
    key=st.sampled_from(sorted(TARGET_MUTATIONS)),
    data=st.data(),
    mode=st.sampled_from([["--dry-run"], ["--list-targets"], ["--run-id", "r"]]),
)
def test_bad_target_values(key, data, mode):
    value = data.draw(TARGET_MUTATIONS[key], label=key)
    config = json.loads(json.dumps(GOOD_CONFIG))
    config["targets"]["u"][key] = value
    with Sandbox(config) as box, mock.patch.object(cli, "run_all", fake_run_all):
        code, out, err = call(box.argv(*mode))
        check(code, out, err)
        assert code == 2, (value, err)
        assert str(box.config) in err and f"targets.u.{key}" in err, err
        assert not box.out.exists()


step_mutations = {
    "command": bad_list,
    "timeout_s": st.integers(max_value=-1) | not_a_number,
    "name": non_string | st.just(""),
    "junit": non_string.filter(lambda v: not isinstance(v, bool)),
}


@SETTINGS
@given(key=st.sampled_from(sorted(step_mutations)), data=st.data())
def test_bad_step_values(key, data):
    value = data.draw(step_mutations[key], label=key)
    config = json.loads(json.dumps(GOOD_CONFIG))
    config["suites"]["s"]["steps"][0][key] = value
    with Sandbox(config) as box:
        # steps are arrays of tables: write them inline (TOML 1.0 allows it)
        code, out, err = call(box.argv("--dry-run"))
        check(code, out, err)
        assert code == 2, (value, err)
        assert str(box.config) in err and "suites.s.steps[0]" in err, err


@SETTINGS
@given(
    section=st.sampled_from(["targets", "suites"]),
    value=non_string | st.text(no_dollar, max_size=5),
    name=st.from_regex(r"[a-z]{1,6}", fullmatch=True),
    whole=st.booleans(),
)
def test_wrong_shapes(section, value, name, whole):
    """``targets = "x"``, ``suites = { foo = 1 }`` and the like."""
    config = json.loads(json.dumps(GOOD_CONFIG))
    if whole:
        config[section] = value
        key = section
    else:
        config[section][name] = value
        key = f"{section}.{name}"
    with Sandbox(config) as box:
        code, out, err = call(box.argv("--list-targets"))
        check(code, out, err)
        assert code == 2 and str(box.config) in err and key in err, err


@SETTINGS
@given(raw=st.text(max_size=200))
def test_random_config_text(raw):
    with Sandbox() as box, mock.patch.object(cli, "run_all", fake_run_all):
        box.config.write_text(raw)
        code, out, err = call(box.argv("--dry-run"))
        check(code, out, err)
        if code == 2:
            assert str(box.config) in err, err


@SETTINGS
@given(
    raw=st.text(max_size=80)
    | st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(st.sampled_from(["quarantine", "t", "reason"]), inner, max_size=3)
        ),
        max_leaves=8,
    ).map(json.dumps),
    command=st.sampled_from([["--list-targets"], ["--dry-run"], ["reset-target", "t"]]),
)
def test_random_state_files(raw, command):
    with Sandbox() as box:
        box.state.parent.mkdir()
        box.state.write_bytes(raw.encode())
        argv = [*command, "--state", str(box.state)]
        if command[0] != "reset-target":
            argv += ["--config", str(box.config), "--executor", "local"]
        code, out, err = call(argv)
        check(code, out, err)
        if code == 2:
            assert str(box.state) in err and "reset-target --repair" in err, err
            assert box.state.read_bytes() == raw.encode()  # never overwritten
