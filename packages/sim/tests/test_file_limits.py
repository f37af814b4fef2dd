"""Every file ``python -m attn_sim`` reads goes through one loader that bounds what a file can
ask of the parser: an integer of 400 digits (an OverflowError where it met a float) or 100,000
levels of nesting (a RecursionError) is exit 2 naming the file, the key and the limit; a
profile whose ``base`` is a list (a TypeError) names the key. Also ``--shape`` sizes: a shape of
99,999,999 heads ran for more than ten minutes."""

from __future__ import annotations

import json

import pytest
from _cli import SMALL, assert_bad_input, run, toml_value

from attn_sim import files

BIG = int("9" * 400)
DEEP = "[" * 100_000 + "]" * 100_000


def _profile(**change):
    data = {"schema": "attn-core/profile/1", "base": "h200", "name": "h200+x", "fields": {}}
    data.update(change)
    return data


def _toml(data: dict) -> str:
    lines = []
    for section, body in data.items():
        if isinstance(body, dict):
            lines.append(f"[{section}]")
            lines += [f"{k} = {toml_value(v)}" for k, v in body.items()]
        else:
            lines.insert(0, f"{section} = {toml_value(body)}")
    return "\n".join(lines) + "\n"


def _cases(tmp_path):
    """(argv, file text, names the message must give)."""
    p = tmp_path / "f.json"
    big_profile = json.dumps(_profile(fields={"hbm_bandwidth": BIG}))
    gates_big = dict(SMALL, time={"tolerance": BIG})
    return {
        "profile int": (["report", "--profile", str(p)], big_profile, ["fields.hbm_bandwidth"]),
        "profile deep": (["report", "--profile", str(p)], DEEP, ["nested deeper than"]),
        "profile base list": (
            ["report", "--profile", str(p)],
            json.dumps(_profile(base=["h200"])),
            ["base", "['h200']"],
        ),
        "baseline int": (
            ["gates", "--baseline", str(p), "--out", ""],
            json.dumps({"profiles": {"bi-v100": {"x": {"time_s": BIG}}}}),
            ["baseline file", "time_s"],
        ),
        "baseline deep": (["gates", "--baseline", str(p), "--out", ""], DEEP, ["nested deeper"]),
        "gates int": (["gates", "--gates", str(p), "--out", ""], _toml(gates_big), ["tolerance"]),
        "gates deep": (
            ["gates", "--gates", str(p), "--out", ""],
            "a = " + "[" * 100_000 + "]" * 100_000 + "\n",
            ["gates file", "nested deeper"],
        ),
        "facts int": (["profile-from", str(p)], json.dumps({"schema": BIG}), ["schema"]),
        "facts deep": (["profile-from", str(p)], DEEP, ["facts file", "nested deeper"]),
        "measurements int": (
            ["calibrate", str(p), "--out", str(tmp_path / "c")],
            json.dumps({"records": [{"eager_s": BIG}]}),
            ["measurements file", "eager_s"],
        ),
        "measurements deep": (
            ["calibrate", str(p), "--out", str(tmp_path / "c")],
            DEEP,
            ["measurements file", "nested deeper"],
        ),
    }


NAMES = [
    "profile int",
    "profile deep",
    "profile base list",
    "baseline int",
    "baseline deep",
    "gates int",
    "gates deep",
    "facts int",
    "facts deep",
    "measurements int",
    "measurements deep",
]


@pytest.mark.parametrize("name", NAMES)
def test_file_inputs_are_bounded_and_named(tmp_path, name):
    argv, text, names = _cases(tmp_path)[name]
    (tmp_path / "f.json").write_text(text)
    r = run(*argv)
    assert_bad_input(r, str(tmp_path / "f.json"), *names)


def test_loader_names_the_key_of_a_huge_integer(tmp_path):
    path = tmp_path / "a.json"
    path.write_text(json.dumps({"a": {"b": [1, BIG]}}))
    with pytest.raises(ValueError) as info:
        files.read_json(path, "thing file")
    text = str(info.value)
    assert f"thing file {path}" in text and "a.b[1]" in text and "400 digits" in text


def test_loader_reads_ordinary_files(tmp_path):
    path = tmp_path / "a.json"
    path.write_text(json.dumps({"a": [1, 2.5, {"b": None}], "n": 2**62}))
    assert files.read_json(path, "x")["n"] == 2**62
    toml = tmp_path / "a.toml"
    toml.write_text("a = 1\n[b]\nc = [1, 2]\n")
    assert files.read_toml(toml, "x") == {"a": 1, "b": {"c": [1, 2]}}


@pytest.mark.parametrize("shape", ["99999999,1,64", "4096,4096,64", "2048,1,64,16"])
def test_report_shape_is_bounded(shape):
    r = run("report", "--shape", shape, "--out", "/nonexistent-never-written")
    assert_bad_input(r, "--shape", "<= 1024")


def test_paths_expand_tilde(monkeypatch, tmp_path):
    """``--profile=~/p.json``, ``--out=~/o`` (the shell leaves ``~`` after ``=``) and a gates
    file's profile ``~/p.json`` name files under $HOME."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "p.json").write_text(json.dumps(_profile(base="bi-v100", name="bi-v100+t")))
    gates = dict(SMALL, profiles=["~/p.json"])
    (tmp_path / "g.toml").write_text(_toml(gates))
    r = run("gates", "--gates=~/g.toml", "--out=~/o")
    assert r.code in (0, 1), r.err
    assert "bi-v100+t" in r.out
    assert (tmp_path / "o" / "gates.json").is_file()
