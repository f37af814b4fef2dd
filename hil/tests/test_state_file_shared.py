"""Issue 18, class 1: the quarantine record is a shared lab file. A state path that is a symlink
is written through to its target (the temporary file beside the real file, then a rename onto
it), never replaced by a private copy; a write keeps the file's mode, owner and group, so the
other lab users keep their access; ``--repair`` likewise."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path

import pytest

from hil import cli
from hil.quarantine import QuarantineStore, StateError

MODES = [0o600, 0o640, 0o644, 0o660, 0o664, 0o666]
OTHER_UID, OTHER_GID, SECOND_UID = 23456, 34567, 23457


def _writes(store: QuarantineStore):
    """Every kind of write the store does, each leaving a valid file."""
    return [
        lambda: store.quarantine("lab", "probe hung", "r1"),
        lambda: store.quarantine("lab2", "suite hung", "r2"),
        lambda: store.release("lab"),
        lambda: store.release_all(),
    ]


@pytest.fixture
def linked(tmp_path) -> tuple:
    """A state path that is a symlink into another directory (the lab's shared file)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    real = shared / "state.json"
    real.write_text('{"quarantine": {}}\n')
    mine = tmp_path / "home"
    mine.mkdir()
    link = mine / "state.json"
    link.symlink_to(real)
    return link, real


def test_symlink_is_written_through_to_its_target(linked):
    link, real = linked
    store = QuarantineStore(link)
    for write in _writes(store):
        write()
        assert link.is_symlink() and os.readlink(link) == str(real)
        json.loads(real.read_text())  # the real file holds every write
    store.quarantine("lab", "probe hung")
    assert QuarantineStore(real).get("lab")["reason"] == "probe hung"
    # nothing was left or created beside the link but the link (and its lock, if any)
    assert {p.name for p in link.parent.iterdir()} <= {"state.json", "state.json.lock"}
    assert not list(real.parent.glob("*.tmp"))


def test_a_chain_of_symlinks_and_a_relative_link(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    real = tmp_path / "a" / "b" / "state.json"
    real.write_text('{"quarantine": {}}\n')
    hop = tmp_path / "a" / "hop.json"
    hop.symlink_to(Path("b") / "state.json")  # relative
    link = tmp_path / "link.json"
    link.symlink_to(hop)
    QuarantineStore(link).quarantine("lab", "hung")
    assert link.is_symlink() and hop.is_symlink()
    assert "lab" in json.loads(real.read_text())["quarantine"]


def test_temporary_file_is_created_beside_the_real_file(linked, monkeypatch):
    link, real = linked
    seen = []
    real_replace = os.replace

    def replace(src, dst):
        seen.append((Path(src), Path(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    QuarantineStore(link).quarantine("lab", "hung")
    assert seen and all(src.parent == real.parent and dst == real for src, dst in seen)


def test_a_dangling_symlink_creates_its_target(tmp_path):
    (tmp_path / "shared").mkdir()
    real = tmp_path / "shared" / "state.json"
    link = tmp_path / "state.json"
    link.symlink_to(real)
    QuarantineStore(link).quarantine("lab", "hung")
    assert link.is_symlink() and "lab" in json.loads(real.read_text())["quarantine"]


@pytest.mark.parametrize("mode", MODES, ids=oct)
@pytest.mark.parametrize("through_link", [False, True], ids=["file", "symlink"])
def test_every_write_keeps_the_mode(linked, mode, through_link):
    link, real = linked
    real.chmod(mode)
    store = QuarantineStore(link if through_link else real)
    for write in _writes(store):
        write()
        assert stat.S_IMODE(real.stat().st_mode) == mode


@pytest.mark.parametrize("mode", [0o640, 0o664], ids=oct)
@pytest.mark.parametrize("through_link", [False, True], ids=["file", "symlink"])
def test_repair_keeps_mode_and_symlink(linked, capsys, mode, through_link):
    link, real = linked
    real.write_text("{corrupt")
    real.chmod(mode)
    path = link if through_link else real
    assert cli.main(["reset-target", "--repair", "--state", str(path)]) == 0
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert json.loads(real.read_text()) == {"quarantine": {}}
    assert stat.S_IMODE(real.stat().st_mode) == mode
    aside = list(real.parent.glob("state.json.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_text() == "{corrupt"
    assert not list(link.parent.glob("*.corrupt-*")) or link.parent == real.parent


def test_a_new_file_gets_the_umask_mode_not_a_private_one(tmp_path):
    old = os.umask(0o002)
    try:
        QuarantineStore(tmp_path / "s.json").quarantine("lab", "hung")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "s.json").stat().st_mode) == 0o664


root_only = pytest.mark.skipif(
    os.geteuid() != 0, reason="changing a file's owner to another user needs root"
)


@root_only
@pytest.mark.parametrize("through_link", [False, True], ids=["file", "symlink"])
def test_every_write_keeps_owner_and_group(linked, through_link):
    link, real = linked
    os.chown(real, OTHER_UID, OTHER_GID)
    real.chmod(0o664)
    store = QuarantineStore(link if through_link else real)
    for write in _writes(store):
        write()
        st = real.stat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (OTHER_UID, OTHER_GID, 0o664)
    real.write_text("{corrupt")
    store.repair()
    st = real.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (OTHER_UID, OTHER_GID, 0o664)


def _as_user(uid: int, gid: int, groups: list, action) -> int:
    """Run ``action()`` in a forked child with another identity; its exit status (0: no
    exception, 1: StateError, 2: anything else)."""
    pid = os.fork()
    if pid == 0:  # child
        code = 2
        try:
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
            action()
            code = 0
        except StateError:
            code = 1
        except BaseException:
            code = 2
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@root_only
def test_a_second_lab_user_can_still_write_after_root_did():
    """The lab's layout: a group-writable shared directory and file; one user (here root)
    records a quarantine, then another member of the group must still be able to."""
    shared = Path(tempfile.mkdtemp(prefix="hil-shared-", dir="/tmp"))
    try:
        os.chown(shared, OTHER_UID, OTHER_GID)
        shared.chmod(0o2775)
        real = shared / "state.json"
        real.write_text('{"quarantine": {}}\n')
        os.chown(real, OTHER_UID, OTHER_GID)
        real.chmod(0o664)
        QuarantineStore(real).quarantine("lab", "root saw it hang")  # root writes first
        code = _as_user(
            SECOND_UID,
            SECOND_UID,
            [OTHER_GID],
            lambda: QuarantineStore(real).quarantine("lab2", "second user saw it hang"),
        )
        assert code == 0, "the second lab user was locked out of the shared state file"
        assert set(json.loads(real.read_text())["quarantine"]) == {"lab", "lab2"}
        st = real.stat()
        assert st.st_gid == OTHER_GID and stat.S_IMODE(st.st_mode) == 0o664
    finally:
        for p in sorted(shared.rglob("*"), reverse=True):
            p.unlink()
        shared.rmdir()


@root_only
def test_a_user_outside_the_files_group_is_refused_before_writing():
    """A user who can write the file (mode 0666) but cannot keep its group: replacing it would
    hand the file to that user's group, so the store refuses with the path and the group."""
    shared = Path(tempfile.mkdtemp(prefix="hil-shared-", dir="/tmp"))
    try:
        shared.chmod(0o777)
        real = shared / "state.json"
        real.write_text('{"quarantine": {}}\n')
        os.chown(real, OTHER_UID, OTHER_GID)
        real.chmod(0o666)
        before = real.read_bytes()
        code = _as_user(
            SECOND_UID, SECOND_UID, [], lambda: QuarantineStore(real).quarantine("lab", "x")
        )
        assert code == 1
        assert real.read_bytes() == before and real.stat().st_gid == OTHER_GID
    finally:
        for p in sorted(shared.rglob("*"), reverse=True):
            p.unlink()
        shared.rmdir()
