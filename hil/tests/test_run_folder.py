"""One run per run folder: a second run with the same --out and --run-id is refused (exit 2,
nothing runs), so two runs never interleave one log or keep one summary; a default run id
that is taken gets a suffix instead."""

from __future__ import annotations

import json

import pytest

from hil import cli
from hil.status import Counts, Status, SuiteResult


def args(tmp_path, *extra):
    return [
        "--target",
        "cpu-local",
        "--suite",
        "functional",
        "--state",
        str(tmp_path / "s.json"),
        "--out",
        str(tmp_path / "o"),
        *extra,
    ]


@pytest.fixture
def runs(monkeypatch):
    seen = []

    def fake_run_all(targets, suites, ctx):
        seen.append(ctx.out)
        return [SuiteResult("cpu-local", "functional", Status.PASS, Counts(passed=1))]

    monkeypatch.setattr(cli, "run_all", fake_run_all)
    return seen


def test_second_run_with_the_same_run_id_is_refused(tmp_path, capsys, runs):
    assert cli.main(args(tmp_path, "--run-id", "r")) == 0
    summary = (tmp_path / "o" / "r" / "summary.json").read_text()
    capsys.readouterr()
    assert cli.main(args(tmp_path, "--run-id", "r")) == 2
    err = capsys.readouterr().err
    assert "RunFolderExists" in err and str(tmp_path / "o" / "r") in err
    assert "Traceback" not in err
    assert len(runs) == 1  # the second did not run
    assert (tmp_path / "o" / "r" / "summary.json").read_text() == summary


def test_default_run_ids_never_share_a_folder(tmp_path, monkeypatch, runs):
    monkeypatch.setattr(cli.time, "strftime", lambda fmt, *a: "20261206-000000")
    assert cli.main(args(tmp_path)) == 0
    assert cli.main(args(tmp_path)) == 0
    assert [p.name for p in runs] == ["20261206-000000", "20261206-000000-2"]
    for p in runs:
        assert json.loads((p / "summary.json").read_text())["run_id"] == p.name
