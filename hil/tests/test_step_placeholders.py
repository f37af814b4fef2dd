"""A command step's ``{python}``, ``{payload}``, ``{out}``, ``{junit}`` are replaced exactly;
any other brace, ``{'a': 1}`` or an unknown ``{name}``, passes through unchanged."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "suites"))
import run_suite  # noqa: E402

from hil.config import Step, Suite, Target  # noqa: E402
from hil.runner import run_all  # noqa: E402
from hil.status import Status  # noqa: E402


@pytest.mark.parametrize(
    "arg, want",
    [
        ("print({'a': 1})", "print({'a': 1})"),
        ("{out}/x {unknown} {{out}} {}", "OUT/x {unknown} {OUT} {}"),
        ("{python}{payload}{junit}", "PYPAYJ"),
        ("{ out }", "{ out }"),
    ],
)
def test_only_known_placeholders_are_replaced(arg, want):
    fields = {"python": "PY", "payload": "PAY", "out": "OUT", "junit": "J"}
    assert run_suite.substitute(arg, fields) == want


def test_command_with_braces_runs_locally(make_ctx):
    code = "import sys, json; json.dump({'a': 1}, open(sys.argv[1] + '/braces.json', 'w'))"
    step = Step(name="braces", command=("{python}", "-c", code, "{out}"))
    results = run_all([Target("local")], [Suite("b", (step,), 60.0)], make_ctx("local"))
    assert results[0].status == Status.PASS, results[0].detail
    assert json.loads((Path(results[0].artifacts) / "braces.json").read_text()) == {"a": 1}
