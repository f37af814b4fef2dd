"""Where one native decode step's time goes, block by block: an instrumented build of the
group-6 decode library whose kernels write ``%globaltimer`` at fixed points, one CUDA-graph
replay per shape, the stamps read back.

    python3 bench/decode_timeline.py [--shapes 6/1/1x102400,...] [--out DIR] [--lib LIB]
    python3 bench/decode_timeline.py --patch-only DIR     # write the instrumented sources, stop

The kernel sources are not changed: a copy of ``csrc/paged_decode.cu`` and ``decode_warp.cuh``
gets the stamps inserted at named anchors (``PATCHES``; a missing anchor stops the script with
its name, and ``tests/test_decode_timeline.py`` checks on the CPU that every anchor is still
there) and is built with ``-DATTN_TUNING_ONLY`` (fp16 queries, head bucket 256) for Qwen's group
6, or ``--lib`` names a library built so before. The matrix-unit body's warps stamp when the
block starts, when its queries are staged, when their tiles are done, after the warps' fold and
after the partial stores; each merge block before and after it waits on the partition grid, and
at its end. Prints, per shape, microseconds from the first partition block's start: medians over
the blocks, and the spread of the blocks' ends (docs/benchmarks.md#decode-kernel-choices). Needs a
CUDA device (and nvcc unless ``--lib``); measures, asserts nothing.
"""

from __future__ import annotations

import argparse
import ctypes
import shutil
import sys
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import capture_graph, device_info, print_table, write_results  # noqa: E402

CSRC = Path(__file__).resolve().parents[1] / "packages/attn-core/src/attn_core/native/csrc"
DEFAULT_SHAPES = "6/1/1x102400,12/2/1x102400,24/4/1x102400,24/4/1x8192,6/1/1x8192"
SLOTS, WARPS = 5, 8  # partition stamps a warp; warps a block at most (head 256)
MAX_PARTITION_BLOCKS, MAX_MERGE_BLOCKS = 2048, 8192

STAMP_DEFINITIONS = r"""
// ---- bench/decode_timeline.py: %globaltimer stamps (not in the library attn-core loads) ----
__device__ unsigned long long attn_partition_stamps[@PB@ * @SLOTS@ * @WARPS@];
__device__ unsigned long long attn_merge_stamps[@MB@ * 3];
__device__ __forceinline__ unsigned long long attn_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ int attn_block_index() {
  return (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
}
#define ATTN_PARTITION_STAMP(slot)                                                            \
  do {                                                                                        \
    if (threadIdx.x % 32 == 0 && attn_block_index() < @PB@)                                \
      attn_partition_stamps[(attn_block_index() * @SLOTS@ + (slot)) * @WARPS@ +           \
                            threadIdx.x / 32] = attn_now();                                   \
  } while (0)
#define ATTN_MERGE_STAMP(slot)                                                                \
  do {                                                                                        \
    if (threadIdx.x == 0 && attn_block_index() < @MB@)                                      \
      attn_merge_stamps[attn_block_index() * 3 + (slot)] = attn_now();                        \
  } while (0)
extern "C" int attn_timeline_stamps(unsigned long long* host, int merge, int count) {
  return merge ? cudaMemcpyFromSymbol(host, attn_merge_stamps, count * 8)
               : cudaMemcpyFromSymbol(host, attn_partition_stamps, count * 8);
}
"""
_SIZES = {
    "@PB@": MAX_PARTITION_BLOCKS,
    "@MB@": MAX_MERGE_BLOCKS,
    "@SLOTS@": SLOTS,
    "@WARPS@": WARPS,
}
for _name, _value in _SIZES.items():
    STAMP_DEFINITIONS = STAMP_DEFINITIONS.replace(_name, str(_value))

# (file, anchor, text, "before" | "after"): each anchor must occur exactly once
PATCHES = (
    ("paged_decode.cu", '#include "attn_platform.cuh"\n', STAMP_DEFINITIONS, "after"),
    ("paged_decode.cu", "  wait_for_partitions();", "  ATTN_MERGE_STAMP(0);\n", "before"),
    ("paged_decode.cu", "  wait_for_partitions();  // before any read: the partials are the "
     "partition kernel's\n", "  ATTN_MERGE_STAMP(1);\n", "after"),
    ("paged_decode.cu", "                      n > 0 ? total / weights : 0.0f);\n  }\n",
     "  ATTN_MERGE_STAMP(2);\n", "after"),
    ("decode_warp.cuh", "  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;\n"
     "  const int g = lane / 4, t = lane % 4;\n", "  ATTN_PARTITION_STAMP(0);\n", "before"),
    ("decode_warp.cuh", "  __syncthreads();  // the queries, the only data the warps share "
     "before the merge\n", "  ATTN_PARTITION_STAMP(1);\n", "after"),
    ("decode_warp.cuh", "  // Each warp's state (sums over its lanes' tokens first), then the "
     "merge of the warps.\n", "  ATTN_PARTITION_STAMP(2);\n", "before"),
    ("decode_warp.cuh", "  if (merge_warp) store_state(warp);\n  __syncthreads();\n",
     "  ATTN_PARTITION_STAMP(3);\n", "after"),
    ("decode_warp.cuh", "        a.part_lse[row + part] = m + log2f(den);\n      }\n    }\n  }\n",
     "  ATTN_PARTITION_STAMP(4);\n", "after"),
)  # fmt: skip


class AnchorMissing(RuntimeError):
    pass


def instrument(dest: Path) -> Path:
    """Copy ``csrc``'s decode sources into ``dest`` with the stamps inserted; the entry file.

    Raises:
        AnchorMissing: an anchor of ``PATCHES`` is not in its file exactly once (the kernel
            changed under it: update the anchor).
    """
    dest.mkdir(parents=True, exist_ok=True)
    texts = {name: (CSRC / name).read_text() for name in {p[0] for p in PATCHES}}
    for name, anchor, text, where in PATCHES:
        found = texts[name].count(anchor)
        if found != 1:
            raise AnchorMissing(f"{name}: anchor {anchor.strip()[:70]!r} found {found} times")
        texts[name] = texts[name].replace(
            anchor, text + anchor if where == "before" else anchor + text
        )
    for name, text in texts.items():
        (dest / name).write_text(text)
    return dest / "paged_decode.cu"


def build(dest: Path) -> Path:
    """The instrumented group-6 tuning library, built from ``instrument(dest)``."""
    import torch

    from attn_core.native.build import compile_library
    from attn_core.native.toolchain import find_toolchain

    toolchain, why = find_toolchain(archs=(_arch(torch.cuda.get_device_capability()),))
    if toolchain is None:
        raise SystemExit(f"decode_timeline: {why}; pass --lib")
    entry = instrument(dest / "src")
    target = dest / "libattn_native_g6.so"
    if target.exists():
        target.unlink()
    defines = ("ATTN_TUNING_ONLY", "ATTN_GROUP_SLOTS=6")
    return compile_library(toolchain, entry, target, defines, "instrumented build failed")[0]


def _arch(capability: tuple[int, int]) -> str:
    return f"sm_{capability[0]}{capability[1]}"


def _us(ns: float) -> float:
    return round(ns / 1e3, 2)


def timeline(lib_path: Path, spec: tuple) -> dict[str, Any]:
    """Stamps of the last of a few back-to-back replays of one step of ``spec``."""
    import numpy as np
    import torch
    from native_decode_bench import HEAD, PagedKV, _rule_split, native_step

    from attn_core.native.decode import DecodeLibrary
    from attn_core.native.split import merge_grid

    heads, kv_heads, batch, tokens, cache = spec
    lib = DecodeLibrary(lib_path)
    raw = ctypes.CDLL(str(lib_path.resolve()))
    raw.attn_timeline_stamps.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    case = PagedKV(batch, tokens, torch.float16, cache, 0, heads, kv_heads)
    parts, size = _rule_split(case)
    step = native_step(lib, case, parts, size)
    graph = capture_graph(step)
    for _ in range(4):
        graph.replay()
    torch.cuda.synchronize()
    blocks = kv_heads * parts * batch  # group 6: one head group a KV head
    merges = int(np.prod(merge_grid(batch, heads, HEAD, parts))) if parts > 1 else 0
    if blocks > MAX_PARTITION_BLOCKS or merges > MAX_MERGE_BLOCKS:
        raise SystemExit(f"decode_timeline: {spec} has more blocks than the stamp buffers hold")
    part = np.zeros(MAX_PARTITION_BLOCKS * SLOTS * WARPS, dtype=np.uint64)
    merge = np.zeros(MAX_MERGE_BLOCKS * 3, dtype=np.uint64)
    for buf, which in ((part, 0), (merge, 1)):
        err = raw.attn_timeline_stamps(buf.ctypes.data, which, buf.size)
        if err != 0:
            raise SystemExit(f"decode_timeline: reading the stamps failed (cudaError {err})")
    p = part[: blocks * SLOTS * WARPS].reshape(blocks, SLOTS, WARPS).astype(np.int64)
    t0 = p[:, 0, :].min()
    start = p[:, 0, :].min(axis=1) - t0
    ready = p[:, 1, :].max(axis=1) - t0
    tiles_done = p[:, 2, :].max(axis=1) - t0
    folded = p[:, 3, :].max(axis=1) - t0
    end = p[:, 4, :].max(axis=1) - t0
    row: dict[str, Any] = {
        "heads": f"{heads}/{kv_heads}", "shape": f"{batch}x{tokens}", "kv_cache": cache,
        "blocks": blocks, "queries_ready": _us(np.median(ready - start)),
        "tiles_done": "/".join(str(_us(f(tiles_done))) for f in (np.min, np.median, np.max)),
        "fold": _us(np.median(folded - tiles_done)), "stores": _us(np.median(end - folded)),
        "block_end": "/".join(str(_us(f(end))) for f in (np.min, np.median, np.max)),
    }  # fmt: skip
    if merges:
        m = merge[: merges * 3].reshape(merges, 3).astype(np.int64) - t0
        row["merge_released"] = _us(m[:, 1].max())
        row["merge_block"] = _us(np.median(m[:, 2] - m[:, 1]))
        row["step_end"] = _us(m[:, 2].max())
    else:
        row["step_end"] = _us(end.max())
    del step, graph, case
    torch.cuda.empty_cache()
    return row


COLUMNS = ["heads", "shape", "kv_cache", "blocks", "queries_ready", "tiles_done", "fold",
           "stores", "block_end", "merge_released", "merge_block", "step_end"]  # fmt: skip


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="as native_decode_bench.py")
    ap.add_argument("--out", default="results")
    ap.add_argument("--lib", type=Path, help="an instrumented libattn_native_g6.so built before")
    ap.add_argument("--patch-only", type=Path, metavar="DIR", help="write the sources, stop")
    args = ap.parse_args(argv)
    try:
        if args.patch_only is not None:
            print(instrument(args.patch_only))
            return 0
    except (AnchorMissing, OSError) as exc:
        print(f"decode_timeline: {exc}", file=sys.stderr)
        return 2
    from native_decode_bench import parse_shapes

    try:
        specs = parse_shapes(args.shapes)
    except argparse.ArgumentTypeError as exc:
        ap.error(str(exc))
    if args.lib is not None and not args.lib.is_file():
        ap.error(f"--lib: no such file {args.lib}")
    import torch

    if not torch.cuda.is_available():
        print("decode_timeline: needs a CUDA device; nothing measured")
        return 0
    lib = args.lib
    if lib is None:
        work = Path(args.out) / "timeline_build"
        shutil.rmtree(work, ignore_errors=True)
        lib = build(work)
    rows = []
    for spec in specs:
        rows.append(timeline(lib, spec))
        print_table([rows[-1]], COLUMNS)
        payload = {"device": device_info(torch.device("cuda")), "library": str(lib), "rows": rows}
        write_results(args.out, "decode_timeline.json", payload)
    print("\n== us from the first partition block's start (medians over blocks; min/median/max)")
    print_table(rows, COLUMNS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
