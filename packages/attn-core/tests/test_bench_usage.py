"""bench/ scripts are user tools: a bad argument is a usage error (exit 2, a message naming the
argument), checked before any measurement, never a traceback or a run that ignores it. Only bad
arguments are given here, so nothing is measured (each case takes the interpreter's start)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from bench_modules import BENCH_DIR, ROOT

SRC = [os.path.join(ROOT, p) for p in ("packages/attn-core/src", "packages/sim/src", "hil/src")]


def _run(script: str, *args: str, tmp_path=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*SRC, os.environ.get("PYTHONPATH", "")])}
    path = os.path.join(BENCH_DIR, script)
    cmd = ["bash", path, *args] if script.endswith(".sh") else [sys.executable, path, *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)


CASES = {
    "decode device": ("decode_bench.py", ["--device", "banana"], ["--device", "banana"]),
    "decode out": ("decode_bench.py", ["--out", "/proc/nope"], ["--out", "/proc/nope"]),
    "decode iters": ("decode_bench.py", ["--iters", "0"], ["--iters"]),
    "decode shapes": ("decode_bench.py", ["--shapes", "1x"], ["--shapes"]),
    "prefill contexts abc": ("prefill_bench.py", ["--contexts", "abc"], ["--contexts", "abc"]),
    "prefill contexts -5": ("prefill_bench.py", ["--contexts", "-5"], ["--contexts", "-5"]),
    "prefill iters 0": ("prefill_bench.py", ["--iters", "0"], ["--iters", "0"]),
    "prefill budget nan": ("prefill_bench.py", ["--budget-s", "nan"], ["--budget-s"]),
    "prefill out": ("prefill_bench.py", ["--out", "/proc/nope"], ["--out"]),
    "resolve iters 0": ("prefill_resolve.py", ["--iters", "0"], ["--iters", "0"]),
    "resolve device": ("prefill_resolve.py", ["--device", "banana"], ["--device"]),
    "calibration profile": ("sim_calibration.py", ["--profile", "nope"], ["--profile", "nope"]),
    "calibration out": ("sim_calibration.py", ["--out", "/proc/nope"], ["--out"]),
    "tune arch": ("native_tune.py", ["build", "--arch", "sm_xx"], ["--arch", "sm_xx"]),
    "pair tune arch": ("linear_pair_tune.py", ["build", "--arch", "sm_xx"], ["--arch", "sm_xx"]),
    "pair tune prefill": ("linear_pair_tune.py", ["run", "--prefill", "8k"], ["--prefill", "8k"]),
    "pair tune varlen": ("linear_pair_tune.py", ["run", "--varlen", "8x"], ["--varlen", "8x"]),
    "pair tune rounds": ("linear_pair_tune.py", ["run", "--rounds", "0"], ["--rounds", "0"]),
    "pair tune out": ("linear_pair_tune.py", ["run", "--out", "/proc/nope"], ["--out"]),
    "bf16 numerics tokens": ("linear_bf16_numerics.py", ["--tokens", "1k"], ["--tokens", "1k"]),
    "bf16 numerics out": ("linear_bf16_numerics.py", ["--out", "/proc/nope"], ["--out"]),
    "vllm baseline extra": ("vllm_baseline.py", ["--bogus"], ["--bogus"]),
    "vllm prefix extra": ("vllm_prefix_prefill.py", ["--bogus"], ["--bogus"]),
    "facts extra": ("device_facts_h200.sh", ["--quik"], ["--quik"]),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_arguments_are_usage_errors(case, tmp_path):
    script, args, names = CASES[case]
    done = _run(script, *args, tmp_path=tmp_path)
    assert done.returncode == 2, (done.returncode, done.stdout[-500:], done.stderr[-1500:])
    assert "Traceback" not in done.stderr
    for name in names:
        assert name in done.stderr, done.stderr
    assert not os.listdir(tmp_path)  # nothing measured, nothing written
