"""``python -m attn_sim`` for a person at a terminal: ``nox -s sim -- ARGS`` hands ARGS only to
the command that takes them, ``--help`` is plain text (no reST backticks), and a missing
dependency is one line naming it and how to install it, exit 2, never a traceback."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest

from attn_sim.cli import build_parser

REPO = Path(__file__).resolve().parents[3]


class _Session:
    def __init__(self, posargs):
        self.posargs = posargs
        self.runs = []

    def run(self, *args, **kwargs):
        self.runs.append(args)

    def install(self, *args, **kwargs):
        pass


def _noxfile(monkeypatch):
    """The repository's noxfile, with a stand-in ``nox`` module (nox is not a test dependency)."""
    nox = types.ModuleType("nox")
    nox.options = types.SimpleNamespace()
    nox.Session = _Session
    nox.session = lambda *a, **k: a[0] if a and callable(a[0]) else (lambda f: f)
    monkeypatch.setitem(sys.modules, "nox", nox)
    namespace = {"__name__": "noxfile", "__file__": str(REPO / "noxfile.py")}
    exec(compile((REPO / "noxfile.py").read_text(), "noxfile.py", "exec"), namespace)
    namespace["_install_stack"] = lambda *a, **k: None
    namespace["_cpu_tests"] = lambda *a, **k: None
    namespace["sim"].__globals__.update(namespace)
    return namespace


@pytest.mark.parametrize("posargs", [["--full"], ["--shape", "16,2,128"], []])
def test_nox_sim_passes_each_command_only_what_it_accepts(monkeypatch, posargs):
    noxfile = _noxfile(monkeypatch)
    session = _Session(posargs)
    noxfile["sim"](session)
    calls = [list(a[3:]) for a in session.runs if a[:3] == ("python", "-m", "attn_sim")]
    assert [c[0] for c in calls] == ["report", "gates"]
    parser = build_parser()
    for argv in calls:
        parser.parse_args(argv)  # a rejected argument exits 2 here
    assert calls[0][-len(posargs) :] == posargs if posargs else True


def _help_texts():
    parser = build_parser()
    yield "attn_sim", parser.format_help()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, p in sub.choices.items():
        yield name, p.format_help()


@pytest.mark.parametrize("name, text", list(_help_texts()))
def test_help_is_plain_text(name, text):
    assert "``" not in text, text


HIDE_TORCH = """
import sys
class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _NoTorch())
sys.argv = ["attn_sim", *sys.argv[1:]]
import runpy
runpy.run_module("attn_sim", run_name="__main__")
"""


def test_without_torch_one_line_and_exit_2(tmp_path):
    p = subprocess.run(
        [sys.executable, "-c", HIDE_TORCH, "report", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert "torch" in lines[0] and "pip install" in lines[0]
