"""Issue 11, the quarantine state file: atomic writes, corrupt files reported with their path
and exit 2 (never a traceback, never overwritten), one repair command that keeps the old file,
a missing directory created, an unwritable one refused with its path before a run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hil import cli
from hil.quarantine import QuarantineStore, StateError

BAD_STATES = {
    "not json": "{not json",
    "empty": "",
    "a list": "[]",
    "quarantine a list": '{"quarantine": []}',
    "entry a string": '{"quarantine": {"lab": "x"}}',
    "entry without reason": '{"quarantine": {"lab": {"since": "then"}}}',
    "not utf-8": b"\xff\xfe\x00".decode("latin-1"),
}


@pytest.fixture(params=sorted(BAD_STATES))
def corrupt(request, tmp_path) -> Path:
    path = tmp_path / "state.json"
    path.write_bytes(BAD_STATES[request.param].encode("latin-1"))
    return path


def test_store_reports_corrupt_file_with_path_and_repair_command(corrupt):
    with pytest.raises(StateError) as err:
        QuarantineStore(corrupt).all()
    assert str(corrupt) in str(err.value) and "reset-target --repair" in str(err.value)
    before = corrupt.read_bytes()
    with pytest.raises(StateError):
        QuarantineStore(corrupt).quarantine("lab", "probe failed")
    with pytest.raises(StateError):
        QuarantineStore(corrupt).release("lab")
    assert corrupt.read_bytes() == before  # never overwritten


@pytest.mark.parametrize(
    "argv",
    [
        ["--dry-run", "--executor", "local", "--target", "cpu-local"],
        ["--list-targets"],
        ["--target", "cpu-local", "--executor", "local"],  # a real run stops before starting
        ["reset-target", "lab"],
        ["reset-target", "--all"],
    ],
)
def test_cli_corrupt_state_exits_2_naming_the_file(corrupt, capsys, monkeypatch, tmp_path, argv):
    monkeypatch.setattr(cli, "run_all", lambda *a: pytest.fail("run_all called"))
    before = corrupt.read_bytes()
    extra = [] if argv[0] == "reset-target" else ["--out", str(tmp_path / "o")]
    code = cli.main([*argv, "--state", str(corrupt), *extra])
    err = capsys.readouterr().err
    assert code == 2, err
    assert str(corrupt) in err and "reset-target --repair" in err and "Traceback" not in err
    assert corrupt.read_bytes() == before


def test_repair_moves_the_corrupt_file_aside_and_starts_fresh(corrupt, capsys):
    before = corrupt.read_bytes()
    assert cli.main(["reset-target", "--repair", "--state", str(corrupt)]) == 0
    out = capsys.readouterr().out
    kept = [p for p in corrupt.parent.iterdir() if p.name.startswith("state.json.corrupt-")]
    assert len(kept) == 1 and kept[0].read_bytes() == before and str(kept[0]) in out
    assert json.loads(corrupt.read_text()) == {"quarantine": {}}
    assert cli.main(["--list-targets", "--state", str(corrupt)]) == 0


def test_repair_of_a_good_file_changes_nothing(tmp_path, capsys):
    state = tmp_path / "s.json"
    QuarantineStore(state).quarantine("lab", "hung")
    before = state.read_text()
    assert cli.main(["reset-target", "--repair", "--state", str(state)]) == 0
    assert "nothing to repair" in capsys.readouterr().out
    assert state.read_text() == before and sorted(p.name for p in tmp_path.iterdir()) == [
        "s.json",
        "s.json.lock",
    ]


def test_two_repairs_keep_both_files(tmp_path):
    state = tmp_path / "s.json"
    for text in ("one{", "two{"):
        state.write_text(text)
        QuarantineStore(state).repair()
    kept = sorted(p.read_text() for p in tmp_path.glob("s.json.corrupt-*"))
    assert kept == ["one{", "two{"]


def test_reset_all_and_usage(tmp_path, capsys):
    state = tmp_path / "s.json"
    for name in ("a", "b"):
        QuarantineStore(state).quarantine(name, "hung")
    assert cli.main(["reset-target", "--all", "--state", str(state)]) == 0
    assert "a, b" in capsys.readouterr().out and QuarantineStore(state).all() == {}
    with pytest.raises(SystemExit) as exit_:  # neither NAME nor --all nor --repair
        cli.main(["reset-target", "--state", str(state)])
    assert exit_.value.code == 2


def test_release_of_an_absent_entry_does_not_write(tmp_path):
    state = tmp_path / "s.json"
    QuarantineStore(state).quarantine("a", "hung")
    mtime = state.stat().st_mtime_ns
    assert QuarantineStore(state).release("nope") is False
    assert state.stat().st_mtime_ns == mtime


def test_writes_are_atomic_and_fsynced(tmp_path, monkeypatch):
    """A temporary file in the same directory, fsync'ed, then os.replace onto the state file: a
    crash at any point leaves the old file or the new one."""
    state = tmp_path / "s.json"
    QuarantineStore(state).quarantine("a", "old")
    calls = []
    real_replace, real_fsync = os.replace, os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append(("fsync", fd)) or real_fsync(fd))

    def replace(src, dst):
        calls.append(("replace", Path(src), Path(dst)))
        # the old content is intact until the rename
        assert json.loads(state.read_text())["quarantine"]["a"]["reason"] == "old"
        assert json.loads(Path(src).read_text())["quarantine"]["a"]["reason"] == "new"
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    QuarantineStore(state).quarantine("a", "new")
    kinds = [c[0] for c in calls]
    assert kinds.index("fsync") < kinds.index("replace")
    src, dst = next(c[1:] for c in calls if c[0] == "replace")
    assert src.parent == dst.parent == tmp_path and dst == state
    assert not list(tmp_path.glob("*.tmp"))


def test_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    state = tmp_path / "s.json"
    QuarantineStore(state).quarantine("a", "old")
    before = state.read_text()

    def boom(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        QuarantineStore(state).quarantine("b", "new")
    assert state.read_text() == before and not list(tmp_path.glob("*.tmp"))


def test_missing_state_directory_is_created_by_a_run(tmp_path, monkeypatch):
    state = tmp_path / "deep" / "er" / "state.json"
    monkeypatch.setattr(cli, "run_all", lambda targets, suites, ctx: [])
    argv = ["--target", "cpu-local", "--state", str(state), "--out", str(tmp_path / "o")]
    assert cli.main([*argv, "--run-id", "r"]) == 0
    assert state.parent.is_dir()


def test_reads_need_no_directory(tmp_path, capsys):
    state = tmp_path / "missing" / "state.json"
    assert cli.main(["--list-targets", "--state", str(state)]) == 0
    assert cli.main(["--dry-run", "--executor", "local", "--state", str(state)]) == 0
    assert not state.parent.exists()  # listing and planning write nothing


def test_unwritable_state_refuses_a_run_with_the_path(tmp_path, capsys, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    state = blocker / "state.json"  # below a file: cannot be created, even by root
    monkeypatch.setattr(cli, "run_all", lambda *a: pytest.fail("run_all called"))
    argv = ["--target", "cpu-local", "--state", str(state), "--out", str(tmp_path / "o")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"state file {state} cannot be written" in err and "--state PATH" in err
    # planning still works: it only reads
    assert cli.main(["--dry-run", "--executor", "local", "--state", str(state)]) == 0


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_state_directory(tmp_path, capsys, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    monkeypatch.setattr(cli, "run_all", lambda *a: pytest.fail("run_all called"))
    try:
        argv = ["--target", "cpu-local", "--state", str(ro / "s.json"), "--out", str(tmp_path)]
        assert cli.main(argv) == 2
        assert "cannot be written" in capsys.readouterr().err
        assert cli.main(["--list-targets", "--state", str(ro / "s.json")]) == 0
    finally:
        ro.chmod(0o755)


def test_a_directory_as_state_file_is_refused_and_never_moved(tmp_path, capsys):
    state = tmp_path / "dir"
    (state / "keep").mkdir(parents=True)
    for argv in (["--list-targets"], ["reset-target", "--repair"], ["reset-target", "x"]):
        assert cli.main([*argv, "--state", str(state)]) == 2
        assert f"state file {state} is a directory" in capsys.readouterr().err
    assert (state / "keep").is_dir() and not list(tmp_path.glob("dir.corrupt-*"))


def test_repair_of_a_missing_file_does_nothing(tmp_path, capsys):
    state = tmp_path / "s.json"
    assert cli.main(["reset-target", "--repair", "--state", str(state)]) == 0
    assert "nothing to repair" in capsys.readouterr().out and not state.exists()
