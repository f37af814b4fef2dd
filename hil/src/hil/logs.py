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

from hil.files import open_append

_console_lock = threading.Lock()
# the most of one line kept for the terminal; the log file gets every byte
MAX_LINE_KEPT = 64 * 1024


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
    """Copies chunks of bytes from ``source`` to ``path`` and the console, line by line.

    Linear in bytes: each chunk is written to the log as it comes and only that chunk is split;
    of a line longer than MAX_LINE_KEPT only the head is kept for the terminal (the log has it
    all). Buffering the whole pending line (``pending += chunk``, then splitting it) cost
    quadratic time: 50 MB in one line took 40 s and 200 MB turned into a false HANG.
    """

    def __init__(self, source: Iterable[bytes], path: Path, console: Console, prefix: str):
        super().__init__(daemon=True, name=f"logs-{prefix}")
        self.source, self.path, self.console, self.prefix = source, path, console, prefix
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        line = _Line()
        try:
            f = open_append(self.path)
        except OSError as exc:  # a link at log.txt: refused, but the stream is still drained
            f, self.error = None, exc  # (a child blocked on a full pipe would look hung)
        try:
            for chunk in self.source:
                if f is not None:
                    f.write(chunk)
                    f.flush()
                *ends, rest = chunk.split(b"\n")
                for end in ends:
                    line.add(end)
                    self.console.line(self.prefix, line.take())
                line.add(rest)
            if line.size:
                self.console.line(self.prefix, line.take())
        except Exception as exc:  # the daemon went away mid-stream: the run's status says so
            self.error = exc
        finally:
            if f is not None:
                f.close()


class _Line:
    """The head (at most MAX_LINE_KEPT bytes) of the line being read, and its full size."""

    def __init__(self) -> None:
        self.head, self.size = bytearray(), 0

    def add(self, part: bytes) -> None:
        room = MAX_LINE_KEPT - len(self.head)
        if room > 0:
            self.head += part[:room]
        self.size += len(part)

    def take(self) -> str:
        text = self.head.decode(errors="replace")
        if self.size > len(self.head):
            text += f" [... {self.size - len(self.head)} more bytes in the log file]"
        self.head, self.size = bytearray(), 0
        return text
