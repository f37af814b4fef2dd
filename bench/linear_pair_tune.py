"""Tuning the chunk-parallel Gated DeltaNet prefill: compile-time variants of csrc/gated_delta.cu
timed side by side on the same inputs.

    python3 bench/linear_pair_tune.py build --out .gdn-variants        # here (nvcc, no GPU needed)
    python3 bench/linear_pair_tune.py run --variants .gdn-variants     # on the GPU

Each variant is the family's library built with other defines (``VARIANTS``: a form under
study goes in the source behind a define and here beside ``default``, and leaves both once
timed). ``run`` first checks every
variant against the float64 recurrence (the pair's own verify-once check, bf16 at the model's
head sizes), then times the pair (``launch_chunk_parallel_prefill``; ``--pair 16bit``: the
16-bit pair on the matrix unit, checked by its own check; the model's 16 / 32 heads,
K = V = 128, bf16, l2-normalised q/k) at each ``--prefill`` length and ``--varlen`` batch,
variant after variant in ``--rounds`` interleaved rounds (CUDA events, median of 5 a round),
and prints the median of the rounds' medians, each variant's kernel split at the first case
(torch.profiler) and its largest output difference from ``default``. Measures, never asserts;
``--out`` gets the JSON.
"""

from __future__ import annotations

import functools
import statistics
import sys
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _args import batches, positive_int, positive_ints, writable_dir  # noqa: E402
from native_tune import build_variants, variant_commands  # noqa: E402

# Timed and settled (H100, three interleaved rounds; docs/benchmarks.md#gated-deltanet):
# chunk_prep's blocked solve won and is the source's only solve; chunk_pass on 256 threads and
# chunk_pass reading its records from L2 lost and were deleted.
# chunk_pass16 on 64 value columns a block lost for one sequence (csrc/gated_delta_pair16.cuh).
VARIANTS: dict[str, tuple[str, ...]] = {"default": ()}
HEADS, VALUE_HEADS, HEAD_K, HEAD_V = 16, 32, 128, 128
K = 1024


def build(out: Path, archs: tuple[str, ...]) -> int:
    from attn_core.native.gated_delta import VARIANT

    return build_variants(out, archs, "gated_delta", VARIANT, VARIANTS)


def _cases(prefill: list[int], varlen: list[tuple[int, int]]) -> list[tuple[str, list[int]]]:
    """``(label, lengths)`` of each single-sequence prefill, then of each varlen batch."""
    cases = [(f"{n // K}K", [n]) for n in prefill]
    return cases + [(f"{count}x{length // K}K", [length] * count) for count, length in varlen]


def _inputs(total: int, device):
    """Model-like inputs of ``total`` packed tokens: bf16 q/k/v and beta, fp32 g in [-5, 0]."""
    import torch

    gen = torch.Generator(device=device).manual_seed(total)
    shapes = {"q": (HEADS, HEAD_K), "k": (HEADS, HEAD_K), "v": (VALUE_HEADS, HEAD_V)}
    x = {n: torch.randn(total, *s, generator=gen, device=device, dtype=torch.bfloat16)
         for n, s in shapes.items()}  # fmt: skip
    x["g"] = -torch.rand(total, VALUE_HEADS, generator=gen, device=device).mul_(5).square_() / 5
    x["beta"] = torch.rand(total, VALUE_HEADS, generator=gen, device=device).bfloat16()
    return x


def _load(variants: Path, device, operands16: bool) -> Optional[dict]:
    """Every variant's library, each checked against the float64 recurrence (the 16-bit pair's
    check with ``operands16``); None (and why, printed) when one is missing or fails it."""
    import torch

    from attn_core.native.family import GATED_DELTA
    from attn_core.native.gated_delta import (
        VARIANT,
        GatedDeltaLibrary,
        check_chunk_parallel,
        check_chunk_parallel16,
    )

    libs = {}
    for name in VARIANTS:
        path = variants / name / GATED_DELTA.library_name(VARIANT)
        if not path.is_file():
            print(f"{name}: no library at {path} (run `build` first)")
            return None
        libs[name] = lib = GatedDeltaLibrary(path)
        facts = lib.kernel_info("chunk_pass16" if operands16 else "chunk_pass", HEAD_K)
        config = (path.name, torch.bfloat16, HEAD_K, HEAD_V, VALUE_HEADS // HEADS)
        check = check_chunk_parallel16 if operands16 else check_chunk_parallel
        verdict = check(lib, device, config)
        print(
            f"{name}: pass {facts.num_regs} registers, {facts.blocks_per_sm} blocks an SM, "
            f"{facts.local_bytes} B local; float64 check: {verdict.ok} ({verdict.detail})"
        )
        if not verdict.ok:
            return None
    return libs


def run(
    variants: Path,
    cases: list[tuple[str, list[int]]],
    rounds: int,
    out: Optional[str],
    operands16: bool = False,
) -> int:
    import torch
    from _timing import kernel_profile, median_time_s, write_results
    from tabulate import tabulate

    from attn_core.native.gated_delta import launch_chunk_parallel_prefill

    if not torch.cuda.is_available():
        print("run needs a CUDA device (build does not)")
        return 1
    dev = torch.device("cuda")
    libs = _load(variants, dev, operands16)
    if libs is None:
        return 1
    rows = []
    for label, lengths in cases:
        total = sum(lengths)
        x = _inputs(total, dev)
        final = torch.empty(len(lengths), VALUE_HEADS, HEAD_K, HEAD_V, device=dev)
        outs, calls = {}, {}
        for name, lib in libs.items():
            outs[name] = torch.empty(total, VALUE_HEADS, HEAD_V, dtype=torch.bfloat16, device=dev)
            calls[name] = functools.partial(
                launch_chunk_parallel_prefill, lib, **x, lengths=lengths, out=outs[name],
                scale=HEAD_K**-0.5, l2norm=True, final_state=final, operands16=operands16,
            )  # fmt: skip
        times: dict[str, list[float]] = {n: [] for n in libs}
        for _ in range(rounds):
            for name, call in calls.items():
                times[name].append(1e3 * median_time_s(call, dev, warmup=2, iters=5))
        for name, call in calls.items():
            diff = (outs[name].float() - outs["default"].float()).abs().max()
            row = {"case": label, "variant": name, "ms": round(statistics.median(times[name]), 3),
                   "rounds": " / ".join(f"{t:.2f}" for t in times[name]),
                   "diff_vs_default": float(diff)}  # fmt: skip
            if label == cases[0][0]:
                profiled = kernel_profile(call, dev)
                row["kernels"] = profiled.top(2) if profiled else ""
            rows.append(row)
            print(row, flush=True)
    print(tabulate(rows, headers="keys", tablefmt="github"))
    if out is not None:
        print(write_results(out, "linear_pair_tune.json", {"rows": rows}))
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    ap, r = variant_commands(__doc__, ".gdn-variants")
    r.add_argument("--prefill", type=positive_ints, default="8192,32768,131072",
                   help="comma-separated lengths")  # fmt: skip
    r.add_argument("--varlen", type=batches, default="8x16384", help="NxL batches, comma-separated")
    r.add_argument("--rounds", type=positive_int, default=3, help="interleaved rounds")
    r.add_argument("--out", type=writable_dir, default=None, help="folder for the JSON")
    r.add_argument("--pair", choices=("fp32", "16bit"), default="fp32",
                   help="the fp32 pair or the 16-bit pair on the matrix unit")  # fmt: skip
    args = ap.parse_args(argv)
    if args.cmd == "build":
        return build(args.out, args.arch)
    return run(args.variants, _cases(args.prefill, args.varlen), args.rounds, args.out,
               args.pair == "16bit")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
