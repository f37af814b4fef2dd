"""Live output: each run's lines go to its log file and, prefixed, to the terminal.

Streams are read on their own thread because ``Container.logs(follow=True)`` (and a pipe whose
writer left a child behind) can block after the run ended; the caller joins with a timeout and
moves on.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Optional, TextIO

_console_lock = threading.Lock()


class Console:
    """Prefixed, line-atomic writes to the terminal from several worker threads."""

    def __init__(self, stream: Optional[TextIO] = None, echo: bool = True):
        self.stream = stream or sys.stdout
        self.echo = echo

    def line(self, prefix: str, text: str) -> None:
        if self.echo:
            with _console_lock:
                self.stream.write(f"[{prefix}] {text}\n")
                self.stream.flush()


class LogPump(threading.Thread):
    """Copies chunks of bytes from ``source`` to ``path`` and the console, line by line."""

    def __init__(self, source: Iterable[bytes], path: Path, console: Console, prefix: str):
        super().__init__(daemon=True, name=f"logs-{prefix}")
        self.source, self.path, self.console, self.prefix = source, path, console, prefix
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        pending = b""
        try:
            with open(self.path, "ab") as f:
                for chunk in self.source:
                    f.write(chunk)
                    f.flush()
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        self.console.line(self.prefix, line.decode(errors="replace"))
                if pending:
                    self.console.line(self.prefix, pending.decode(errors="replace"))
        except Exception as exc:  # the daemon went away mid-stream: the run's status says so
            self.error = exc
