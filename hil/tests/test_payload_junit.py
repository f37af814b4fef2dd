"""Payload archives, safe extraction of what comes back, and JUnit counting."""

from __future__ import annotations

import io
import tarfile

from hil_helpers import REPO, tar_of

from hil.config import Step, Suite
from hil.junit import count_report, count_reports
from hil.payload import SPEC_NAME, build_payload, extract_safely, suite_spec


def test_payload_holds_runner_tests_and_spec():
    suite = Suite(
        "s",
        (Step(name="a", pytest=("hil/tests/faults/fault_ok.py",)),),
        5.0,
        payload=("hil/tests/faults",),
    )
    spec = suite_spec(suite, "/hil/payload", "/hil/out", 7.0)
    names = tarfile.open(fileobj=io.BytesIO(build_payload(REPO, suite, spec))).getnames()
    assert "hil/payload/hil/suites/run_suite.py" in names
    assert "hil/payload/hil/tests/faults/fault_ok.py" in names
    assert f"hil/payload/{SPEC_NAME}" in names and "hil/out" in names
    assert not [n for n in names if "__pycache__" in n]
    assert spec["test_timeout_s"] == 7.0 and spec["steps"][0]["pytest"] == [
        "hil/tests/faults/fault_ok.py"
    ]


def test_extract_refuses_escapes(tmp_path):
    stream = tar_of(
        {
            "out/a.xml": b"a",
            "out/sub/b.json": b"b",
            "out/../evil": b"x",
            "/etc/evil": b"x",
            "other/c": b"c",
        }
    )
    written = extract_safely(stream, tmp_path / "dest", strip="out")
    rel = sorted(p.relative_to(tmp_path / "dest").as_posix() for p in written)
    assert rel == ["a.xml", "sub/b.json"]
    assert not (tmp_path / "evil").exists()


PYTEST_XML = """<?xml version="1.0"?><testsuites><testsuite name="pytest">
<testcase name="a"/><testcase name="b"><failure message="x"/></testcase>
<testcase name="c"><skipped message="y"/></testcase><testcase name="d"><error message="z"/>
</testcase></testsuite></testsuites>"""


def test_counts(tmp_path):
    (tmp_path / "a.xml").write_text(PYTEST_XML)
    (tmp_path / "b.xml").write_text('<testsuite><testcase name="e"/></testsuite>')
    (tmp_path / "bad.xml").write_text("<testsuites><testsu")
    c = count_report(tmp_path / "a.xml")
    assert (c.passed, c.failed, c.skipped, c.errors) == (1, 1, 1, 1)
    total, unreadable = count_reports(tmp_path.glob("*.xml"))
    assert (total.passed, total.errors, unreadable) == (2, 2, ["bad.xml"])
