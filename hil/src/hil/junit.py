"""Counting JUnit XML reports (pytest's and the ones the suite runner writes itself)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterable
from pathlib import Path

from hil.status import Counts


def count_report(path: Path) -> Counts:
    """Counts of one report; ``<testsuites>`` or a single ``<testsuite>`` root."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    total = Counts()
    for suite in suites:
        for case in suite.iter("testcase"):
            if case.find("failure") is not None:
                total.failed += 1
            elif case.find("error") is not None:
                total.errors += 1
            elif case.find("skipped") is not None:
                total.skipped += 1
            else:
                total.passed += 1
    return total


def count_reports(paths: Iterable[Path]) -> tuple[Counts, list[str]]:
    """Summed counts, and the names of reports that could not be parsed (each counts an error)."""
    total = Counts()
    unreadable = []
    for path in sorted(paths):
        try:
            total = total + count_report(path)
        except (ET.ParseError, OSError):
            unreadable.append(path.name)
            total.errors += 1
    return total, unreadable
