"""Measurement files: every value a kept record gives is checked and named (issue 11).

``calibrate`` on a missing file or with ``num_seqs: -1`` was a traceback with exit 1; a NaN or
negative time gave "math domain error". Valid records of every accepted shape still read (see
test_calibrate.py for the fit itself).
"""

from __future__ import annotations

import copy
import json

import pytest
from _cli import assert_bad_input, run, stop_before

from attn_sim.measurements import parse_timings, read_timings

GOOD = {"case": {"path": "decode", "num_seqs": 4, "context": 8192}, "eager_s": 1e-3}


def _file(tmp_path, data) -> str:
    path = tmp_path / "m.json"
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return str(path)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("num_seqs", -1),
        ("num_seqs", 0),
        ("num_seqs", "4"),
        ("num_seqs", True),
        ("context", 0),
        ("context", 1.5),
        ("path", "encode"),
        ("head_size", 100),
        ("num_kv_heads", 5),
        ("block_size", 7),
        ("dtype", "float8"),
        ("tier", "two_pass"),
        ("query_len", 0),
    ],
)
def test_bad_case_value_names_record_and_key(key, value, tmp_path):
    record = copy.deepcopy(GOOD)
    record["case"][key] = value
    path = _file(tmp_path, [GOOD, record])
    with stop_before("attn_sim.calibrate.calibrate"):
        r = run("calibrate", path, "--out", str(tmp_path / "out"))
    shape_key = key in ("head_size", "num_kv_heads", "block_size")
    assert_bad_input(r, path, "record[1]", "shape" if shape_key else key)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1e-3, 0, "fast", [1]])
@pytest.mark.parametrize("key", ["eager_s", "graph_s", "median_ms", "measured_s"])
def test_bad_times_are_named(key, value, tmp_path):
    record = {"case": dict(GOOD["case"]), key: value}
    path = _file(tmp_path, {"records": [GOOD, record]})
    with stop_before("attn_sim.calibrate.calibrate"):
        r = run("calibrate", path, "--out", str(tmp_path / "out"))
    assert_bad_input(r, path, "records[1]", key)


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ({"foo": 1}, "holds no records"),
        ({"rows": {"a": 1}}, "rows must be a list"),
        (3, "must be a list of records"),
        ([1, 2], "record[0] must be an object"),
        ("{not json", "not readable JSON"),
        ([], "at least 2 usable cases"),
    ],
)
def test_wrong_file_shapes_are_named(data, named, tmp_path):
    path = _file(tmp_path, data)
    r = run("calibrate", path, "--out", str(tmp_path / "out"))
    assert_bad_input(r, path, named)


def test_missing_file_and_directory(tmp_path):
    assert_bad_input(run("calibrate", str(tmp_path / "nope.json")), "does not exist")
    assert_bad_input(run("calibrate", str(tmp_path)), "is a directory")


def test_tolerance_must_be_a_positive_number(tmp_path):
    path = _file(tmp_path, [GOOD, GOOD])
    for bad in ("nan", "-5", "0", "ten"):
        assert_bad_input(run("calibrate", path, "--tolerance", bad), "--tolerance")


def test_records_of_other_variants_and_skipped_cases_are_not_checked():
    # decode_bench rows of baselines, and HIL cases that did not fit, carry no usable time
    rows = [
        {"variant": "vllm v1", "batch": -1, "context": 1024, "ms": "n/a"},
        {"kind": "decode", "context_len": 4096, "skipped": "does not fit"},
        {"kind": "decode", "context_len": 4096, "median_s": 2e-3},
    ]
    timings = parse_timings({"rows": rows})
    assert [(t.case.context, t.eager_s) for t in timings] == [(4096, 2e-3)]


def test_hil_prefill_context_len_is_the_cached_prefix(tmp_path):
    rec = {"kind": "prefill", "context_len": 0, "query_len": 512, "median_s": 1e-3}
    path = tmp_path / "m.json"
    path.write_text(json.dumps([rec]))
    (timing,) = read_timings(path)
    assert (timing.case.context, timing.case.query_len) == (512, 512)
