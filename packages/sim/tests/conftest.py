"""Every sim test runs in its own temporary working directory: a command's default output
(``--out sim-report``) lands there, never in the repository (issue 18: the tests left
``sim-report/`` in the checkout). Tests reach their data through ``Path(__file__)``."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _cwd_in_tmp(tmp_path, monkeypatch):
    # a PYTHONPATH relative to the repository root (the way the notes run the tests) must
    # still find the packages from the subprocesses some tests start
    paths = os.environ.get("PYTHONPATH")
    if paths:
        absolute = [os.path.abspath(p) if p else p for p in paths.split(os.pathsep)]
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(absolute))
    monkeypatch.chdir(tmp_path)
