"""Per-test timeout for images without pytest-timeout: ``-p hil_test_timeout``.

``faulthandler.dump_traceback_later(exit=True)`` runs on a C watchdog thread that needs no GIL,
so it fires while the test is blocked in native code (a driver call), prints every thread's
stack and ends the process, which is what pytest-timeout's thread method does.
"""

from __future__ import annotations

import faulthandler
import sys

import pytest


def pytest_addoption(parser):
    parser.addini("hil_test_timeout", "seconds per test before the process is ended", default="0")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    timeout = float(item.config.getini("hil_test_timeout") or 0)
    if timeout > 0:
        sys.stderr.write(f"\n[hil] {item.nodeid}: per-test timeout {timeout} s\n")
        faulthandler.dump_traceback_later(timeout, exit=True, file=sys.stderr)
    try:
        yield
    finally:
        if timeout > 0:
            faulthandler.cancel_dump_traceback_later()
