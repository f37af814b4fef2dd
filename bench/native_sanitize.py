"""A few native decode steps for compute-sanitizer (memcheck, racecheck), each checked.

    compute-sanitizer --tool memcheck python3 bench/native_sanitize.py
    compute-sanitizer --tool racecheck python3 bench/native_sanitize.py

Shapes cover one and several partitions, partial tiles, 8-token blocks with fp8 (8-byte value
copies) and with fp16 (the matrix-unit body's value copies at page edges), fp8 caches widened
on the matrix-unit body (e4m3 and e5m2, 16- and 32-token pages, head 80 below its bucket),
GQA 6, 8 and 16 (a group over two blocks), head 64 (two token groups), 80 and 256, and a merge
of 257 partitions.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packages/attn-core/tests"))
from native_helpers import cuda_case, reference, run_native  # noqa: E402

CASES = [
    # lens, heads, kv_heads, head, block, dtype, kv_cache_dtype, partitions, partition size
    ([1, 15, 16, 17, 300], 24, 4, 256, 16, torch.float16, "auto", 3, 128),
    ([1, 300], 24, 4, 256, 16, torch.bfloat16, "auto", 1, 384),
    ([9, 200], 32, 2, 64, 8, torch.float32, "auto", 4, 64),
    ([33, 250], 8, 2, 128, 8, torch.float16, "fp8_e4m3", 2, 128),
    ([7, 129], 4, 4, 80, 32, torch.float16, "auto", 2, 96),
    # the matrix-unit body: 8-token blocks, partitions of 72 (tiles start mid-page), group 8
    ([9, 200], 16, 2, 128, 8, torch.float16, "auto", 3, 72),
    # fp8 widened on the matrix-unit body: bf16 queries over e5m2, e4m3 at head 80, 32-token pages
    ([5, 300], 24, 4, 256, 16, torch.bfloat16, "fp8_e5m2", 3, 112),
    ([7, 129], 4, 4, 80, 32, torch.float16, "fp8_e4m3", 2, 96),
    # the merge over 257 partitions: 16-dimension slices, rounds of eight loads, head 80's slices
    ([3, 4100], 12, 2, 80, 16, torch.float16, "auto", 260, 16),
]


def main() -> int:
    worst = 0.0
    for lens, h, kvh, d, bs, dtype, kv, parts, ps in CASES:
        case = cuda_case(lens, h, kvh, d, bs, dtype, kv_cache_dtype=kv)
        got = run_native(case, parts, ps)
        torch.cuda.synchronize()
        err = float((got.double().cpu() - reference(case)).abs().max())
        worst = max(worst, err)
        print(f"{lens} {h}/{kvh} head {d} block {bs} {dtype} {kv} {parts}x{ps}: max err {err:.2e}")
    print(f"worst {worst:.2e}")
    return 0 if worst < 3e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
