"""The library's linear-attention prefill call against its kernels launched directly, for one
tree (PYTHONPATH picks it): what the entry point adds on the host and the device.

    PYTHONPATH=<tree>/packages/attn-core/src python3 bench/linear_call_ab.py TAG [--out DIR]

At the model's shape (16 key / 32 value heads, K = V = 128, bf16, l2-normalised q/k; the
inputs of bench/linear_pair_tune.py) for 1 x 32K, 1 x 128K, 8 x 16K and 32 x 2K:
``chunk_gated_delta_rule(..., backend="native")`` and the 16-bit pair it takes launched
directly (``launch_chunk_parallel_prefill(operands16=True)``), each eager, CUDA events over
three back-to-back calls, median of five; each row's three largest kernels (torch.profiler);
the call's output against the direct launch's and the torch path's (output and final-state
differences). Run it once per tree on one machine and compare the tables
(docs/benchmarks.md#gated-deltanet shows one such pair). Measures, never asserts.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _args import writable_dir  # noqa: E402
from _timing import device_info, event_ms, kernel_profile, print_table, write_results  # noqa: E402
from linear_pair_tune import HEAD_K, HEAD_V, HEADS, VALUE_HEADS, _inputs  # noqa: E402

from attn_core.linear.api import chunk_gated_delta_rule  # noqa: E402
from attn_core.linear.backend import native_library  # noqa: E402
from attn_core.native.gated_delta import LinearShape, launch_chunk_parallel_prefill  # noqa: E402

K = 1024
CASES = [("32K", [32 * K]), ("128K", [128 * K]), ("8x16K", [16 * K] * 8), ("32x2K", [2 * K] * 32)]


def _median_ms(fn) -> float:
    for _ in range(2):
        fn()
    return statistics.median(event_ms(fn, calls=3) for _ in range(5))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tag", help="the tree's name in the table")
    ap.add_argument("--out", type=writable_dir, default=None, help="folder for the JSON")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device")
        return 1
    dev = torch.device("cuda")
    shape = LinearShape(HEADS, VALUE_HEADS, HEAD_K, HEAD_V, torch.bfloat16)
    lib = native_library("native", "linear_call_ab", dev, shape, None)
    rows = []
    for label, lengths in CASES:
        x = _inputs(sum(lengths), dev)
        out = torch.empty(sum(lengths), VALUE_HEADS, HEAD_V, dtype=torch.bfloat16, device=dev)
        final = torch.empty(len(lengths), VALUE_HEADS, HEAD_K, HEAD_V, device=dev)
        direct = functools.partial(
            launch_chunk_parallel_prefill, lib, **x, lengths=lengths, out=out,
            scale=HEAD_K**-0.5, l2norm=True, final_state=final, operands16=True,
        )  # fmt: skip
        offsets = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
        batch = [x[n][None] for n in ("q", "k", "v", "g", "beta")]
        call = functools.partial(
            chunk_gated_delta_rule, *batch, output_final_state=True, cu_seqlens=offsets,
            use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        row = {"tree": args.tag, "case": label}
        for name, fn in (("direct", direct), ("call", functools.partial(call, backend="native"))):
            row[f"{name}_ms"] = _median_ms(fn)
            profiled = kernel_profile(fn, dev)
            row[f"{name}_kernels"] = profiled.top(3) if profiled else ""
        direct()
        got, got_final = call(backend="native")
        want, want_final = call(backend="torch")
        row["call_vs_direct"] = float((got[0].float() - out.float()).abs().max())
        row["output_vs_torch"] = float((got[0].float() - want[0].float()).abs().max())
        row["state_vs_torch"] = float((got_final - want_final).abs().max())
        rows.append(row)
        print(row, flush=True)
    print(device_info(dev))
    print_table(rows, ["tree", "case", "direct_ms", "call_ms", "call_vs_direct",
                       "output_vs_torch", "state_vs_torch"])  # fmt: skip
    if args.out is not None:
        print(write_results(args.out, f"linear_call_ab_{args.tag}.json", {"rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
