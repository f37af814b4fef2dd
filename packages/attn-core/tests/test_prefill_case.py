"""make_prefill_case / PrefillCase: part of attn_core.reference (no execution code), importable
whichever attn_core module comes first."""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys

import pytest
import torch

import attn_core.reference.prefill_case as prefill_case_module
from attn_core import reference

SRC = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(prefill_case_module.__file__)))
)


def test_reference_exports_the_case_builders() -> None:
    assert reference.make_prefill_case is prefill_case_module.make_prefill_case
    assert reference.PrefillCase is prefill_case_module.PrefillCase
    assert {"make_prefill_case", "PrefillCase"} <= set(reference.__all__)


def test_the_old_alias_is_gone() -> None:
    """attn_core.reference is the one name for the reference; no second spelling to drift."""
    assert importlib.util.find_spec("attn_core.testing") is None


@pytest.mark.parametrize(
    "first",
    ("attn_core.reference", "attn_core.reference.prefill_case", "attn_core"),
)
def test_import_orders_in_a_fresh_interpreter(first: str) -> None:
    """Whichever module is imported first, the reference resolves (no circular-import error)."""
    code = (
        f"import {first}\n"
        "from attn_core.reference import PrefillCase, make_prefill_case\n"
        "from attn_core.reference.prefill_case import PrefillCase as P2\n"
        "assert PrefillCase is P2\n"
        "c = make_prefill_case([(5, 3)], 2, 1, 64)\n"
        "assert c.query.shape == (3, 2, 64)\n"
    )
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_prefill_case_imports_no_execution_code() -> None:
    """Only torch, the standard library and attn_core.reference: the reference's inputs must not
    depend on the code they check."""
    with open(prefill_case_module.__file__) as f:
        tree = ast.parse(f.read())
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            modules.add(node.module)
    attn = {m for m in modules if m.split(".")[0] == "attn_core"}
    assert all(m.startswith("attn_core.reference") for m in attn), attn
    assert "torch" in modules


def test_case_matches_its_description() -> None:
    case = reference.make_prefill_case([(0, 4), (20, 1)], 4, 2, 64, 16, torch.float32, seed=1)
    assert case.query_start_loc.tolist() == [0, 4, 5]
    assert case.seq_lens.tolist() == [4, 21] and case.context_lens.tolist() == [0, 20]
    assert case.key.shape == (5, 2, 64) and case.max_query_len == 4
