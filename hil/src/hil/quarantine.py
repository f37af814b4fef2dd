"""Quarantined targets, persisted across runs in a JSON state file.

A target enters quarantine when its health probe fails or hangs or one of its suites hangs; later
runs refuse it until ``hil reset-target NAME`` or a passing ``--recheck`` probe. The file is
``$HIL_STATE``, else ``$XDG_STATE_HOME/bi100-hil/state.json`` (``~/.local/state/...``).

The file is the quarantine record of a shared lab machine, so:

- writes are atomic: a temporary file in the same directory, fsync, ``os.replace``, fsync of
  the directory; a crash leaves the old file or the new one, never half of one;
- a state path that is a symlink (a user's link to the lab's shared file) is written through:
  the temporary file goes beside the real file and replaces it, the link stays a link;
- a rewrite keeps the file's mode, group (and, for root, owner): a 0664 file shared by a lab
  group stays 0664 and in that group. A user who could write the file but cannot keep its group
  (not a member) is refused before anything changes, naming the group;
- read-modify-write happens under a lock file, so worker threads and concurrent runs on one
  machine do not lose each other's entries;
- a file that is not valid JSON or not of the expected shape raises :class:`StateError` naming
  the path; nothing overwrites it. ``hil reset-target --repair`` moves it aside to
  ``<name>.corrupt-<UTC time>`` and starts an empty one, so it is never silently lost;
- reading needs no write access (``--list-targets`` and ``--dry-run`` work on a read-only or
  missing state directory); :meth:`QuarantineStore.check_writable` is what a real run calls
  first, creating a missing directory and failing with the path when it cannot write there.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

_thread_lock = threading.Lock()
REPAIR_HINT = "python -m hil reset-target --repair"


class StateError(ValueError):
    """The state file cannot be read or written; the message names its path and the way out."""


def default_state_path(environ=None) -> Path:
    environ = os.environ if environ is None else environ
    if environ.get("HIL_STATE"):
        return Path(environ["HIL_STATE"]).expanduser()
    base = environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base).expanduser() / "bi100-hil" / "state.json"


def shape_error(data: object) -> str:
    """Why ``data`` is not a state document (``{"quarantine": {NAME: {"reason": str, ...}}}``),
    or "" when it is."""
    if not isinstance(data, dict):
        return f"expected a JSON object at the top, got {type(data).__name__}"
    q = data.get("quarantine", {})
    if not isinstance(q, dict):
        return f"expected 'quarantine' to be an object, got {type(q).__name__}"
    for name, entry in q.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("reason"), str):
            return f"expected quarantine.{name} to be an object with a string reason, got {entry!r}"
    return ""


class QuarantineStore:
    def __init__(self, path: Path):
        self.path = Path(path).expanduser()  # --state '~/s.json' is the home's, not ./~

    def _error(self, what: str) -> StateError:
        return StateError(
            f"state file {self.path} {what}; `{REPAIR_HINT} --state {self.path}` moves it "
            "aside and starts an empty one"
        )

    def real_path(self) -> Path:
        """The file the state lives in: the path with every symlink resolved, so that writes go
        to the lab's shared file and not over a user's link to it."""
        return Path(os.path.realpath(self.path))

    @contextmanager
    def _locked(self):
        self.check_writable()
        with _thread_lock:
            fd = _open_lock(self._lock_path())
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)

    def _lock_path(self) -> Path:
        # beside the real file: users reaching it through different links share one lock
        real = self.real_path()
        return real.with_name(real.name + ".lock")

    def check_writable(self) -> None:
        """Create the state directory if missing; StateError naming the path if it cannot be
        written (a run that could not record a quarantine must not start on a shared device),
        or if a rewrite could not keep the file's group."""
        real = self.real_path()
        shown = str(self.path) if real == self.path else f"{self.path} (-> {real})"
        try:
            real.parent.mkdir(parents=True, exist_ok=True)
            os.close(_open_lock(self._lock_path()))
        except OSError as exc:
            raise StateError(
                f"state file {shown} cannot be written ({exc.strerror or exc}): a run must be "
                "able to record a quarantine; pass --state PATH or set HIL_STATE to a writable "
                "file, e.g. the lab's shared one"
            ) from None
        if real.exists() and not os.access(real, os.W_OK):
            raise StateError(f"state file {shown} is not writable; pass --state PATH")
        if not os.access(real.parent, os.W_OK | os.X_OK):
            raise StateError(
                f"state file {shown}: its directory {real.parent} is not writable, and an atomic "
                "rewrite puts a temporary file there; pass --state PATH"
            )
        if real.exists() and not _can_keep_group(real.stat().st_gid):
            raise StateError(
                f"state file {shown} belongs to group {real.stat().st_gid}, which this user is "
                "not in: rewriting it would move it to this user's group and lock the lab's "
                "other users out; join that group or pass --state PATH"
            )

    def _read(self) -> dict:
        if self.path.is_dir():  # not a corrupt file: --repair must never move a directory
            raise StateError(f"state file {self.path} is a directory; pass --state FILE")
        try:
            text = self.path.read_text()
        except (FileNotFoundError, NotADirectoryError):  # no file yet: nothing quarantined
            return {"quarantine": {}}
        except (OSError, UnicodeDecodeError) as exc:
            raise self._error(f"cannot be read ({exc})") from None
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:  # also 4300+ digit ints, nesting past limits
            raise self._error(f"is not valid JSON ({type(exc).__name__}: {exc})") from None
        why = shape_error(data)
        if why:
            raise self._error(f"has the wrong shape: {why}")
        data.setdefault("quarantine", {})
        return data

    def _write(self, data: dict, like: Optional[os.stat_result] = None) -> None:
        """Replace the real file atomically with ``data``; the new file takes the mode, group
        (and, for root, owner) of ``like``, else of the file it replaces, else the umask's."""
        real = self.real_path()
        if like is None and real.exists():
            like = real.stat()
        text = json.dumps(data, indent=1, sort_keys=True) + "\n"
        fd, tmp = tempfile.mkstemp(prefix=real.name + ".", suffix=".tmp", dir=real.parent)
        try:
            _take_ownership_of(fd, like)
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, real)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _fsync_dir(real.parent)

    def get(self, target: str) -> Optional[dict]:
        # no lock for reads: writes replace the file atomically, and a reader may lack write
        # access to the directory
        return self._read()["quarantine"].get(target)

    def all(self) -> dict:
        return dict(self._read()["quarantine"])

    def quarantine(self, target: str, reason: str, run_id: str = "") -> None:
        with self._locked():
            data = self._read()
            data["quarantine"][target] = {
                "reason": reason,
                "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "run_id": run_id,
            }
            self._write(data)

    def release(self, target: str) -> bool:
        """Remove the target's entry; whether there was one. The file is left as it is when
        there was none."""
        with self._locked():
            data = self._read()
            had = data["quarantine"].pop(target, None) is not None
            if had:
                self._write(data)
            return had

    def release_all(self) -> list:
        """Lift every quarantine; the names that were quarantined."""
        with self._locked():
            data = self._read()
            names = sorted(data["quarantine"])
            if names:
                data["quarantine"] = {}
                self._write(data)
            return names

    def repair(self) -> Optional[Path]:
        """Move an unreadable or wrongly shaped file aside and start an empty one; where it went,
        or None when the file was fine (or absent) and nothing was done."""
        with self._locked():
            if not self.path.is_file():  # absent (nothing to repair) or a directory (refused)
                self._read()
                return None
            try:
                self._read()
                return None
            except StateError:
                pass
            real = self.real_path()  # a link stays a link: the real file is moved aside
            was = real.stat()
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
            aside = real.with_name(f"{real.name}.corrupt-{stamp}")
            n = 1
            while aside.exists():  # two repairs within a second keep both files
                aside = real.with_name(f"{real.name}.corrupt-{stamp}-{n}")
                n += 1
            os.replace(real, aside)
            self._write({"quarantine": {}}, like=was)
            return aside


def _open_lock(path: Path) -> int:
    """A descriptor to flock: read-write where allowed, else read-only (flock needs no write
    access, and another lab user may own the lock file)."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:
        return os.open(path, os.O_RDONLY)


def _can_keep_group(gid: int) -> bool:
    return os.geteuid() == 0 or gid == os.getegid() or gid in os.getgroups()


def _current_umask() -> int:
    old = os.umask(0o022)  # the only portable way to read it; callers hold _thread_lock
    os.umask(old)
    return old


def _take_ownership_of(fd: int, like: Optional[os.stat_result]) -> None:
    """Give the temporary file behind ``fd`` the permissions the state file must keep: those of
    ``like`` (mode, group, and owner where the caller is root), or for a new file the mode an
    ordinary ``open`` would give (mkstemp makes 0600, which would lock the lab group out)."""
    if like is None:
        os.fchmod(fd, 0o666 & ~_current_umask())
        return
    mine = os.fstat(fd)
    uid = like.st_uid if os.geteuid() == 0 else -1
    if (uid not in (-1, mine.st_uid)) or like.st_gid != mine.st_gid:
        try:
            os.fchown(fd, uid, like.st_gid)
        except PermissionError:
            raise StateError(
                f"cannot give the new state file group {like.st_gid} (the old file's): this user "
                "is not in that group; join it or pass --state PATH"
            ) from None
    os.fchmod(fd, stat.S_IMODE(like.st_mode))  # after chown, which clears set-id bits


def _fsync_dir(path: Path) -> None:
    """Make the rename durable; some filesystems refuse to open a directory: best effort."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def refusal(target: str, entry: dict) -> str:
    return (
        f"target {target} is quarantined since {entry.get('since')}: {entry.get('reason')}; "
        f"run `python -m hil reset-target {target}` after fixing it, or pass --recheck"
    )
