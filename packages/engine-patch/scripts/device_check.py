"""Device check: ``engine-patch status`` over model shapes and dtypes on this machine's GPU.

Runs the status report (plans at 1K/8K/32K/100K and the numeric self-test against the float64
reference) for each shape x dtype, writes every report as JSON into ``--out`` and prints a
short table last. Exit status is the worst report's.

    python packages/engine-patch/scripts/device_check.py --out results/engine-patch
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from tabulate import tabulate

from attn_core.core.shapes import DTYPE_NAMES, AttentionShape
from engine_patch.status import collect

SHAPES = {
    "qwen3.6": (24, 4, 256),
    "qwen3.5-35b-a3b": (16, 2, 256),
    "qwen3.6-tp4": (6, 1, 256),
    "llama": (32, 8, 128),
}


def _names_of(known: dict) -> Callable[[str], list[str]]:
    """An argparse type: comma-separated names, each a key of ``known``."""

    def parse(text: str) -> list[str]:
        names = text.split(",")
        unknown = [n for n in names if n not in known]
        if unknown:
            raise argparse.ArgumentTypeError(
                f"must be comma-separated names of {sorted(known)}, got {text!r}"
            )
        return names

    return parse


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results", help="directory for the JSON reports")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--shapes", type=_names_of(SHAPES), default=list(SHAPES))
    parser.add_argument("--dtypes", type=_names_of(DTYPE_NAMES), default=list(DTYPE_NAMES))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    rows, worst = [], 0
    for name in args.shapes:
        heads, kv, head = SHAPES[name]
        for dtype in args.dtypes:
            report = collect(AttentionShape(heads, kv, head, 16, DTYPE_NAMES[dtype]), device)
            (out / f"engine-patch-status-{name}-{dtype}.json").write_text(
                json.dumps(report, indent=2, default=str)
            )
            checks = report["self_test"]
            worst = max(worst, report["exit_code"])
            rows.append(
                [
                    name,
                    dtype,
                    " / ".join(f"{p['tier']}x{p['partitions']}" for p in report["decode_plans"]),
                    f"{sum(c['passed'] for c in checks)}/{len(checks)}",
                    max((c["max_error"] for c in checks), default=0.0),
                    report["exit_code"],
                ]
            )
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device {device} ({name})")
    headers = [
        "shape",
        "dtype",
        "decode tier x partitions @1K/8K/32K/100K",
        "self-test",
        "max error",
        "exit",
    ]
    print(tabulate(rows, headers=headers, floatfmt=".2e"))
    return worst


if __name__ == "__main__":
    sys.exit(main())
