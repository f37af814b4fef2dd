"""Quarantined targets, persisted across runs in a JSON state file.

A target enters quarantine when its health probe fails or hangs or one of its suites hangs; later
runs refuse it until ``hil reset-target NAME`` or a passing ``--recheck`` probe. The file is
``$HIL_STATE``, else ``$XDG_STATE_HOME/bi100-hil/state.json`` (``~/.local/state/...``). Writes
are atomic (write + rename) under a lock file, so worker threads and concurrent runs on one
machine do not lose each other's entries.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

_thread_lock = threading.Lock()


def default_state_path(environ=None) -> Path:
    environ = os.environ if environ is None else environ
    if environ.get("HIL_STATE"):
        return Path(environ["HIL_STATE"])
    base = environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "bi100-hil" / "state.json"


class QuarantineStore:
    def __init__(self, path: Path):
        self.path = Path(path)

    @contextmanager
    def _locked(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with _thread_lock, open(self.path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {"quarantine": {}}
        except json.JSONDecodeError as exc:
            raise ValueError(f"state file {self.path} is not valid JSON: {exc}") from exc
        data.setdefault("quarantine", {})
        return data

    def _write(self, data: dict) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, self.path)

    def get(self, target: str) -> Optional[dict]:
        with self._locked():
            return self._read()["quarantine"].get(target)

    def all(self) -> dict:
        with self._locked():
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
        """Remove the target's entry; whether there was one."""
        with self._locked():
            data = self._read()
            had = data["quarantine"].pop(target, None) is not None
            self._write(data)
            return had


def refusal(target: str, entry: dict) -> str:
    return (
        f"target {target} is quarantined since {entry.get('since')}: {entry.get('reason')}; "
        f"run `python -m hil reset-target {target}` after fixing it, or pass --recheck"
    )
