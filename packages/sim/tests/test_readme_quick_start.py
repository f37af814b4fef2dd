"""Issue 18 (a newcomer's first hour): the README's Quick start has exactly two commands for a
fresh machine, one ``nox -s sim`` and one ``nox -s tests``, and says beside them what they
cost and need: durations, CPU-only torch, Python 3.10, what lands outside the checkout."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[3] / "README.md"


def quick_start() -> str:
    text = README.read_text()
    start = text.index("## Quick start")
    return text[start : text.index("\n## ", start + 3)]


def test_exactly_two_commands_one_sim_one_tests():
    blocks = re.findall(r"```[a-z]*\n(.*?)```", quick_start(), re.S)
    commands = [line for b in blocks for line in b.splitlines() if line.strip()]
    assert len(commands) == 2, commands
    assert sum("nox -s sim" in c for c in commands) == 1
    assert sum("nox -s tests" in c for c in commands) == 1


def what_you_need() -> str:
    """The prerequisites, said before any command runs."""
    text = README.read_text()
    start = text.index("## What you need")
    assert start < text.index("## Quick start"), "the prerequisites come first"
    return text[start : text.index("\n## ", start + 3)]


def test_the_notes_beside_them_say_what_a_newcomer_needs():
    text = what_you_need() + quick_start()
    # how long each command takes, measured on a fresh clone (the numbers move with the suites)
    assert re.search(r"`nox -s sim` takes [0-9][0-9–-]* minutes", text), "nox -s sim's duration"
    assert re.search(r"`nox -s tests`\s+about [0-9]+ minutes", text), "nox -s tests' duration"
    for needed in (
        "12 GB",
        "8.4",
        "BI100_TORCH",
        "download.pytorch.org/whl/cpu",
        "python3.10",
        "~/.cache/bi100-attn/wheels",
        "pip install nox",
        "python -m pytest packages/",  # a quicker subset
    ):
        assert needed in text, needed
