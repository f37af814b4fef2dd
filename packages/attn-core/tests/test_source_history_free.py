"""Source says why, not when: no calendar date, "round N", "issue N" or "session N" in the
shipped sources, the CI scripts, the benches or the nox file. A comment that needs a measurement
cites it and links its section of docs/benchmarks.md; how the number was reached lives in
docs/history/ and in commit messages."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# Trees and files scanned: every package's src/ (the kernels' csrc/ included), the CI scripts,
# the HIL runner and its suites, the benches and the nox file. Tests and docs are not scanned:
# tests may carry dates as test data, docs/history/ is the dated log.
SCANNED = (
    *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "packages").glob("*/src")),
    "packages/attn-core/ci",
    "hil/src",
    "hil/suites",
    "bench",
    "noxfile.py",
    ".ci",
)
# Data files (measured records such as kernel_facts.json and profile provenance) may name the
# day they were measured; they are not prose.
DATA_SUFFIXES = {".json"}

HISTORY = re.compile(
    r"20[0-9]{2}-[0-9]{2}-[0-9]{2}"  # a date (format examples write YYYY-MM-DD)
    r"|\b[Rr]ound [0-9]+|\b[Ii]ssue [0-9]+|\b[Ss]ession [0-9]+"
)


def _scanned_files() -> list[Path]:
    files = []
    for entry in SCANNED:
        path = ROOT / entry
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files += [
                p
                for p in path.rglob("*")
                if p.is_file() and p.suffix not in DATA_SUFFIXES and "__pycache__" not in p.parts
            ]
    return sorted(files)


def _hits(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:  # a binary file has no prose
        return []
    rel = path.relative_to(ROOT).as_posix()
    return [
        f"{rel}:{n}: {line.strip()}"
        for n, line in enumerate(text.splitlines(), 1)
        if HISTORY.search(line)
    ]


def test_the_scan_sees_the_sources() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in _scanned_files()}
    assert "packages/attn-core/src/attn_core/native/csrc/paged_decode.cu" in names
    assert "noxfile.py" in names
    assert not any("/tests/" in n for n in names), "tests are out of scope"


def test_sources_name_no_dates_rounds_or_issues() -> None:
    hits = [h for p in _scanned_files() for h in _hits(p)]
    assert not hits, (
        "say why with the measurement and link docs/benchmarks.md#section instead:\n"
        + "\n".join(hits)
    )


def test_the_pattern_catches_what_it_should() -> None:
    for bad in ("(H200, 2026-12-04)", "2026-12-01T10:00:00Z", "issue 17 round 14", "Round 3",
                "session 24", "Session 23"):  # fmt: skip
        assert HISTORY.search(bad), bad
    for fine in ('"date": "YYYY-MM-DDThh:mm:ssZ"', "rounds of five", "a merge round trip",
                 "tissue 5", "(see docs/benchmarks.md#decode-split)"):  # fmt: skip
        assert not HISTORY.search(fine), fine
