"""attn-core's import graph, read from the sources with ``ast``: no cycles, and the planners
import no execution code.

Every ``import`` / ``from ... import`` of an ``attn_core`` module counts, at any depth of a
module (a function-level import is still a dependency, and a cycle through one is what the
deferred-import workarounds used to hide).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "attn_core"

# The planners decide launches from explicit inputs; they must not reach an executor, nor any
# module that builds, loads or verifies a kernel (that is the resolver's impure step).
PLANNERS = (
    "attn_core.plan_decode",
    "attn_core.plan_native",
    "attn_core.plan_prefill",
    "attn_core.native.split",
)
KERNEL_STEPS = {
    "attn_core.native.build",
    "attn_core.native.toolchain",
    "attn_core.native.library",
    "attn_core.native.verify",
    "attn_core.native.readiness",
    "attn_core.native.launch",
    "attn_core.verify_once",
    "attn_core.resolve",
}
EXECUTORS = {
    "attn_core.decode",
    "attn_core.decode_torch",
    "attn_core.native.decode_step",
    "attn_core.prefill",
    "attn_core.prefill_torch",
    "attn_core.prefill_fused",
    "attn_core.prefill_backends",
    "attn_core.prefill_verify",
    "attn_core.decode_gather",
    "attn_core.cache_write",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """attn_core modules ``path`` imports (``from pkg import mod`` counts ``pkg.mod``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    known = set(files)
    edges = {name: imports_of(path, name, known) for name, path in files.items()}
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(edges):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return []


def reachable(edges: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in edges[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_the_graph_sees_the_package() -> None:
    edges = graph()
    assert "attn_core.decode" in edges["attn_core"]
    assert "attn_core.plan_decode" in edges["attn_core.decode"]


def test_no_import_cycle() -> None:
    edges = graph()
    edges.pop("attn_core", None)  # the package re-exports everything; it is the top
    for deps in edges.values():
        deps.discard("attn_core")
    assert find_cycle(edges) == []


def test_the_cycle_finder_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


@pytest.mark.parametrize("planner", PLANNERS)
def test_planners_import_no_execution_code(planner: str) -> None:
    assert not reachable(graph(), planner) & EXECUTORS


@pytest.mark.parametrize("planner", PLANNERS)
def test_planners_build_load_and_verify_nothing(planner: str) -> None:
    assert not reachable(graph(), planner) & KERNEL_STEPS


def test_the_reference_imports_nothing_it_checks() -> None:
    edges = graph()
    inside = {m for m in reachable(edges, "attn_core.reference")}
    assert all(m.startswith("attn_core.reference") for m in inside), inside
