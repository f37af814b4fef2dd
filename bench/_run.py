"""The record of one long bench/ run (linear_attn_bench.py, prefill_bench.py): its clock, the
rows measured and what the time budget skipped, rewritten as JSON after every change so that a
run cut short still leaves what it measured."""

from __future__ import annotations

import argparse
import time
from typing import Any, Optional

from _timing import write_results


class Run:
    """The run's clock, rows and skips; rewrites ``args.out/filename`` after every change.

    A script subclasses it with its ``filename`` and the console line of a row (:meth:`line`).
    """

    filename: str  # the JSON file under ``args.out``, set by each script

    def __init__(self, args: argparse.Namespace, payload: dict[str, Any]) -> None:
        self.args = args
        self.t0 = time.monotonic()
        self.payload = {**payload, "rows": [], "skipped": [], "complete": False}

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def has_time(self, what: str, deadline_s: Optional[float] = None) -> bool:
        """False (and the skip recorded, printed and saved) once ``deadline_s`` (default:
        ``args.budget_s``) seconds of the run have passed."""
        deadline_s = self.args.budget_s if deadline_s is None else deadline_s
        if self.elapsed() < deadline_s:
            return True
        self.payload["skipped"].append(what)
        say(f"skipped (time budget {deadline_s:.0f} s spent): {what}")
        self.save()
        return False

    def add(self, row: dict[str, Any]) -> None:
        self.payload["rows"].append(row)
        say(self.line(row))
        self.save()

    def line(self, row: dict[str, Any]) -> str:
        """What the console shows of ``row`` as it is added."""
        raise NotImplementedError

    def save(self) -> str:
        self.payload["elapsed_s"] = round(self.elapsed(), 1)
        return write_results(self.args.out, self.filename, self.payload)


def say(text: str) -> None:
    print(text, flush=True)
