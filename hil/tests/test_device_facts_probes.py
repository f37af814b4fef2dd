"""One bad probe child is one bad record: non-UTF-8 output, JSON nested past the parser's
recursion limit, or a probe that raises never loses the other probes of the section."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hil_helpers import REPO

sys.path.insert(0, str(REPO / "hil" / "suites"))
import device_facts_v1 as v1  # noqa: E402

DEEP = '{"a": ' * 100_000 + "1" + "}" * 100_000


def child(tmp_path: Path, stdout: bytes, stderr: bytes = b"", code: int = 0) -> str:
    """A stand-in for the probe's python: prints the given bytes whatever its arguments."""
    (tmp_path / "out.bin").write_bytes(stdout)
    (tmp_path / "err.bin").write_bytes(stderr)
    script = tmp_path / "python"
    script.write_text(
        f"#!/bin/sh\ncat {tmp_path}/out.bin\ncat {tmp_path}/err.bin >&2\nexit {code}\n"
    )
    script.chmod(0o755)
    return str(script)


def test_non_utf8_answer_is_read_with_replacement(tmp_path):
    python = child(tmp_path, b'{"outcome": "refused", "detail": "bad \xff byte"}\n', b"\xfe\n")
    answer = v1.run_probe(["v1", 16], 10.0, python=python)
    assert answer["outcome"] == "refused" and "\ufffd" in answer["detail"]


def test_non_utf8_crash_output_is_a_crash_record(tmp_path):
    python = child(tmp_path, b"\xff\xfe\n", b"Segmentation \xff fault\n", code=139)
    answer = v1.run_probe(["v1", 16], 10.0, python=python)
    assert answer["outcome"] == "crash" and "Segmentation" in answer["detail"]


def test_deeply_nested_answer_is_a_crash_record(tmp_path):
    python = child(tmp_path, DEEP.encode() + b"\n")
    answer = v1.run_probe(["v1", 16], 10.0, python=python)
    assert answer["outcome"] == "crash" and "RecursionError" in answer["detail"]


@pytest.mark.parametrize(
    "bad", [RecursionError("deep"), UnicodeDecodeError("utf-8", b"\xff", 0, 1, "x")]
)
def test_a_probe_that_raises_is_one_record_and_the_bisection_goes_on(bad):
    def probe(n):
        if n == 64:
            raise bad
        return {"outcome": "ok" if n <= 48 else "refused", "detail": ""}

    r = v1.v1_reach(32, 256, 1.0, probe)
    bad_records = [p for p in r["probes"] if p["outcome"] == "crash"]
    assert [p["context"] for p in bad_records] == [64]
    assert type(bad).__name__ in bad_records[0]["detail"]
    assert r["reach"] == 48 and len(r["probes"]) > 2
