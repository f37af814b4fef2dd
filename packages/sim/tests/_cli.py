"""Running ``python -m attn_sim`` in-process for the CLI tests, and TOML for their config files.

:func:`run` calls :func:`attn_sim.cli.main` with stdout/stderr captured; any exception that
escapes ``main`` propagates (that would be a traceback for a user, so the test fails).
:func:`stop_before` replaces a command's expensive step with one that raises :class:`Reached`,
so a property test learns that every argument was accepted without paying for the work.
:func:`changed` breaks one key of a nested config (a gates file, a device-facts file).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from unittest import mock

from attn_sim.cli import main

CODES = {0, 1, 2}  # documented: done, a gate failed, bad usage or input
# A gates file that is valid and quick to run: one profile, one decode case, a tiny plan grid.
SMALL = {
    "profiles": ["bi-v100"],
    "decode": {
        "cases": [[1, 1024]],
        "max_launches": 28,
        "max_launches_by_tier": {"single_tile": 19, "one_pass": 19, "partitioned": 28},
        "max_plan_launches": 2,
        "max_syncs": 0,
        "transient_kv_ratio": 1.25,
        "transient_floor_bytes": 67108864,
        "profile": {"bi-v100": {"transient_kv_ratio": 2.5}},
    },
    "prefill": {"cases": [], "max_syncs": 2, "transient_over_kv_bytes": 1073741824},
    "plan": {"batches": [1], "context_min": 1024, "context_max": 2048, "steps_per_octave": 1},
    "time": {"tolerance": 0.1},
}


DELETE = object()  # as the value given to changed(): remove the key


def changed(data: dict, dotted: str, value: object) -> dict:
    """A deep copy of ``data`` with the key at ``dotted`` (``"plan.context_min"``) set to
    ``value``, or removed where ``value`` is :data:`DELETE`."""
    data = copy.deepcopy(data)
    *parents, last = dotted.split(".")
    node = data
    for p in parents:
        node = node[p]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return data


class Reached(Exception):
    """The command got past its input checks to the work."""


@dataclass
class Result:
    code: object  # an exit code, or "reached" (see stop_before)
    out: str
    err: str


def run(*argv: str) -> Result:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code: object = main(list(argv))
        except Reached:
            code = "reached"
    return Result(code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def stop_before(*targets: str) -> Iterator[None]:
    """Patch each dotted target (``"attn_sim.report.build"``) to raise :class:`Reached`."""

    def reached(*args, **kwargs):
        raise Reached

    with contextlib.ExitStack() as stack:
        for t in targets:
            stack.enter_context(mock.patch(t, reached))
        yield


def assert_clean(r: Result) -> None:
    """No traceback, a documented exit code, and exit 2 says what was wrong."""
    assert "Traceback" not in r.err, r.err
    assert r.code in CODES or r.code == "reached", r.code
    if r.code == 2:
        assert "error:" in r.err, r.err


def assert_bad_input(r: Result, *names: str) -> None:
    """Exit 2, no traceback, and the message names each of ``names``."""
    assert_clean(r)
    assert r.code == 2, (r.code, r.out[-500:], r.err)
    for name in names:
        assert name in r.err, (name, r.err)


def _toml_string(s: str) -> str:
    """A TOML basic string: JSON's escapes, non-ASCII kept (TOML refuses escaped surrogate
    pairs) and DEL escaped (TOML refuses it raw)."""
    return json.dumps(s, ensure_ascii=False).replace("\x7f", "\\u007f")


def toml_value(v) -> str:
    """A TOML literal for a JSON-like value (inline tables for dicts)."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, str):
        return _toml_string(v)
    if isinstance(v, (int, float)):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return (
            "{" + ", ".join(f"{_toml_string(str(k))} = {toml_value(x)}" for k, x in v.items()) + "}"
        )
    raise TypeError(type(v))


def to_toml(data: dict) -> str:
    """Top-level scalars first, then one ``[table]`` per dict value."""
    lines = [
        f"{_toml_string(k)} = {toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)
    ]
    for k, v in data.items():
        if isinstance(v, dict):
            lines.append(f"[{_toml_string(k)}]")
            lines += [f"{_toml_string(kk)} = {toml_value(vv)}" for kk, vv in v.items()]
    return "\n".join(lines) + "\n"
