"""Property tests: random bad arguments and files for every ``attn_sim`` subcommand.

For each subcommand hypothesis feeds (1) random extra arguments, (2) random values of its
arguments and (3) random or randomly broken input files, and asserts what issue 11 asks of a
CLI: no traceback, an exit code from the documented set {0, 1, 2}, and for bad input exit 2
with a message naming the argument, the file and the key. Expensive work is replaced by a stub
that raises ``Reached`` (tests/_cli.py), so an accepted input costs nothing; where the oracle is
a library check (``AttentionShape``, ``profile_from_json``) an accepted input must pass it too.
Everything runs with the working directory in a temporary one (default outputs land there).
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
from _cli import (
    DELETE,
    SMALL,
    Result,
    assert_bad_input,
    assert_clean,
    changed,
    run,
    stop_before,
    to_toml,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attn_core.core.shapes import AttentionShape
from attn_core.device.profile_file import profile_from_json
from attn_core.device.spec import DEVICE_SPECS
from attn_sim.config import DECODE_TIERS
from attn_sim.facts import PROFILE_FACTS
from attn_sim.workloads import DTYPES

PROPERTY = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
STUBS = {
    "report": ("attn_sim.report.build",),
    "gates": ("attn_sim.gates.run_gates",),
    "update-baseline": ("attn_sim.simulate.simulate", "attn_sim.config.save_baseline"),
    "calibrate": ("attn_sim.calibrate.run",),
    "sweep": ("attn_sim.sweep.sweep_plan",),
    "occupancy": (),
    "profile-from": ("attn_sim.profile_from.moved_times",),
}
SAMPLE_FACTS = json.loads((Path(__file__).parent / "data" / "device_facts_sample.json").read_text())

# Text a shell could pass that cannot escape the temporary working directory.
relative_text = st.text(max_size=16).filter(
    lambda t: "\x00" not in t and not t.startswith(("/", "~")) and ".." not in t
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
# Values no key of a gates file accepts: strings, booleans, negatives, non-finite numbers, and
# non-empty lists of those.
bad_scalar = (
    st.text(max_size=10)
    | st.booleans()
    | st.integers(max_value=-1)
    | st.sampled_from([math.nan, math.inf, -math.inf, -0.5])
)
bad_gate_value = bad_scalar | st.lists(st.booleans() | st.integers(max_value=-1), min_size=1)


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("")
    return tmp_path


def _run_stubbed(command: str, *argv: str):
    with stop_before(*STUBS[command]):
        return run(command, *argv)


def _holds(check: Callable[[], object]) -> bool:
    """Whether the oracle ``check`` accepts the input; its ValueError is a refusal."""
    try:
        return bool(check())
    except ValueError:
        return False


def _assert_reached_exactly_when(ok: bool, r: Result, *names: str) -> None:
    """An input the oracle accepts reaches the work; any other is refused naming ``names``."""
    if ok:
        assert r.code == "reached", r.err
    else:
        assert_bad_input(r, *names)


# --- every subcommand: random extra arguments -------------------------------------------------

BASE_ARGS = {
    "report": (),
    "gates": ("--gates", "small.toml", "--baseline", "missing-ok.json"),
    "update-baseline": ("--gates", "small.toml", "--baseline", "b.json"),
    "calibrate": ("m.json",),
    "sweep": ("--profile", "bi-v100"),
    "occupancy": ("--threads", "128"),
    "profile-from": ("facts.json",),
}


@pytest.mark.parametrize("command", sorted(STUBS))
@PROPERTY
@given(extra=st.lists(relative_text, max_size=4))
def test_random_extra_arguments(command, extra, in_tmp):
    (in_tmp / "small.toml").write_text(to_toml(SMALL))
    (in_tmp / "m.json").write_text("[]")
    (in_tmp / "facts.json").write_text(json.dumps(SAMPLE_FACTS))
    r = _run_stubbed(command, *BASE_ARGS[command], *extra)
    assert_clean(r)


# --- every argument that takes free text: random text -----------------------------------------

FREE_TEXT_ARGS = [  # (command, option, the rest of its arguments)
    ("report", "--shape", ()),
    ("gates", "--profiles", ("--baseline", "b.json")),
    ("update-baseline", "--profiles", ("--baseline", "b.json")),
    ("sweep", "--profile", ()),
]


@pytest.mark.parametrize(("command", "option", "rest"), FREE_TEXT_ARGS)
@PROPERTY
@given(text=st.text(max_size=20).filter(lambda t: "\x00" not in t))
def test_random_text_argument(command, option, rest, text):
    r = _run_stubbed(command, option, text, *rest)
    assert_clean(r)
    if r.code != "reached":
        assert_bad_input(r, option)


# --- report ------------------------------------------------------------------------------------


@PROPERTY
@given(parts=st.lists(st.integers(-4, 300), min_size=1, max_size=5))
def test_report_shape_is_accepted_exactly_when_attention_shape_accepts_it(parts):
    text = ",".join(map(str, parts))
    r = _run_stubbed("report", "--shape", text)
    ok = _holds(lambda: len(parts) in (3, 4) and AttentionShape(*parts) is not None)
    _assert_reached_exactly_when(ok, r, "--shape")


@PROPERTY
@given(name=relative_text.filter(lambda t: t not in DEVICE_SPECS))
def test_report_unknown_profile(name):
    assert_bad_input(_run_stubbed("report", "--profile", name), "--profile")


@PROPERTY
@given(data=json_values)
def test_report_random_profile_file(data, in_tmp):
    path = in_tmp / "profile.json"
    path.write_text(json.dumps(data))
    r = _run_stubbed("report", "--profile", str(path))
    ok = _holds(lambda: profile_from_json(data, str(path)).name.split("+")[0] in DEVICE_SPECS)
    _assert_reached_exactly_when(ok, r, "--profile", str(path))


@PROPERTY
@given(sub=relative_text)
def test_report_out_under_a_file(sub):
    assert_bad_input(_run_stubbed("report", "--out", f"a_file/{sub}"), "--out", "a_file")


# --- gates and update-baseline ---------------------------------------------------------------

REQUIRED = [
    "profiles",
    "decode",
    "prefill",
    "plan",
    "time",
    "decode.cases",
    "decode.max_launches",
    "decode.max_plan_launches",
    "decode.max_syncs",
    "decode.transient_kv_ratio",
    "decode.transient_floor_bytes",
    "prefill.cases",
    "prefill.max_syncs",
    "prefill.transient_over_kv_bytes",
    "plan.batches",
    "plan.context_min",
    "plan.context_max",
    "plan.steps_per_octave",
    "time.tolerance",
]
OPTIONAL = [
    "decode.max_launches_by_tier",
    "decode.profile",
    "decode.profile.bi-v100.transient_kv_ratio",
]


@pytest.mark.parametrize("command", ["gates", "update-baseline"])
@PROPERTY
@given(
    change=st.one_of(
        st.tuples(st.sampled_from(REQUIRED), st.just(DELETE)),
        st.tuples(st.sampled_from(REQUIRED + OPTIONAL), bad_gate_value),
    )
)
def test_broken_gates_file_names_file_and_key(command, change, in_tmp):
    key, value = change
    path = in_tmp / "gates.toml"
    path.write_text(to_toml(changed(SMALL, key, value)))
    r = _run_stubbed(command, "--gates", str(path), "--baseline", "b.json")
    assert_bad_input(r, str(path), key)


@pytest.mark.parametrize("command", ["gates", "update-baseline"])
@PROPERTY
@given(text=st.text(max_size=60))
def test_random_gates_file_is_named(command, text, in_tmp):
    path = in_tmp / "gates.toml"
    path.write_text(text)
    assert_bad_input(_run_stubbed(command, "--gates", str(path)), str(path))


@PROPERTY
@given(data=json_values)
def test_random_baseline_file(data, in_tmp):
    (in_tmp / "small.toml").write_text(to_toml(SMALL))
    path = in_tmp / "baseline.json"
    path.write_text(json.dumps(data))
    r = _run_stubbed("gates", "--gates", "small.toml", "--baseline", str(path))
    if r.code != "reached":  # {"profiles": {}} and the like are valid baselines
        assert_bad_input(r, str(path))


@PROPERTY
@given(sub=relative_text)
def test_update_baseline_under_a_file(sub, in_tmp):
    (in_tmp / "small.toml").write_text(to_toml(SMALL))
    r = _run_stubbed("update-baseline", "--gates", "small.toml", "--baseline", f"a_file/{sub}x")
    assert_bad_input(r, "--baseline", "a_file")


# --- calibrate ---------------------------------------------------------------------------------

GOOD_RECORD = {"case": {"path": "decode", "num_seqs": 4, "context": 8192}, "eager_s": 1e-3}
not_int = st.text(max_size=6) | st.booleans() | st.lists(st.integers(), max_size=2)
not_int |= st.floats(allow_nan=True).filter(lambda f: not (math.isfinite(f) and f.is_integer()))
bad_count = not_int | st.integers(max_value=0)
bad_time = (
    st.floats(max_value=0.0)
    | st.sampled_from([math.nan, math.inf])
    | st.text(max_size=6)
    | st.booleans()
    | st.lists(st.floats(), max_size=2)
)
BAD_RECORD_VALUES = {
    "num_seqs": bad_count | st.integers(min_value=1025),
    "context": bad_count | st.integers(min_value=(1 << 24) + 1),
    "query_len": bad_count,
    "num_heads": bad_count,
    "num_kv_heads": bad_count,
    "head_size": bad_count,
    "block_size": bad_count,
    "dtype": st.text(max_size=8).filter(lambda t: t.replace("torch.", "") not in DTYPES),
    "tier": st.text(min_size=1, max_size=8).filter(lambda t: t not in DECODE_TIERS),
    "path": json_values.filter(lambda v: v not in ("decode", "prefill") and v is not None),
}


@PROPERTY
@given(data=st.data())
def test_calibrate_broken_record_names_file_record_and_key(data, in_tmp):
    key = data.draw(
        st.sampled_from(sorted(BAD_RECORD_VALUES) + ["eager_s", "graph_s", "median_ms"])
    )
    value = data.draw(BAD_RECORD_VALUES.get(key, bad_time))
    record = copy.deepcopy(GOOD_RECORD)
    if key in BAD_RECORD_VALUES:
        record["case"][key] = value
    else:
        record[key] = value
    path = in_tmp / "m.json"
    path.write_text(json.dumps({"records": [GOOD_RECORD, record]}))
    with stop_before("attn_sim.calibrate.calibrate"):
        r = run("calibrate", str(path))
    assert_bad_input(r, str(path), "records[1]", key)


@PROPERTY
@given(data=json_values)
def test_calibrate_random_file(data, in_tmp):
    path = in_tmp / "m.json"
    path.write_text(json.dumps(data))
    with stop_before("attn_sim.calibrate.calibrate"):
        r = run("calibrate", str(path))
    if r.code != "reached":
        assert_bad_input(r, str(path))


@PROPERTY
@given(text=st.text(max_size=12))
def test_calibrate_tolerance(text, in_tmp):
    (in_tmp / "m.json").write_text("[]")
    r = _run_stubbed("calibrate", "m.json", "--tolerance", text)
    ok = _holds(lambda: math.isfinite(float(text)) and float(text) > 0)
    _assert_reached_exactly_when(ok, r, "--tolerance")


# --- sweep and occupancy -----------------------------------------------------------------------


@PROPERTY
@given(sub=relative_text)
def test_sweep_out_under_a_file(sub):
    assert_bad_input(_run_stubbed("sweep", "--profile", "h200", "--out", f"a_file/{sub}"), "--out")


int_text = st.integers(-10, 10**6).map(str) | st.text(max_size=6)


@PROPERTY
@given(threads=int_text, registers=int_text, smem=int_text, blocks=int_text)
def test_occupancy_numbers(threads, registers, smem, blocks):
    args = {"--threads": threads, "--registers": registers, "--smem": smem, "--blocks": blocks}
    r = run("occupancy", *[x for kv in args.items() for x in kv])
    assert_clean(r)
    bad = [k for k, v in args.items() if not _int_ok(v, 1 if k == "--threads" else 0)]
    if bad:
        assert_bad_input(r, bad[0] if len(bad) == 1 else "argument --")
    else:
        assert r.code == 0 and "blocks/SM, limited by" in r.out


def _int_ok(text: str, lo: int) -> bool:
    return _holds(lambda: int(text) >= lo)


# --- profile-from ------------------------------------------------------------------------------

not_positive = (
    st.integers(max_value=-1)
    | st.floats(max_value=-1e-12)
    | st.sampled_from([math.nan, math.inf])
    | st.text(max_size=6)
    | st.booleans()
    | st.lists(st.integers(), min_size=1, max_size=2)
    | st.dictionaries(st.text(max_size=3), st.integers(), min_size=1, max_size=2)
)
BAD_TOP = {
    "schema": json_values.filter(lambda v: v != "bi100-attn/device-facts/1"),
    "target": st.integers() | st.booleans() | st.none() | st.just("  "),
    "date": st.integers() | st.booleans() | st.none() | st.just("") | st.just("not a date"),
    "device_name": st.integers() | st.booleans() | st.none(),
    "torch": st.integers() | st.booleans() | st.none(),
    "quick": st.integers() | st.text(max_size=4) | st.none(),
    "facts": st.integers() | st.text(max_size=4) | st.lists(st.integers(), max_size=2),
}


@PROPERTY
@given(data=st.data())
def test_profile_from_broken_facts_name_file_and_key(data, in_tmp):
    facts = copy.deepcopy(SAMPLE_FACTS)
    if data.draw(st.booleans()):
        name = data.draw(st.sampled_from(PROFILE_FACTS))
        value = data.draw(not_positive)
        facts["facts"][name] = {"value": value, "unit": "", "method": "test"}
        named = f"facts.{name}.value"
    else:
        named = data.draw(st.sampled_from(sorted(BAD_TOP)))
        if data.draw(st.booleans()):
            del facts[named]
        else:
            facts[named] = data.draw(BAD_TOP[named])
    path = in_tmp / "facts.json"
    path.write_text(json.dumps(facts))
    r = _run_stubbed("profile-from", str(path), "--out", "p.json")
    assert_bad_input(r, str(path), named)
    assert not (in_tmp / "p.json").exists()


@PROPERTY
@given(data=json_values)
def test_profile_from_random_file(data, in_tmp):
    path = in_tmp / "facts.json"
    path.write_text(json.dumps(data))
    assert_bad_input(_run_stubbed("profile-from", str(path)), str(path))


@PROPERTY
@given(name=st.text(max_size=16).filter(lambda t: "\x00" not in t))
def test_profile_from_name(name, in_tmp):
    (in_tmp / "facts.json").write_text(json.dumps(SAMPLE_FACTS))
    r = _run_stubbed(
        "profile-from", "facts.json", "--base", "h200", "--name", name, "--out", "p.json"
    )
    assert_clean(r)
    if r.code != "reached":
        assert_bad_input(r, "--name")
    else:
        assert name.startswith("h200+")
