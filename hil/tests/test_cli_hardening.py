"""Issue 11, hil command line: --out, --run-id, --target, --help, python -m hil from the repo
root, the wrapped summary, and the ssh:// endpoint without paramiko."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hil_helpers import REPO

from hil import cli
from hil.config import Target
from hil.status import Counts, Status, SuiteResult
from hil.summary import render


@pytest.fixture
def no_run(monkeypatch):
    """Fails the test if a run starts: bad input must be refused before any target is touched."""

    def must_not_run(*a, **k):
        raise AssertionError("run_all was called")

    monkeypatch.setattr(cli, "run_all", must_not_run)


def base(tmp_path: Path) -> list:
    return ["--target", "cpu-local", "--suite", "functional", "--state", str(tmp_path / "s.json")]


def test_out_is_a_file(tmp_path, capsys, no_run):
    out = tmp_path / "results"
    out.write_text("not a directory")
    assert cli.main([*base(tmp_path), "--out", str(out), "--run-id", "r"]) == 2
    err = capsys.readouterr().err
    assert f"--out {out} is a file" in err and "Traceback" not in err
    assert out.read_text() == "not a directory"


def test_out_unwritable(tmp_path, capsys, no_run):
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    out = blocker / "sub"  # a path below a file can never be created, even by root
    assert cli.main([*base(tmp_path), "--out", str(out), "--run-id", "r"]) == 2
    err = capsys.readouterr().err
    assert f"--out {out}" in err and "cannot write" in err


def test_summary_that_cannot_be_written_is_exit_2(tmp_path, capsys, monkeypatch):
    def fake_run_all(targets, suites, ctx):
        (ctx.out / "summary.json").mkdir()  # something took the summary's name meanwhile
        return [SuiteResult("cpu-local", "functional", Status.PASS, Counts(passed=1))]

    monkeypatch.setattr(cli, "run_all", fake_run_all)
    code = cli.main([*base(tmp_path), "--out", str(tmp_path / "o"), "--run-id", "r"])
    captured = capsys.readouterr()
    assert code == 2 and "cannot write the summary" in captured.err
    assert "PASS" in captured.out  # the table was still printed


@pytest.mark.parametrize(
    "run_id", ["../../x", "..", "a/b", "/abs", ".hidden", "-dash", "a b", "x" * 101, "a..b"]
)
def test_run_id_must_be_one_safe_component(tmp_path, capsys, no_run, run_id):
    code = cli.main([*base(tmp_path), "--out", str(tmp_path / "o"), f"--run-id={run_id}"])
    assert code == 2
    assert "--run-id must be one path component" in capsys.readouterr().err
    assert not (tmp_path / "o").exists() and not (tmp_path / "x").exists()


@pytest.mark.parametrize("run_id", ["r", "2026-12-01_15.00", "lab-run.7"])
def test_good_run_ids(tmp_path, monkeypatch, run_id):
    monkeypatch.setattr(cli, "run_all", lambda targets, suites, ctx: [])
    assert cli.main([*base(tmp_path), "--out", str(tmp_path / "o"), "--run-id", run_id]) == 0
    assert (tmp_path / "o" / run_id / "summary.json").is_file()


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--target", "cpu-local,cpu-local", "--target names ['cpu-local'] more than once"),
        ("--target", "cpu-local,,h200-local", "--target has an empty name"),
        ("--target", ",", "--target has an empty name"),
        ("--suite", "functional,functional", "--suite names ['functional'] more than once"),
    ],
)
def test_repeated_or_empty_names_are_refused(tmp_path, capsys, no_run, option, value, message):
    argv = [*base(tmp_path), option, value, "--dry-run"]
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_help_lists_reset_target_and_exit_codes(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "reset-target NAME" in out and "reset-target --repair" in out and "--all" in out
    assert "1 test failures only" in out


def test_python_m_hil_from_the_repo_root_without_install(tmp_path):
    """-S: no site-packages, so no installed (or editable) hil; only tabulate is given. From the
    root, `hil/` is a namespace package and hil/__main__.py must run the real CLI."""
    import tabulate

    only = tmp_path / "only"
    only.mkdir()
    (only / "tabulate").symlink_to(Path(tabulate.__file__).parent)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(only)}
    if sys.version_info < (3, 11):  # tomli on 3.10
        import tomli

        (only / "tomli").symlink_to(Path(tomli.__file__).parent)
    proc = subprocess.run(
        [sys.executable, "-S", "-m", "hil", "--list-targets", "--state", str(tmp_path / "s")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "cpu-local" in proc.stdout and "bi-v100-lab" in proc.stdout


def test_summary_wraps_the_reason_instead_of_cutting_it():
    reason = (
        "docker daemon unreachable at ssh://hil@bi100-lab: ssh:// endpoints need the paramiko "
        "package, also with use_ssh_client = true: pip install './hil[ssh]' (end-of-reason)"
    )
    text = render([SuiteResult("lab", "functional", Status.ERROR, Counts(), 0.0, reason, "/r")])
    cells = [line.split("|")[8].strip() for line in text.splitlines()[2:]]
    assert " ".join(cells) == reason
    assert max(len(line) for line in text.splitlines()) < 200


def test_list_targets_wraps_a_long_quarantine_reason(tmp_path, capsys):
    from hil.quarantine import QuarantineStore

    state = tmp_path / "s.json"
    reason = "probe failed: " + " ".join(f"word{i}" for i in range(40)) + " END"
    QuarantineStore(state).quarantine("bi-v100-lab", reason)
    assert cli.main(["--list-targets", "--state", str(state)]) == 0
    out = capsys.readouterr().out
    assert "word39 END" in out and "word0" in out


def test_ssh_endpoint_without_paramiko_says_what_to_install(monkeypatch):
    pytest.importorskip("docker")
    from hil.executor_docker import connect

    monkeypatch.setitem(sys.modules, "paramiko", None)  # import paramiko -> ImportError
    lab = Target("lab", endpoint="ssh://hil@lab", use_ssh_client=True)
    with pytest.raises(ConnectionError) as err:
        connect(lab, timeout_s=1)
    msg = str(err.value)
    assert "ssh://hil@lab" in msg and "paramiko" in msg and "hil[ssh]" in msg


def test_docker_py_needs_paramiko_even_with_use_ssh_client():
    """The fact the fix rests on: docker 7.x's ssh adapter module imports paramiko at its top,
    so ``use_ssh_client=True`` alone cannot avoid it. If docker-py changes, revisit the extra."""
    docker = pytest.importorskip("docker")
    source = (Path(docker.__file__).parent / "transport" / "sshconn.py").read_text()
    assert "\nimport paramiko\n" in source


def test_ssh_extra_is_installed_by_nox_hil():
    pyproject = (REPO / "hil" / "pyproject.toml").read_text()
    assert 'ssh = ["paramiko' in pyproject
    noxfile = (REPO / "noxfile.py").read_text()
    hil_session = noxfile[noxfile.index("def hil(") :]
    assert 'session.install("-e", f"{HIL}[ssh]")' in hil_session
