"""A few small native-prefill calls for compute-sanitizer (memcheck / racecheck), each checked
against the float64 reference; exits non-zero on a mismatch.

    compute-sanitizer --tool memcheck python bench/native_prefill_sanitize.py [--libs DIR]
    compute-sanitizer --tool racecheck python bench/native_prefill_sanitize.py --one

Shapes: varlen batches with contexts 0 / odd / several whole tiles, every matrix layer and tile
configuration, an fp8 cache, ALiBi with a window, and a forced split (the merge kernel).
"""

from __future__ import annotations

import argparse
import math
import sys

import torch

from attn_core.native import prefill_abi as pabi
from attn_core.native.prefill_launch import native_prefix_prefill
from attn_core.native.prefill_library import load_prefill
from attn_core.reference import make_prefill_case, reference_prefix_prefill

# contexts 0 / odd / several whole 64-key tiles (the wmma tile spreads a whole tile's copies
# through its products, the path a short context never takes)
SEQS = [(0, 17), (33, 5), (300, 40)]


def cases(one: bool):
    yield "wmma", pabi.CONFIG_LARGE, 1, dict(head_size=128)
    if one:
        return
    yield "wmma", pabi.CONFIG_32K, 1, dict(head_size=256)
    yield "wmma", pabi.CONFIG_LARGE, 2, dict(head_size=256)  # the warp-rows tile at its widest
    yield "fma", pabi.CONFIG_LARGE, 3, dict(head_size=64)
    yield "fma", pabi.CONFIG_32K, 1, dict(head_size=120)
    yield "wmma", pabi.CONFIG_LARGE, 2, dict(head_size=128, kv_cache_dtype="fp8_e4m3", k_scale=0.5)
    yield "wmma", pabi.CONFIG_32K, 2, dict(head_size=64, alibi=True, sliding_window=30)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--libs", default=None)
    p.add_argument("--one", action="store_true", help="only the first case (racecheck)")
    args = p.parse_args()
    failed = 0
    for mma, config, splits, kw in cases(args.one):
        lib, why = load_prefill(mma, torch.device("cuda"), library_dir=args.libs)
        if lib is None:
            print(f"{mma}: unavailable: {why}")
            return 2
        head = kw.pop("head_size")
        case = make_prefill_case(SEQS, 4, 2, head, 16, torch.float16, "cuda", **kw)
        out = torch.full_like(case.query, math.nan)
        native_prefix_prefill(
            lib, *case.args(), alibi_slopes=case.alibi_slopes, sliding_window=case.sliding_window,
            kv_cache_dtype=case.kv_cache_dtype, k_scale=case.k_scale, v_scale=case.v_scale,
            out=out, config=config, num_splits=splits,
        )  # fmt: skip
        torch.cuda.synchronize()
        ref_kw = case.reference_kwargs()
        want = reference_prefix_prefill(**ref_kw)
        err = float((out.double().cpu() - want).abs().max())
        ok = math.isfinite(err) and err < 1e-2
        failed += not ok
        print(f"{mma} config {config} splits {splits} head {head} {kw}: max err {err:.2e} "
              f"{'ok' if ok else 'MISMATCH'}")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
