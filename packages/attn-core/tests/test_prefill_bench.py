"""bench/prefill_bench.py --quick on the CPU: rows printed as measured, the JSON written as it
goes and on finishing, and --budget-s skipping (and naming) what it had no time for."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import attn_core

ROOT = os.path.abspath(os.path.join(os.path.dirname(attn_core.__file__), *[".."] * 4))
BENCH = os.path.join(ROOT, "bench", "prefill_bench.py")


def _run(tmp_path, *args: str) -> tuple[str, dict]:
    src = os.path.dirname(os.path.dirname(attn_core.__file__))
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, BENCH, "--quick", "--out", str(tmp_path), *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    with open(tmp_path / "prefill_bench.json") as f:
        return done.stdout, json.load(f)


def test_quick_run_measures_every_impl_and_checks_it(tmp_path) -> None:
    out, payload = _run(tmp_path, "--contexts", "70", "--chunks", "40", "--iters", "1")
    rows = {r["impl"]: r for r in payload["rows"]}
    assert payload["complete"] and not payload["skipped"]
    torch_row = rows["attn-core torch"]
    assert torch_row["ms"] > 0 and torch_row["max_err"] < 1e-2
    assert rows["baseline loop"]["max_err"] < 1e-2
    for impl in rows:  # one progress line per row, before the final table
        assert out.index(f"] {impl}") < out.index("done in")


def test_budget_skips_and_says_so(tmp_path) -> None:
    out, payload = _run(tmp_path, "--contexts", "70,30", "--chunks", "40", "--budget-s", "0")
    assert not payload["complete"] and payload["rows"] == []
    assert payload["skipped"] == ["context 70: all chunks [40]", "context 30: all chunks [40]"]
    assert out.count("skipped (time budget") == 2
