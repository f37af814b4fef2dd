"""bench/linear_attn_bench.py on the CPU: usage errors exit 2 before anything is measured, and a
tiny run writes its JSON and ends with the table."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from bench_modules import bench_module, bench_path

import attn_core
from attn_core.reference import reference_gated_delta


def _run(tmp_path, *args: str) -> subprocess.CompletedProcess:
    src = os.path.dirname(os.path.dirname(attn_core.__file__))
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, bench_path("linear_attn_bench"), "--out", str(tmp_path), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    "args",
    [
        ("--prefill", "abc"),
        ("--prefill", "0"),
        ("--varlen", "3y5"),
        ("--varlen", "0x5"),
        ("--decode-batches", "-1"),
        ("--iters", "0"),
        ("--matrix-tflops", "0"),
        ("--bogus",),
    ],
)
def test_usage_errors_exit_2(tmp_path, capsys, args) -> None:
    bench = bench_module("linear_attn_bench")
    with pytest.raises(SystemExit) as done:
        bench.main(["--out", str(tmp_path), "--quick", *args])
    assert done.value.code == 2
    assert "error:" in capsys.readouterr().err
    assert not (tmp_path / "linear_attn_bench.json").exists()


def test_quick_run_writes_rows_and_ends_with_the_table(tmp_path) -> None:
    done = _run(tmp_path, "--quick", "--prefill", "70", "--varlen", "2x65",
                "--decode-batches", "2", "--iters", "1")  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    with open(tmp_path / "linear_attn_bench.json") as f:
        payload = json.load(f)
    assert payload["complete"]
    rows = {(r["kind"], r["case"], r["impl"]): r for r in payload["rows"]}
    ours = rows[("prefill", "70", "attn-core torch")]
    assert ours["ms"] > 0 and ours["max_err"] < 2e-2
    assert rows[("decode", "batch 2", "attn-core torch")]["ms"] > 0
    assert "needs a CUDA device" in rows[("decode", "batch 2", "attn-core native")]["note"]
    assert done.stdout.rstrip().splitlines()[-1].startswith("| prefill")  # decode rows first


def test_bf16_numerics_study_matches_the_reference_in_fp32(tmp_path) -> None:
    """bench/linear_bf16_numerics.py's chunked form: exact (fp32) it is the float64 recurrence
    within fp32's error over chunk edges (130 tokens), and rounding every site to bf16 moves it
    by more; inputs moved by half a bf16 ulp move the recurrence's state more than by half an
    fp16 ulp, and more than fp32's error; a run writes its JSON."""
    study = bench_module("linear_bf16_numerics")
    x = study._inputs(130, 1, seed=1)
    want_o, want_s = reference_gated_delta(**x, use_qk_l2norm=True)
    exact = study.chunked(x, frozenset(), torch.float32)
    rounded = study.chunked(x, frozenset(study.SITES), torch.bfloat16)
    assert study._err(exact[0], want_o[0]) < 1e-5 and study._err(exact[1], want_s[0]) < 1e-5
    assert study._err(rounded[1], want_s[0]) > 10 * study._err(exact[1], want_s[0])
    moved = {
        dtype: reference_gated_delta(**study.moved_inputs(x, dtype, seed=2), use_qk_l2norm=True)
        for dtype in (torch.bfloat16, torch.float16)
    }
    bf16_moved = study._err(moved[torch.bfloat16][1], want_s[0])
    assert bf16_moved > 4 * study._err(moved[torch.float16][1], want_s[0]) > 0
    assert bf16_moved > 10 * study._err(exact[1], want_s[0])
    assert study.main(["--tokens", "70", "--value-heads", "1", "--out", str(tmp_path)]) == 0
    with open(tmp_path / "linear_bf16_numerics.json") as f:
        assert len(json.load(f)["rows"]) == 8
