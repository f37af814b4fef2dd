"""The repository's bench/ scripts imported as modules, for CPU tests of their parsing and
planning (they live outside any package, beside their shared ``_timing``)."""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType

import attn_core

ROOT = os.path.abspath(os.path.join(os.path.dirname(attn_core.__file__), *[".."] * 4))
BENCH_DIR = os.path.join(ROOT, "bench")


def bench_path(name: str) -> str:
    """``bench/<name>.py`` in this checkout."""
    return os.path.join(BENCH_DIR, f"{name}.py")


def bench_module(name: str) -> ModuleType:
    """``bench/<name>.py`` loaded as a module, its siblings importable while it loads."""
    spec = importlib.util.spec_from_file_location(name, bench_path(name))
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, BENCH_DIR)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(BENCH_DIR)
    return module
