"""The command line: listing, planning, refusing bad input, the summary and exit codes."""

from __future__ import annotations

import json

import pytest

from hil import cli
from hil.quarantine import QuarantineStore
from hil.status import Counts, Status, SuiteResult
from hil.summary import HEADERS, render


def test_list_targets_shows_quarantine(tmp_path, capsys):
    state = tmp_path / "s.json"
    QuarantineStore(state).quarantine("bi-v100-lab", "suite long-context hung")
    assert cli.main(["--list-targets", "--state", str(state)]) == 0
    out = capsys.readouterr().out
    assert "cpu-local" in out and "QUARANTINED: suite long-context hung" in out


def test_dry_run_plans_without_running(tmp_path, capsys):
    code = cli.main(
        [
            "--dry-run",
            "--target",
            "cpu-local",
            "--suite",
            "functional,long-context",
            "--state",
            str(tmp_path / "s.json"),
            "--wheels",
            "",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "image bi100-hil:" in out and "suite long-context (timeout 600 s" in out
    assert "attn-core, engine-patch, engine-patch-status, vllm-generate" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--target", "nope"], "unknown targets ['nope']"),
        (["--suite", "functional,nope"], "--suite must name suites from"),
        (["--config", "/nonexistent/targets.toml"], "No such file"),
    ],
)
def test_bad_input_exits_2_with_the_reason(argv, message, tmp_path, capsys):
    assert cli.main([*argv, "--state", str(tmp_path / "s.json"), "--dry-run"]) == 2
    assert message in capsys.readouterr().err


def test_run_writes_summary_and_returns_the_exit_code(monkeypatch, tmp_path, capsys):
    def fake_run_all(targets, suites, ctx):
        return [
            SuiteResult(
                t.name,
                s.name,
                Status.FAIL if s.name == "functional" else Status.PASS,
                Counts(passed=3, failed=1),
                1.5,
                "1 failing tests",
                "/x",
            )
            for t in targets
            for s in suites
        ]

    monkeypatch.setattr(cli, "run_all", fake_run_all)
    code = cli.main(
        [
            "--target",
            "cpu-local",
            "--out",
            str(tmp_path),
            "--run-id",
            "r",
            "--state",
            str(tmp_path / "s.json"),
        ]
    )
    assert code == 1
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["exit_code"] == 1 and len(summary["results"]) == 2
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines() if "cpu-local" in line]
    assert [[c.strip() for c in row[1:4]] for row in rows] == [
        ["cpu-local", "functional", "FAIL"],
        ["cpu-local", "long-context", "PASS"],
    ]


def test_summary_table_columns():
    text = render(
        [
            SuiteResult(
                "lab",
                "long-context",
                Status.HANG,
                Counts(passed=4),
                3600.0,
                "watchdog killed the run",
                "/r/lab/long-context",
            )
        ]
    )
    header = text.splitlines()[0]
    for column in HEADERS:
        assert column in header
    assert "HANG" in text and "/r/lab/long-context" in text


def test_reset_target(tmp_path, capsys):
    state = tmp_path / "s.json"
    QuarantineStore(state).quarantine("lab", "x")
    assert cli.main(["reset-target", "lab", "--state", str(state)]) == 0
    assert "quarantine lifted" in capsys.readouterr().out
    assert QuarantineStore(state).get("lab") is None


def test_local_executor_runs_without_the_docker_sdk(tmp_path):
    """The H200 has no Docker engine and no docker package: --executor local must not need it."""
    import subprocess
    import sys
    from pathlib import Path

    config = tmp_path / "targets.toml"
    config.write_text(
        '[targets.gpu-box]\ndevice = "cpu"\nprobe = ["true"]\n'
        "[suites.tiny]\ntimeout_s = 60\n"
        '[[suites.tiny.steps]]\nname = "hello"\ncommand = ["{python}", "-c", "print(42)"]\n'
    )
    code = (
        "import sys; sys.modules['docker'] = None; sys.modules['requests'] = None\n"
        "from hil.cli import main\n"
        f"sys.exit(main(['--executor', 'local', '--config', {str(config)!r}, '--suite', 'tiny',"
        f" '--out', {str(tmp_path / 'out')!r}, '--run-id', 'r', '--state',"
        f" {str(tmp_path / 's.json')!r}, '--quiet']))\n"
    )
    src = str(Path(__file__).resolve().parents[1] / "src")
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((tmp_path / "out" / "r" / "summary.json").read_text())
    assert [r["status"] for r in summary["results"]] == ["PASS"]
