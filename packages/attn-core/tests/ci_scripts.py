"""attn-core's CI scripts (``packages/attn-core/ci/*.py``) as modules, for the tests that check
them: they are scripts that CI runs by path, not part of the installed package."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

CI = Path(__file__).resolve().parents[1] / "ci"


def load_ci_script(name: str) -> ModuleType:
    """``ci/<name>.py``, executed as a fresh module named ``name``. The scripts import each
    other by name (clang_library uses clang_check), so ``ci/`` is on ``sys.path`` meanwhile."""
    spec = importlib.util.spec_from_file_location(name, CI / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(CI))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(CI))
    return module
