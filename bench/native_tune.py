"""Tuning the native decode kernel: compile-time variants timed side by side under CUDA graphs.

    python3 bench/native_tune.py build --out .native-variants      # here (nvcc, no GPU needed)
    python3 bench/native_tune.py run --variants .native-variants   # on the GPU

Each variant is the kernel built with other ``ATTN_THREADS`` / ``ATTN_KEY_LOADS`` /
``ATTN_VALUE_LOADS`` / ``ATTN_MIN_BLOCKS`` (``csrc/paged_decode.cu``, the CUDA-core body), or
the default build (``mma``: the matrix-unit body of ``csrc/decode_warp.cuh``, eight warp
streams a block at head 256; ``mma_b3`` with ``ATTN_MIN_BLOCKS``; ``mma_w4`` with four), fp16
queries and head bucket 256 only (``ATTN_TUNING_ONLY``: seconds to build). ``run`` prints,
per variant, the driver's registers and resident blocks per SM and the best CUDA-graph time
per shape over a few partition splits (Qwen3.6 24/4 heads, head 256, block 16), plus fp8 at
1 x 100K.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _args import native_archs  # noqa: E402

# The CUDA-core body's knobs (ATTN_DECODE_MMA=0: fp16 would take the matrix-unit body), then the
# matrix-unit body (csrc/decode_warp.cuh). ATTN_KEY_LOADS / ATTN_VALUE_LOADS: 16-byte loads per
# pipeline chunk (two chunks in flight); ATTN_MIN_BLOCKS: a register cap through launch bounds
# (three blocks per SM spilled 400 bytes in the 16-bit matrix-unit kernels, nvcc 13.0 sm_90).
_BASE = ("ATTN_DECODE_MMA=0", "ATTN_THREADS=128", "ATTN_KEY_LOADS=4", "ATTN_VALUE_LOADS=4")
_CORE = ("ATTN_DECODE_MMA=0", "ATTN_THREADS=128")
VARIANTS = {
    "base": _BASE,
    "b4": (*_BASE, "ATTN_MIN_BLOCKS=4"),
    "k8": (*_CORE, "ATTN_KEY_LOADS=8", "ATTN_VALUE_LOADS=4"),
    "k8_v8": (*_CORE, "ATTN_KEY_LOADS=8", "ATTN_VALUE_LOADS=8"),
    "k8_v8_b2": (*_CORE, "ATTN_KEY_LOADS=8", "ATTN_VALUE_LOADS=8", "ATTN_MIN_BLOCKS=2"),
    "t256": ("ATTN_DECODE_MMA=0", "ATTN_THREADS=256", "ATTN_KEY_LOADS=4", "ATTN_VALUE_LOADS=4"),
    "mma": (),
    "mma_b3": ("ATTN_MIN_BLOCKS=3",),
    "mma_w4": ("ATTN_DECODE_WARPS_256=4",),
}  # fmt: skip
TUNING_GROUP = 6  # Qwen3.6: 24 query / 4 KV heads
K = 1024
SHAPES = ((1, 8 * K), (1, 100 * K), (8, 100 * K), (64, 8 * K), (1, 256 * K))


def build_variants(
    out: Path, archs: tuple[str, ...], family: str, variant: str, variants: dict[str, tuple]
) -> int:
    """Each of ``variants`` (name -> extra defines) of ``family``'s ``variant`` built into
    ``out/<name>/``; 1 (and why) without a toolchain for ``archs``. linear_pair_tune.py builds
    through here too."""
    from attn_core.native.build import build_variant
    from attn_core.native.family import FAMILIES
    from attn_core.native.toolchain import find_toolchain

    toolchain, why = find_toolchain(None, archs)
    if toolchain is None:
        print(why)
        return 1
    for name, defines in variants.items():
        path, seconds = build_variant(
            toolchain, out / name, FAMILIES[family], variant, defines=defines
        )
        print(f"{name}: {path} ({seconds:.0f} s)", flush=True)
    return 0


def build(out: Path, archs: tuple[str, ...]) -> int:
    tuning = {name: (*defines, "ATTN_TUNING_ONLY") for name, defines in VARIANTS.items()}
    return build_variants(out, archs, "decode", f"g{TUNING_GROUP}", tuning)


def splits(
    batch: int, tokens: int, sm_count: int, blocks_per_sm: int, grain: int = 128
) -> list[tuple[int, int]]:
    """Partition splits giving 1/2, 1, 2 and 4 waves of resident blocks, in ``grain``-token
    partitions (128: the CUDA-core body's tile; 16: the matrix-unit body's)."""
    rows = batch * 4
    out = []
    for waves in (0.5, 1, 2, 4):
        want = max(1, round(waves * blocks_per_sm * sm_count / rows))
        per = -(-tokens // want)
        ps = max(grain, -(-per // grain) * grain)
        split = (-(-tokens // ps), ps)
        if split not in out:
            out.append(split)
    return out


def run(variants: Path, shapes_arg: str) -> int:
    import torch
    from _timing import graph_ms
    from native_decode_bench import PagedKV, copy_bandwidth, native_step
    from tabulate import tabulate

    from attn_core.native import abi
    from attn_core.native.decode import DecodeLibrary
    from attn_core.native.family import DECODE

    shapes = SHAPES
    if shapes_arg:
        shapes = tuple(tuple(int(p) for p in s.split("x")) for s in shapes_arg.split(","))
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    bw = copy_bandwidth(torch.device("cuda"))
    cases = {}
    for b, t in shapes:
        one = PagedKV(b, t, torch.float16, "auto", 0)
        copies = max(1, min(16, -(-int(4 * 50e6) // one.kv_bytes)))
        cases[(b, t)] = [one] + [PagedKV(b, t, torch.float16, "auto", i) for i in range(1, copies)]
    fp8 = {k: PagedKV(1, 100 * K, torch.float16, k, 0) for k in ("fp8_e4m3", "fp8_e5m2")}
    rows = []
    for name in VARIANTS:
        lib = DecodeLibrary(variants / name / DECODE.library_name(f"g{TUNING_GROUP}"))
        facts = lib.kernel_info("partition", abi.FLOAT16, abi.FLOAT16, 256, TUNING_GROUP)
        row = {"variant": name, "regs": facts.num_regs, "blocks/SM": facts.blocks_per_sm,
               "spill": facts.local_bytes}  # fmt: skip
        grain = 16 if name.startswith("mma") else 128
        for (b, t), cs in cases.items():
            best = min(
                (graph_ms([native_step(lib, c, p, ps) for c in cs])[0], p, ps)
                for p, ps in splits(b, t, sm, facts.blocks_per_sm, grain)
            )
            row[f"{b}x{t // K}K"] = f"{best[0]:.4f} ({best[1]})"
            row[f"{b}x{t // K}K floor x"] = round(best[0] / (cs[0].kv_bytes / bw * 1e3), 2)
        for kind, c in fp8.items():
            best = min(
                graph_ms([native_step(lib, c, p, ps)])[0]
                for p, ps in splits(1, 100 * K, sm, facts.blocks_per_sm, grain)
            )
            row[kind] = round(best, 4)
        rows.append(row)
        print(tabulate([row], headers="keys", tablefmt="github"), flush=True)
    print(f"\ncopy bandwidth {bw / 1e12:.2f} TB/s; best ms (partitions) per shape")
    print(tabulate(rows, headers="keys", tablefmt="github"))
    return 0


def variant_commands(
    doc: str, folder: str
) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """A tuner's two commands, ``build`` (``--out``, ``--arch``) and ``run`` (``--variants``),
    both defaulting to ``folder``: the parser and ``run``'s subparser, for its own options."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--out", type=Path, default=Path(folder))
    b.add_argument("--arch", type=native_archs, default="sm_90", help="e.g. sm_90 or sm_80,sm_90")
    r = sub.add_parser("run")
    r.add_argument("--variants", type=Path, default=Path(folder))
    return ap, r


def main(argv: Optional[list[str]] = None) -> int:
    ap, r = variant_commands(__doc__, ".native-variants")
    r.add_argument("--shapes", default="")
    args = ap.parse_args(argv)
    if args.cmd == "build":
        return build(args.out, args.arch)
    return run(args.variants, args.shapes)


if __name__ == "__main__":
    sys.exit(main())
