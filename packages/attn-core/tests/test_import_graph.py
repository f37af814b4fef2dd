"""attn-core's import graph, read from the sources with ``ast``: no cycles, folders import one
way (:data:`FLOORS`), the planners import no execution code and nothing that builds, loads or
verifies a kernel, and the native layer's modules depend one way: the build's modules on the
standard library only, the loader on no family, each family's binding on the loader.

Every ``import`` / ``from ... import`` of an ``attn_core`` module counts, at any depth of a
module (a function-level import is still a dependency, and a cycle through one is what the
deferred-import workarounds used to hide).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "attn_core"

# The planners decide launches from explicit inputs; they must not reach an executor, nor any
# module that builds, loads or verifies a kernel (that is the resolver's impure step).
PLANNERS = (
    "attn_core.decode.plan",
    "attn_core.decode.plan_native",
    "attn_core.prefill.plan",
    "attn_core.prefill.plan_native",
    "attn_core.prefill.cost",
    "attn_core.native.split",
    "attn_core.linear.plan",
)
# what builds (family: what a library is built from), loads, launches or verifies a kernel:
# the loader and each family's binding (its library class, launch and reference check)
KERNEL_STEPS = {
    "attn_core.native.build",
    "attn_core.native.toolchain",
    "attn_core.native.family",
    "attn_core.native.loader",
    "attn_core.native.decode",
    "attn_core.native.prefill",
    "attn_core.native.gated_delta",
    "attn_core.core.verify_once",
    "attn_core.runtime.resolve",
}
# The native layer, one module per job (attn_core/native/__init__.py's list).
NATIVE = {
    "attn_core.native", "attn_core.native.__main__", "attn_core.native.abi",
    "attn_core.native.build", "attn_core.native.decode", "attn_core.native.facts",
    "attn_core.native.family", "attn_core.native.gated_delta", "attn_core.native.loader",
    "attn_core.native.prefill", "attn_core.native.split", "attn_core.native.toolchain",
}  # fmt: skip
# setup.py loads these by path at ``pip install``, where there may be no torch and the package
# is not importable: the standard library only (imports under ``TYPE_CHECKING`` may name each
# other, for annotations).
STANDARD_LIBRARY_ONLY = (
    "attn_core.native.family",
    "attn_core.native.build",
    "attn_core.native.toolchain",
    "attn_core.core.settings",
    "attn_core.core.files",
)
ABOVE_NATIVE = {"decode", "prefill", "linear", "runtime"}
# Each kernel family's run-time binding: a loader subclass with its structs, launch and check.
BINDINGS = ("attn_core.native.decode", "attn_core.native.prefill", "attn_core.native.gated_delta")
# Folders in import order: a module may import its own folder and the folders of lower floors
# only (equal floors do not import each other). The package's __init__ is the top.
FLOORS = {
    "reference": 0,
    "core": 0,
    "device": 1,
    "native": 2,
    "decode": 3,
    "prefill": 3,
    "linear": 3,
    "runtime": 4,
}
EXECUTORS = {
    "attn_core.runtime.decode",
    "attn_core.decode.torch_path",
    "attn_core.decode.native_step",
    "attn_core.runtime.prefill",
    "attn_core.prefill.torch_path",
    "attn_core.prefill.fused",
    "attn_core.prefill.native_path",
    "attn_core.prefill.backends",
    "attn_core.prefill.verify",
    "attn_core.decode.gather",
    "attn_core.core.cache_write",
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
    assert "attn_core.runtime.decode" in edges["attn_core"]
    assert "attn_core.decode.plan" in edges["attn_core.runtime.decode"]


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


def folder_of(module: str) -> str:
    return module.split(".")[1]


def test_every_module_lives_in_a_folder_with_a_floor() -> None:
    loose = [m for m in graph() if m != "attn_core" and folder_of(m) not in FLOORS]
    assert loose == []


def wrong_edges(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Edges into the package top or a command, or into another folder on the same or a higher
    floor. Commands (``__main__``) are tops like the package's ``__init__``: entry points that
    may reach the resolver, and that nothing imports."""
    wrong = []
    for module, deps in edges.items():
        wrong += [(module, dep) for dep in sorted(deps) if dep.endswith(".__main__")]
        if module == "attn_core" or module.endswith(".__main__"):
            continue
        here = folder_of(module)
        for dep in sorted(deps):
            if dep == "attn_core":
                wrong.append((module, dep))  # the top re-exports; nothing imports it back
                continue
            there = folder_of(dep)
            if there != here and FLOORS[there] >= FLOORS[here]:
                wrong.append((module, dep))
    return wrong


def test_folders_import_one_way() -> None:
    assert wrong_edges(graph()) == []


def test_the_floor_check_sees_wrong_edges() -> None:
    edges = {
        "attn_core.native.split": {"attn_core.decode.plan", "attn_core.core.shapes"},
        "attn_core.decode.plan": {"attn_core.prefill.plan"},
        "attn_core.prefill.plan": {"attn_core"},
        "attn_core.native.__main__": {"attn_core.runtime.prefill_status"},
        "attn_core.runtime.resolve": {"attn_core.native.__main__"},
    }
    assert wrong_edges(edges) == [
        ("attn_core.native.split", "attn_core.decode.plan"),
        ("attn_core.decode.plan", "attn_core.prefill.plan"),
        ("attn_core.prefill.plan", "attn_core"),
        ("attn_core.runtime.resolve", "attn_core.native.__main__"),
    ]


def test_the_native_layer_is_its_modules() -> None:
    assert {m for m in graph() if m.startswith("attn_core.native")} == NATIVE


def _under_type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def run_time_imports(path: Path) -> tuple[set[str], set[str]]:
    """``(modules imported when the file runs, modules imported under TYPE_CHECKING)``."""
    running: set[str] = set()
    typing_only: set[str] = set()

    def visit(node: ast.AST, into: set[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if _under_type_checking(child):
                for inner in child.body:
                    visit_one(inner, typing_only)
                for inner in child.orelse:
                    visit_one(inner, into)
                continue
            visit_one(child, into)

    def visit_one(node: ast.AST, into: set[str]) -> None:
        if isinstance(node, ast.Import):
            into.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            into.add("." * node.level + (node.module or ""))
        visit(node, into)

    visit(ast.parse(path.read_text()), running)
    return running, typing_only


def path_of(module: str) -> Path:
    path = SRC.joinpath(*module.split(".")).with_suffix(".py")
    return path if path.is_file() else SRC.joinpath(*module.split("."), "__init__.py")


@pytest.mark.parametrize("module", STANDARD_LIBRARY_ONLY)
def test_the_build_runs_on_the_standard_library_alone(module: str) -> None:
    running, typing_only = run_time_imports(path_of(module))
    outside = {m for m in running if m.split(".")[0] not in sys.stdlib_module_names}
    # another standard-library module of the package, which a module loaded by path (the
    # package not importable) loads by path in turn
    assert outside <= set(STANDARD_LIBRARY_ONLY), outside
    annotations = {m for m in typing_only if m.split(".")[0] not in sys.stdlib_module_names}
    assert annotations <= set(STANDARD_LIBRARY_ONLY), annotations


def test_the_standard_library_check_sees_a_dependency(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "import os\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from attn_core.native.family import Family\nelse:\n    import json\n"
        "def f():\n    import torch\n"
    )
    assert run_time_imports(source) == ({"os", "typing", "json", "torch"},
                                        {"attn_core.native.family"})  # fmt: skip


def test_the_loader_knows_no_family() -> None:
    """The loader serves every family through its binding's class: it imports no binding, no
    family's split or facts, and of :mod:`attn_core.native.family` only the ``Family`` type."""
    edges = graph()
    reach = reachable(edges, "attn_core.native.loader")
    assert not reach & {*BINDINGS, "attn_core.native.split", "attn_core.native.facts"}, reach
    tree = ast.parse(path_of("attn_core.native.loader").read_text())
    names = {
        a.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "attn_core.native.family"
        for a in node.names
    }
    assert names <= {"Family"}, names


@pytest.mark.parametrize("binding", BINDINGS)
def test_each_binding_stands_on_the_loader(binding: str) -> None:
    """A family's binding imports the loader and the shared ABI, and never another family's
    binding."""
    edges = graph()
    wanted = {"attn_core.native.loader", "attn_core.native.abi"}
    assert wanted <= edges[binding], edges[binding]
    assert not reachable(edges, binding) & (set(BINDINGS) - {binding})


def test_the_native_layer_reaches_no_executor_or_resolver() -> None:
    """Below the decode, prefill and runtime packages: no native module but its command (an
    entry point, like the package top) reaches them, nor the package top."""
    edges = graph()
    for module in sorted(NATIVE - {"attn_core.native.__main__"}):
        reach = reachable(edges, module)
        above = {m for m in reach if m == "attn_core" or folder_of(m) in ABOVE_NATIVE}
        assert above == set(), (module, above)
