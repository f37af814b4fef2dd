"""The run's summary: a tabulate table on the terminal and summary.json beside the artifacts."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from pathlib import Path

from hil.files import write_atomic
from hil.status import SuiteResult, exit_code

HEADERS = [
    "target",
    "suite",
    "status",
    "passed",
    "failed",
    "skipped",
    "duration s",
    "detail",
    "artifacts",
]
DETAIL_WIDTH = 60


def wrap(text: str, width: int = DETAIL_WIDTH) -> str:
    """``text`` on lines of at most ``width`` characters, all of it: the reason a suite failed
    or a target was refused is what the reader came for, so it is wrapped, never cut."""
    lines = []
    for para in str(text).splitlines() or [""]:
        lines += textwrap.wrap(para, width, break_on_hyphens=False) or [""]
    return "\n".join(lines)


def rows(results: Sequence[SuiteResult]) -> list:
    out = []
    for r in results:
        detail = wrap(r.detail)
        out.append(
            [
                r.target,
                r.suite,
                r.status.value,
                r.counts.passed,
                r.counts.failed + r.counts.errors,
                r.counts.skipped,
                f"{r.duration_s:.1f}",
                detail,
                r.artifacts,
            ]
        )
    return out


def render(results: Sequence[SuiteResult]) -> str:
    from tabulate import tabulate  # checked by the CLI first, so a missing one is named

    return tabulate(rows(results), headers=HEADERS, tablefmt="github")


def write_summary(path: Path, results: Sequence[SuiteResult], run_id: str) -> None:
    data = {
        "run_id": run_id,
        "exit_code": exit_code(results),
        "results": [r.to_json() for r in results],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(data, indent=1))
