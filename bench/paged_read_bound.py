"""How fast can a kernel only *read* the K and V pages of a paged decode step on this GPU?

    python bench/paged_read_bound.py [--out DIR] [--tokens 100000]
    python bench/paged_read_bound.py --shapes [24/4/1x102400,6/1/8x102400,...] [--lib LIB]

The target for native decode at 1 x 100K is <= 0.115 ms on the H200 (the floor: K + V bytes
over the copy rate, 0.101 ms). The kernel once measured 0.150 ms, and with its products removed
its copy pipeline alone took 0.156 (docs/history/benchmarks-log.md). This bench separates the memory
system from the kernel: each variant below streams exactly the bytes of that step (Qwen3.6
shape: 4 KV heads, head 256, fp16, 16-token pages, vLLM 0.6.3 layout, a permuted block table)
and does nothing with them but fold them into one word per thread, so its time is the bound of
its way of moving bytes:

- ``ldg``: plain 16-byte loads into registers, ``PAGES`` pages (16 KiB of K + V each) per
  thread group in flight;
- ``cp.async``: 16-byte asynchronous copies into a shared-memory ring of ``STAGES`` tiles of
  ``PAGES`` pages, one barrier per tile (the decode kernel's scheme, without its products);
- ``bulk`` (sm_90+): one thread moves each page's K and V with two 8 KiB bulk copies
  (``cp.async.bulk``, the copy engine), completion counted by an mbarrier per stage;

each over the plan-like split (4 heads x P partitions, P chosen for 1-8 waves of the resident
blocks), with the permuted table and with an identity one (pages in address order), beside a
read-only torch reduction of the same bytes. Prints a table (ms, TB/s of K + V read), writes
``paged_read_bound.json``.

``--shapes`` asks the same of whole decode steps at other head counts and batches (the
tensor-parallel slices: 12 / 2 and 6 / 1 heads): per shape, the read kernels at the decode
plan's own split and at every candidate split of native_decode_bench.py, the best of them
followed by an empty launch (what a second kernel in the step costs), and, with ``--lib`` (a
``libattn_native_g6.so``), native decode at the plan's split, all over the same caches with
several steps per CUDA graph where one step would fit the L2; writes
``paged_read_bound_shapes.json``. Needs cupy (NVRTC) and a CUDA device; measures, asserts
nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import (  # noqa: E402
    copy_bandwidth,
    device_info,
    event_ms,
    graph_ms,
    print_table,
    write_results,
)

KV_HEADS, HEAD, BLOCK = 4, 256, 16
PAGE_BYTES = HEAD * BLOCK * 2  # one page of one head, K or V: 8 KiB
THREADS = 128

SOURCE = r"""
typedef unsigned long long u64;

struct Args {
  const uint4* k; const uint4* v; const int* table; unsigned* out;
  int n_pages, pages_per_part;
  long long block_stride16, head_stride16;  // in 16-byte units
  int kv_heads, table_stride;  // blockIdx.x = sequence * kv_heads + head
};
#define ARGS const uint4* k, const uint4* v, const int* table, unsigned* out, int n_pages, \
    int pages_per_part, long long bs16, long long hs16, int kv_heads, int table_stride
#define MAKE_ARGS \
  const Args a{k, v, table, out, n_pages, pages_per_part, bs16, hs16, kv_heads, table_stride}

// pointers to page p (of this block's sequence) of this block's head (512 x 16 bytes each)
__device__ __forceinline__ void page_ptrs(const Args& a, int p, const uint4*& kb,
                                          const uint4*& vb) {
  const int seq = blockIdx.x / a.kv_heads, head = blockIdx.x % a.kv_heads;
  const long long pg = a.table[seq * a.table_stride + p];
  const long long off = pg * a.block_stride16 + head * a.head_stride16;
  kb = a.k + off;
  vb = a.v + off;
}

// a kernel that does nothing: what a second launch in the step (the merge's) costs by itself
extern "C" __global__ void empty_kernel() {}

extern "C" __global__ void __launch_bounds__(128) read_ldg(ARGS) {
  MAKE_ARGS;
  const int p0 = blockIdx.y * a.pages_per_part;
  const int p1 = min(p0 + a.pages_per_part, a.n_pages);
  const int tid = threadIdx.x;
  unsigned acc = 0;
  for (int p = p0; p < p1; p += PAGES) {
    uint4 r[PAGES][8];
#pragma unroll
    for (int u = 0; u < PAGES; ++u) {
      if (p + u < p1) {
        const uint4 *kb, *vb;
        page_ptrs(a, p + u, kb, vb);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          r[u][i] = __ldg(kb + tid + 128 * i);
          r[u][4 + i] = __ldg(vb + tid + 128 * i);
        }
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) r[u][i] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < PAGES; ++u)
#pragma unroll
      for (int i = 0; i < 8; ++i) acc ^= r[u][i].x ^ r[u][i].y ^ r[u][i].z ^ r[u][i].w;
  }
  a.out[(blockIdx.y * gridDim.x + blockIdx.x) * 128 + tid] = acc;
}

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  unsigned r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
  return r;
}

extern "C" __global__ void __launch_bounds__(128) read_cp_async(ARGS) {
  MAKE_ARGS;
  extern __shared__ __align__(128) uint4 ring[];  // [STAGES][PAGES][1024]
  const int p0 = blockIdx.y * a.pages_per_part;
  const int p1 = min(p0 + a.pages_per_part, a.n_pages);
  const int tid = threadIdx.x;
  const int n_tiles = (p1 - p0 + PAGES - 1) / PAGES;
  auto issue = [&](int t, int st) {
#pragma unroll
    for (int u = 0; u < PAGES; ++u) {
      const int p = p0 + t * PAGES + u;
      if (p < p1) {
        const uint4 *kb, *vb;
        page_ptrs(a, p, kb, vb);
        uint4* dst = ring + (st * PAGES + u) * 1024;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const uint4* src = (i < 4 ? kb : vb) + tid + 128 * (i % 4);
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n"
                       ::"r"(smem_addr(dst + tid + 128 * i)), "l"(src));
        }
      }
    }
  };
  unsigned acc = 0;
#pragma unroll
  for (int j = 0; j < STAGES - 1; ++j) {
    if (j < n_tiles) issue(j, j);
    asm volatile("cp.async.commit_group;\n" ::);
  }
  int st = 0;
  for (int t = 0; t < n_tiles; ++t) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2));
    __syncthreads();
    if (t + STAGES - 1 < n_tiles) issue(t + STAGES - 1, st == 0 ? STAGES - 1 : st - 1);
    asm volatile("cp.async.commit_group;\n" ::);
    const uint4 x = ring[st * PAGES * 1024 + (tid * 8 + t) % (PAGES * 1024)];
    acc ^= x.x ^ x.w;
    st = st == STAGES - 1 ? 0 : st + 1;
  }
  a.out[(blockIdx.y * gridDim.x + blockIdx.x) * 128 + tid] = acc;
}

#if __CUDA_ARCH__ >= 900
// one 8 KiB run from global to shared memory by the copy engine, counted on mbarrier `bar`
__device__ __forceinline__ void bulk_copy(unsigned dst, const void* src, unsigned bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], 8192, [%2];"
      ::"r"(dst), "l"(src), "r"(bar) : "memory");
}

extern "C" __global__ void __launch_bounds__(128) read_bulk(ARGS) {
  MAKE_ARGS;
  extern __shared__ __align__(128) uint4 ring[];  // [STAGES][PAGES][1024]
  __shared__ __align__(8) u64 full[STAGES];
  const int p0 = blockIdx.y * a.pages_per_part;
  const int p1 = min(p0 + a.pages_per_part, a.n_pages);
  const int tid = threadIdx.x;
  const int n_tiles = (p1 - p0 + PAGES - 1) / PAGES;
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_addr(&full[s])));
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::);
  }
  __syncthreads();
  auto issue = [&](int t, int st) {  // thread 0 only
    const int n = min(PAGES, p1 - (p0 + t * PAGES));
    const unsigned bar = smem_addr(&full[st]);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                 ::"r"(bar), "r"(n * 2 * 8192));
    for (int u = 0; u < n; ++u) {
      const uint4 *kb, *vb;
      page_ptrs(a, p0 + t * PAGES + u, kb, vb);
      uint4* dst = ring + (st * PAGES + u) * 1024;
      bulk_copy(smem_addr(dst), kb, bar);
      bulk_copy(smem_addr(dst + 512), vb, bar);
    }
  };
  if (tid == 0)
    for (int j = 0; j < STAGES - 1 && j < n_tiles; ++j) issue(j, j);
  unsigned acc = 0;
  int st = 0, phase = 0;
  for (int t = 0; t < n_tiles; ++t) {
    // every thread waits for tile t's bytes
    const unsigned bar = smem_addr(&full[st]);
    unsigned done = 0;
    while (!done) {
      asm volatile("{\n .reg .pred p;\n"
                   " mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                   " selp.u32 %0, 1, 0, p;\n}\n"
                   : "=r"(done) : "r"(bar), "r"(phase) : "memory");
    }
    __syncthreads();  // every thread is past tile t - 1: its stage is free
    if (tid == 0 && t + STAGES - 1 < n_tiles) issue(t + STAGES - 1, st == 0 ? STAGES - 1 : st - 1);
    const uint4 x = ring[st * PAGES * 1024 + (tid * 8 + t) % (PAGES * 1024)];
    acc ^= x.x ^ x.w;
    if (++st == STAGES) { st = 0; phase ^= 1; }
  }
  a.out[(blockIdx.y * gridDim.x + blockIdx.x) * 128 + tid] = acc;
}
#endif
"""


def _module(cupy: Any, kind: str, stages: int, pages: int) -> Any:
    defines = (f"-DPAGES={pages}", f"-DSTAGES={max(stages, 2)}")
    cc = torch.cuda.get_device_capability()
    arch = f"-arch=sm_{cc[0]}{cc[1]}"
    return cupy.RawModule(code=SOURCE, options=("-std=c++17", arch, *defines)).get_function(kind)


def _case(tokens: int, identity: bool):
    n_pages = -(-tokens // BLOCK)
    dev = torch.device("cuda")
    # vLLM 0.6.3: K [blocks, heads, head/8, block, 8], V [blocks, heads, head, block]; per
    # (block, head) each is one contiguous 8 KiB run
    key = torch.randn(n_pages, KV_HEADS, HEAD // 8, BLOCK, 8, dtype=torch.float16, device=dev)
    value = torch.randn(n_pages, KV_HEADS, HEAD, BLOCK, dtype=torch.float16, device=dev)
    table = (
        torch.arange(n_pages, device=dev) if identity else torch.randperm(n_pages, device=dev)
    ).to(torch.int32)
    return key, value, table, n_pages


def _run(cupy: Any, fn: Any, case: Any, parts: int, smem: int, reps: int = 30) -> float:
    key, value, table, n_pages = case
    pages_per_part = -(-n_pages // parts)
    parts = -(-n_pages // pages_per_part)
    out = torch.empty(parts * KV_HEADS * THREADS, dtype=torch.int32, device="cuda")
    import numpy as np

    args = (cupy.asarray(key), cupy.asarray(value), cupy.asarray(table), cupy.asarray(out),
            np.int32(n_pages), np.int32(pages_per_part), np.int64(key.stride(0) * 2 // 16),
            np.int64(key.stride(1) * 2 // 16), np.int32(KV_HEADS), np.int32(n_pages))  # fmt: skip
    if smem:  # the bulk kernel's mbarriers are static: opt in whatever the size
        fn.max_dynamic_shared_size_bytes = smem
    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)

    def launch() -> None:
        fn((KV_HEADS, parts), (THREADS,), args, shared_mem=smem, stream=stream)

    for _ in range(3):
        launch()
    torch.cuda.synchronize()
    return min(event_ms(launch, calls=reps) for _ in range(5))


# --shapes: the read-only bound of a whole decode step, beside native decode on the same inputs


def _read_step(cupy: Any, fn: Any, c: Any, pages_per_part: int, smem: int) -> Any:
    """One launch of read kernel ``fn`` over ``c``'s (a ``PagedKV``) pages, ``pages_per_part``
    pages a block: grid ``(batch * kv_heads, partitions)``, as the decode kernel's."""
    import numpy as np

    n_pages = c.block_tables.shape[1]
    parts = -(-n_pages // pages_per_part)
    rows = c.batch * c.kv_heads
    out = torch.empty(rows * parts * THREADS, dtype=torch.int32, device="cuda")
    key, value = c.key_cache, c.value_cache
    args = (cupy.asarray(key), cupy.asarray(value), cupy.asarray(c.block_tables),
            cupy.asarray(out), np.int32(n_pages), np.int32(pages_per_part),
            np.int64(key.stride(0) * 2 // 16), np.int64(key.stride(1) * 2 // 16),
            np.int32(c.kv_heads), np.int32(c.block_tables.stride(0)))  # fmt: skip
    if smem:
        fn.max_dynamic_shared_size_bytes = smem

    def step() -> torch.Tensor:
        # the stream is looked up per call: under capture it is the graph's
        stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
        fn((rows, parts), (THREADS,), args, shared_mem=smem, stream=stream)
        return out

    return step


def _empty_step(cupy: Any, fn: Any) -> Any:
    def step() -> None:
        stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
        fn((1,), (32,), (), stream=stream)

    return step


def shape_row(cupy: Any, kernels: dict[str, tuple[Any, int]], empty: Any, spec: tuple,
              lib: Any, copy_bw: float, sms: int) -> dict[str, Any]:  # fmt: skip
    """One decode shape: the read-only kernels at the plan's split and at every candidate split,
    the best of them followed by an empty launch (a second kernel's cost in the step), and
    native decode (``lib``) at the plan's split, all over the same caches; several steps over
    distinct caches per graph where one step's K + V would fit the L2, as
    native_decode_bench.py does."""
    import math

    from native_decode_bench import _rule_split, native_step, partition_candidates, step_caches

    heads, kv_heads, batch, tokens, cache = spec
    cases = step_caches(spec)
    one, copies = cases[0], len(cases)
    parts, ps = _rule_split(one)
    floor = one.kv_bytes / copy_bw * 1e3
    row: dict[str, Any] = {"heads": f"{heads}/{kv_heads}", "shape": f"{batch}x{tokens}",
                           "steps/graph": copies, "floor_ms": floor,
                           "plan split": f"{parts} x {ps}"}  # fmt: skip
    at_plan: dict[str, float] = {}
    best = (math.inf, "", "")
    for name, (fn, smem) in kernels.items():
        for p, size in [(parts, ps)] + partition_candidates(one, sms):
            ms = graph_ms([_read_step(cupy, fn, c, size // BLOCK, smem) for c in cases])[0]
            if (p, size) == (parts, ps):
                at_plan[name] = ms
            if ms < best[0]:
                best = (ms, name, f"{p} x {size}")
    plan_name = min(at_plan, key=at_plan.__getitem__)
    row["read, plan split"] = at_plan[plan_name]
    row["read kernel"] = plan_name
    row["read, best"], row["best read"] = best[0], f"{best[1]}, {best[2]}"
    fn, smem = kernels[plan_name]
    steps = []
    for c in cases:
        steps += [_read_step(cupy, fn, c, ps // BLOCK, smem), _empty_step(cupy, empty)]
    row["read + empty launch"] = 2 * graph_ms(steps)[0]  # graph_ms is per call: two a step
    row["read x floor"] = row["read, plan split"] / floor
    if lib is not None:
        row["native"] = graph_ms([native_step(lib, c, parts, ps) for c in cases])[0]
        row["native x floor"] = row["native"] / floor
        row["native x read"] = row["native"] / row["read, plan split"]
        row["native - read us"] = (row["native"] - row["read, plan split"]) * 1e3
    del cases, one
    torch.cuda.empty_cache()
    return row


# the variants that came within 5 % of the best at 4 KV heads (docs/history/benchmarks-log.md)
SHAPE_KERNELS = (
    ("ldg pages 2", "read_ldg", 1, 2),
    ("cp.async stages 3 pages 1", "read_cp_async", 3, 1),
    ("bulk stages 3 pages 1", "read_bulk", 3, 1),
)
SHAPE_DEFAULT = "24/4/1x102400,12/2/1x102400,6/1/1x102400,24/4/8x102400,12/2/8x102400,6/1/8x102400"


def shapes_main(cupy: Any, specs: tuple, lib_path: Optional[str], out_dir: str) -> int:
    lib = None
    if lib_path:
        from attn_core.native.decode import DecodeLibrary

        lib = DecodeLibrary(Path(lib_path))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    kernels = {}
    for label, kernel, stages, pages in SHAPE_KERNELS:
        if kernel == "read_bulk" and torch.cuda.get_device_capability()[0] < 9:
            continue
        smem = 0 if kernel == "read_ldg" else stages * pages * 16384
        kernels[label] = (_module(cupy, kernel, stages, pages), smem)
    empty = _module(cupy, "empty_kernel", 2, 1)
    bw = copy_bandwidth(torch.device("cuda"))
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s (read + write)", flush=True)
    columns = ["heads", "shape", "floor_ms", "plan split", "read, plan split", "read x floor",
               "read + empty launch", "read, best", "best read"]  # fmt: skip
    if lib is not None:
        columns += ["native", "native x floor", "native x read", "native - read us"]
    rows = []
    for spec in specs:
        rows.append(shape_row(cupy, kernels, empty, spec, lib, bw, sms))
        print_table([rows[-1]], columns)
        write_results(out_dir, "paged_read_bound_shapes.json", {
            "device": device_info(torch.device("cuda")), "copy_rate_bytes_per_s": bw,
            "lib": lib_path, "rows": rows})  # fmt: skip
    print("\n== read-only bound per decode step (ms, CUDA-graph replays back to back)")
    print_table(rows, columns)
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/paged_read_bound.py", description=__doc__)
    parser.add_argument("--out", default="results")
    parser.add_argument("--tokens", type=int, default=100_000)
    parser.add_argument("--shapes", nargs="?", const=SHAPE_DEFAULT, default=None,
                        help="decode shapes as native_decode_bench.py's --shapes (default: the "
                        "issue's 100K rows at 24/4, 12/2 and 6/1 heads)")  # fmt: skip
    parser.add_argument("--lib", default=None, help="a libattn_native_g6.so to time beside")
    args = parser.parse_args(argv)
    specs = None
    if args.shapes is not None:
        from native_decode_bench import parse_shapes

        try:
            specs = parse_shapes(args.shapes)
        except argparse.ArgumentTypeError as exc:
            parser.error(f"--shapes: {exc}")
    if args.lib is not None and (specs is None or not Path(args.lib).is_file()):
        parser.error(f"--lib: needs --shapes and an existing library file, got {args.lib!r}")
    if not torch.cuda.is_available():
        print("paged_read_bound: needs a CUDA device; nothing measured")
        return 0
    import cupy

    if specs is not None:
        return shapes_main(cupy, specs, args.lib, args.out)

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    copy_rate = copy_bandwidth(torch.device("cuda"))
    cases = {False: _case(args.tokens, False), True: _case(args.tokens, True)}
    nbytes = cases[False][0].numel() * 2 * 2
    floor_ms = nbytes / copy_rate * 1e3
    rows: list[dict[str, Any]] = []

    def add(name: str, table: str, parts: int, blocks: Any, ms: float) -> None:
        rows.append({"variant": name, "table": table, "partitions": parts,
                     "resident blocks/SM": blocks, "ms": ms, "TB/s": nbytes / ms / 1e9,
                     "x floor": ms / floor_ms})  # fmt: skip
        print(f"{name:24s} {table:9s} P={parts:4d} ms={ms:.4f}", flush=True)

    key = cases[False][0]
    flat = key.view(-1)

    def sum_key_and_value() -> None:
        flat.sum(dtype=torch.float32)
        cases[False][1].view(-1).sum(dtype=torch.float32)

    for _ in range(3):
        flat.sum(dtype=torch.float32)
    torch.cuda.synchronize()
    add("torch sum (contiguous)", "-", 0, "-", event_ms(sum_key_and_value, calls=20))

    variants = [("ldg", "read_ldg", 1, p) for p in (1, 2, 4)]
    variants += [
        ("cp.async", "read_cp_async", s, p) for s, p in ((2, 1), (3, 1), (4, 1), (3, 2), (6, 1))
    ]
    if torch.cuda.get_device_capability()[0] >= 9:
        variants += [
            ("bulk", "read_bulk", s, p) for s, p in ((2, 1), (3, 1), (4, 1), (6, 1), (3, 2), (4, 2))
        ]
    for label, kernel, stages, pages in variants:
        try:
            fn = _module(cupy, kernel, stages, pages)
        except Exception as exc:  # noqa: BLE001 - a variant that does not compile is reported
            print(f"{label} s{stages} p{pages}: {str(exc)[:300]}")
            continue
        smem = 0 if kernel == "read_ldg" else stages * pages * 16384
        resident = min(8, (227 * 1024) // (smem + 1024)) if smem else 8
        name = f"{label} stages {stages} pages {pages}" if smem else f"{label} pages {pages}"
        for waves in (1, 2, 4):
            parts = max(1, round(sms * resident * waves / KV_HEADS))
            for identity in (False, True):
                ms = _run(cupy, fn, cases[identity], parts, smem)
                add(name, "identity" if identity else "permuted", parts, resident, ms)
    columns = ["variant", "table", "partitions", "resident blocks/SM", "ms", "TB/s", "x floor"]
    path = write_results(args.out, "paged_read_bound.json", {
        "device": device_info(torch.device("cuda")), "tokens": args.tokens, "bytes": nbytes,
        "copy_rate_bytes_per_s": copy_rate, "floor_ms": floor_ms, "rows": rows})  # fmt: skip
    print(
        f"K+V {nbytes / 1e6:.1f} MB, copy rate {copy_rate / 1e12:.2f} TB/s, floor {floor_ms:.4f} ms"
    )
    print_table(sorted(rows, key=lambda r: r["ms"])[:20], columns)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
