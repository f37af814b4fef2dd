"""Time attn-core's decode on this GPU over a grid, then calibrate attn_sim against it.

The issue's check: calibrate the simulator's bandwidth, rates and launch overhead on half of
the cases, and the predicted decode time of attn-core's torch path must be within +-25 % of the
measured time on the other half (8K-100K contexts, batch 1-64, Qwen3.6 shape). The
uncalibrated (datasheet) error is reported too.

Usage: python3 bench/sim_calibration.py [--profile h200] [--out results/] [--quick]
Writes OUT/sim_calibration_measurements.json (the format ``python -m attn_sim calibrate``
reads), OUT/calibrated_profile.json and OUT/calibration.json; prints the per-case table and
the verdict last. ``--quick`` runs tiny sizes on any device (the flow, not the numbers).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import copy_bandwidth, device_info, median_time_s  # noqa: E402

K = 1024
CONTEXTS = (8 * K, 16 * K, 32 * K, 64 * K, 100 * K)
BATCHES = (1, 4, 16, 64)
QUICK_CONTEXTS, QUICK_BATCHES = (256, 1024), (1, 2)
HEADS, KV_HEADS, HEAD, BLOCK = 24, 4, 256, 16
TOLERANCE_PCT = 25.0


def make_inputs(num_seqs: int, context: int, device: torch.device, dtype=torch.float16):
    """Random decode inputs built on the device (no host copy of a 27 GB cache)."""
    x = 16 // torch.empty((), dtype=dtype).element_size()
    per_seq = -(-context // BLOCK)
    num_blocks = num_seqs * per_seq
    g = torch.Generator(device=device).manual_seed(0)
    kc = torch.randn(
        num_blocks, KV_HEADS, HEAD // x, BLOCK, x, device=device, dtype=dtype, generator=g
    )
    vc = torch.randn(num_blocks, KV_HEADS, HEAD, BLOCK, device=device, dtype=dtype, generator=g)
    tables = torch.randperm(num_blocks, device=device, generator=g).view(num_seqs, per_seq)
    seq_lens = torch.full((num_seqs,), context, dtype=torch.int32, device=device)
    query = torch.randn(num_seqs, HEADS, HEAD, device=device, dtype=dtype, generator=g)
    return query, kc, vc, tables.to(torch.int32).contiguous(), seq_lens


def fits(num_seqs: int, context: int, device: torch.device) -> bool:
    if device.type != "cuda":
        return True
    kv = 2 * num_seqs * context * KV_HEADS * HEAD * 2
    free, _ = torch.cuda.mem_get_info(device)
    return 3.5 * kv < free  # cache + ~2.3x transient (gathered K/V, scores) + margin


def measure(device: torch.device, quick: bool) -> list:
    import attn_core

    contexts, batches = (QUICK_CONTEXTS, QUICK_BATCHES) if quick else (CONTEXTS, BATCHES)
    records = []
    for context, num_seqs in itertools.product(contexts, batches):
        case = {
            "path": "decode",
            "num_seqs": num_seqs,
            "context": context,
            "num_heads": HEADS,
            "num_kv_heads": KV_HEADS,
            "head_size": HEAD,
            "block_size": BLOCK,
            "dtype": "float16",
        }
        if not fits(num_seqs, context, device):
            records.append({"case": case, "skipped": "does not fit in free device memory"})
            continue
        inputs = make_inputs(num_seqs, context, device)
        step = functools.partial(attn_core.paged_decode, *inputs, context)
        t = median_time_s(step, device, warmup=3, iters=5 if quick else 20)
        records.append({"case": case, "measured_s": t})
        print(f"decode b{num_seqs} ctx{context}: {t * 1e3:.3f} ms", flush=True)
        del inputs, step
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return records


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="h200")
    parser.add_argument("--out", default="results")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()

    from tabulate import tabulate

    from attn_sim import calibrate
    from attn_sim.profiles import load_profile

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records = measure(device, args.quick)
    src = out / "sim_calibration_measurements.json"
    src.write_text(
        json.dumps(
            {
                "device": device_info(device),
                "copy_bandwidth_bytes_per_s": copy_bandwidth(
                    device, 1 << (30 if not args.quick else 24)
                ),
                "records": records,
            },
            indent=1,
            default=str,
        )
    )
    result = calibrate.run(load_profile(args.profile), src, out, variant=None)
    print(tabulate(result["rows"], headers="keys", tablefmt="github", floatfmt=".3f"))
    fields = [(k, result["before"][k], v) for k, v in result["fields"].items()]
    print(tabulate(fields, headers=("constant", "datasheet", "calibrated"), tablefmt="github"))
    s = result["summary"]
    worst = s["validate_calibrated_err_pct_max"]
    verdict = "PASS" if worst is not None and worst <= TOLERANCE_PCT else "FAIL"
    print(
        f"validation half: max |error| {worst:.1f}% calibrated "
        f"({s['validate_uncalibrated_err_pct_max']:.1f}% uncalibrated); "
        f"+-{TOLERANCE_PCT:.0f}% target: {verdict}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
