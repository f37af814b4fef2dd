"""A run never writes through a symlink: logs, JUnit XML, suite and result records, summaries,
metrics and results copied out of a container replace a link (or are refused), and the file
the link pointed at, outside the run folder, is unchanged."""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path

import pytest
from hil_helpers import REPO, tar_of

from hil.files import write_atomic
from hil.logs import Console, LogPump
from hil.payload import extract_safely
from hil.runner import write_result
from hil.status import Counts, Status, SuiteResult
from hil.summary import write_summary

sys.path.insert(0, str(REPO / "hil" / "suites"))
import run_suite  # noqa: E402

KEPT = "outside, must stay"


@pytest.fixture
def outside(tmp_path):
    path = tmp_path / "outside.txt"
    path.write_text(KEPT)
    return path


@pytest.fixture
def art(tmp_path):
    path = tmp_path / "run" / "t" / "s"
    path.mkdir(parents=True)
    return path


def linked(art: Path, name: str, outside: Path) -> Path:
    (art / name).symlink_to(outside)
    return art / name


def test_log_through_a_link_is_refused_and_the_output_still_drained(art, outside):
    """The stream is still read to its end (a child blocked on a full pipe would turn into a
    false HANG) and shown on the terminal; only the log file is refused."""
    chunks = iter([b"secret\n"] * 10_000)
    shown = io.StringIO()
    pump = LogPump(chunks, linked(art, "log.txt", outside), Console(shown), "p")
    pump.run()
    assert outside.read_text() == KEPT
    assert "symlink" in str(pump.error)
    assert next(chunks, None) is None and shown.getvalue().count("secret") == 10_000


@pytest.mark.parametrize(
    "write",
    [
        lambda art: write_result(SuiteResult("t", "s", Status.PASS, Counts(), 0.0, "", str(art))),
        lambda art: write_summary(art / "result.json", [], "r"),
        lambda art: write_atomic(art / "result.json", "x"),
    ],
    ids=["result", "summary", "write_atomic"],
)
def test_records_replace_a_link(art, outside, write):
    link = linked(art, "result.json", outside)
    write(art)
    assert outside.read_text() == KEPT
    assert not link.is_symlink() and link.read_text() != KEPT


def test_suite_runner_replaces_links_at_its_junit_and_record(tmp_path, art, outside):
    for name in ("ok.xml", "suite.json", "started", "py.xml"):
        linked(art, name, outside)
    (tmp_path / "test_x.py").write_text("def test_x():\n    pass\n")
    spec = {
        "suite": "s",
        "out": str(art),
        "payload": str(tmp_path),
        "test_timeout_s": 0,
        "steps": [
            {"name": "ok", "command": [sys.executable, "-c", "pass"]},
            {"name": "py", "pytest": ["test_x.py"]},
        ],
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert run_suite.main(str(tmp_path / "spec.json")) == 0
    assert outside.read_text() == KEPT
    assert "testcase" in (art / "py.xml").read_text()


def test_results_copied_out_replace_a_link_and_skip_linked_folders(tmp_path, art, outside):
    linked(art, "long_context_metrics.json", outside)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (art / "sub").symlink_to(elsewhere)
    files = {"out/long_context_metrics.json": b"[]", "out/sub/x.json": b"{}"}
    written = extract_safely(tar_of(files), art, "out")
    assert outside.read_text() == KEPT
    assert (art / "long_context_metrics.json").read_text() == "[]"
    assert list(elsewhere.iterdir()) == [] and written == [art / "long_context_metrics.json"]


# what writes in place: pathlib's write_text / write_bytes and open() for writing or appending
IN_PLACE = re.compile(
    r"\.write_text\(|\.write_bytes\(|(?<!tarfile\.)\bopen\([^)]*[\"'][wa]b?\+?[\"']"
)


@pytest.mark.parametrize(
    "path",
    sorted((REPO / "hil" / "src" / "hil").glob("*.py"))
    + sorted((REPO / "hil" / "suites").glob("*.py")),
    ids=lambda p: p.name,
)
def test_hil_sources_write_only_through_the_safe_writers(path):
    hits = [
        f"{path.name}:{n}: {line.strip()}"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if IN_PLACE.search(line)
    ]
    assert hits == []
