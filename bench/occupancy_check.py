"""Compare attn_sim's occupancy with the CUDA driver's on this GPU (run on the H200).

For kernels compiled through CuPy (NVRTC) with different register pressure (unrolled fp32
accumulators, capped by ``--maxrregcount``) and static shared memory, over block sizes and
dynamic shared-memory sizes, ask the driver ``cuOccupancyMaxActiveBlocksPerMultiprocessor`` and
compare with :func:`attn_sim.occupancy.blocks_per_sm` on the matching profile, fed the kernel's
*actual* register count and static shared memory (``kernel.attributes``). Dynamic sizes above
48 KiB opt in (``max_dynamic_shared_size_bytes``) and are checked against a profile whose
per-block budget is the device's opt-in maximum. Also compares the profile's constants with the
device's properties.

Usage: python3 bench/occupancy_check.py [--profile h200] [--out results/]
Prints a table (mismatches last) and writes ``OUT/occupancy_check.json``; exits 1 on any
mismatch. Needs cupy and a CUDA device; nothing is launched, kernels are only loaded.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from collections.abc import Callable

ACCUMULATORS = (4, 24, 48, 96, 160)  # unrolled fp32 values live across a loop -> register use
MAX_REGS = (None, 32, 64, 128)  # --maxrregcount caps
STATIC_FLOATS = (0, 1024, 5000, 11264)  # 0 B, 4 KiB, ~20 KB, 44 KiB static shared memory
THREADS = (32, 64, 96, 128, 256, 384, 512, 768, 1024)
DYNAMIC = (0, 1000, 8192, 20000, 40000, 100_000, 200_000)  # bytes; > 48 KiB opt in

KERNEL = r"""
extern "C" __global__ void probe(float* out, const float* in, int n, int dyn_floats) {
    extern __shared__ float dyn[];
#if STATIC_FLOATS > 0
    __shared__ float stat[STATIC_FLOATS];
#endif
    float acc[NACC];
#pragma unroll
    for (int i = 0; i < NACC; ++i) acc[i] = in[(threadIdx.x + i * 37) % n];
    for (int it = 0; it < n; ++it) {
#pragma unroll
        for (int i = 0; i < NACC; ++i) acc[i] = fmaf(acc[i], acc[(i + 1) % NACC], in[(it + i) % n]);
    }
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < NACC; ++i) s += acc[i];
#if STATIC_FLOATS > 0
    stat[threadIdx.x % STATIC_FLOATS] = s;
    __syncthreads();
    s += stat[(threadIdx.x + 1) % STATIC_FLOATS];
#endif
    if (dyn_floats > 0) {
        dyn[threadIdx.x % dyn_floats] = s;
        __syncthreads();
        s += dyn[(threadIdx.x + 3) % dyn_floats];
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
"""


def kernel_source(accumulators: int, static_floats: int) -> str:
    return f"#define NACC {accumulators}\n#define STATIC_FLOATS {static_floats}\n" + KERNEL


def compare_rows(rows: list[dict], sim: Callable[[int, int, int, bool], tuple]) -> list[dict]:
    """Fill ``sim`` / ``limiter`` / ``match`` of rows that hold the driver's answer."""
    for r in rows:
        blocks, limiter = sim(r["threads"], r["regs"], r["static"] + r["dynamic"], r["opt_in"])
        r.update(sim=blocks, limiter=limiter, match=blocks == r["driver"])
    return rows


def _driver_occupancy(cupy, func_ptr: int, threads: int, dynamic: int) -> int:
    drv = cupy.cuda.driver
    if hasattr(drv, "occupancyMaxActiveBlocksPerMultiprocessor"):
        return int(drv.occupancyMaxActiveBlocksPerMultiprocessor(func_ptr, threads, dynamic))
    import ctypes  # older CuPy: call the driver directly

    lib = ctypes.CDLL("libcuda.so.1")
    out = ctypes.c_int()
    err = lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(
        ctypes.byref(out),
        ctypes.c_void_p(func_ptr),
        ctypes.c_int(threads),
        ctypes.c_size_t(dynamic),
    )
    if err:
        raise RuntimeError(f"cuOccupancyMaxActiveBlocksPerMultiprocessor returned {err}")
    return out.value


def measure(cupy) -> list[dict]:
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    optin = int(props.get("sharedMemPerBlockOptin", 0) or props["sharedMemPerBlock"])
    rows = []
    for nacc, cap, static in itertools.product(ACCUMULATORS, MAX_REGS, STATIC_FLOATS):
        options = (f"--maxrregcount={cap}",) if cap else ()
        kern = cupy.RawKernel(kernel_source(nacc, static), "probe", options=options)
        attrs = kern.attributes
        regs, static_bytes = int(attrs["num_regs"]), int(attrs["shared_size_bytes"])
        for threads, dynamic in itertools.product(THREADS, DYNAMIC):
            if threads > int(attrs["max_threads_per_block"]):
                continue
            opt_in = static_bytes + dynamic > 48 * 1024
            if opt_in:
                if static_bytes + dynamic > optin:
                    continue
                kern.max_dynamic_shared_size_bytes = optin - static_bytes
            driver = _driver_occupancy(cupy, kern.kernel.ptr, threads, dynamic)
            rows.append(
                {
                    "kernel": f"acc{nacc}" + (f"/cap{cap}" if cap else "") + f"/s{static}",
                    "threads": threads,
                    "regs": regs,
                    "static": static_bytes,
                    "dynamic": dynamic,
                    "opt_in": opt_in,
                    "driver": driver,
                }
            )
    return rows


def profile_check(spec, props: dict) -> list[dict]:
    pairs = [
        ("sm_count", "multiProcessorCount"),
        ("warp_size", "warpSize"),
        ("max_threads_per_sm", "maxThreadsPerMultiProcessor"),
        ("max_threads_per_block", "maxThreadsPerBlock"),
        ("registers_per_sm", "regsPerMultiprocessor"),
        ("max_registers_per_block", "regsPerBlock"),
        ("shared_mem_per_sm", "sharedMemPerMultiprocessor"),
        ("shared_mem_per_block", "sharedMemPerBlock"),
        ("shared_mem_reserved_per_block", "reservedSharedMemPerBlock"),
        ("max_blocks_per_sm", "maxBlocksPerMultiProcessor"),
        ("l2_bytes", "l2CacheSize"),
        ("memory_bytes", "totalGlobalMem"),
    ]
    out = []
    for field, key in pairs:
        device = props.get(key)
        out.append(
            {
                "constant": field,
                "profile": getattr(spec, field),
                "device": device,
                "match": device is None or device == getattr(spec, field),
            }
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="h200")
    parser.add_argument("--out", default="results")
    args = parser.parse_args()

    import cupy
    from tabulate import tabulate

    from attn_core.device_spec import get_device_spec
    from attn_sim.occupancy import blocks_per_sm

    spec = get_device_spec(args.profile)
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    props = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in props.items()}
    optin_spec = spec.with_overrides(
        shared_mem_per_block=int(props.get("sharedMemPerBlockOptin") or spec.shared_mem_per_block)
    )

    def sim(threads: int, regs: int, smem: int, opt_in: bool) -> tuple:
        occ = blocks_per_sm(optin_spec if opt_in else spec, threads, regs, smem)
        return occ.blocks_per_sm, occ.limiter

    rows = compare_rows(measure(cupy), sim)
    constants = profile_check(spec, props)
    bad = [r for r in rows if not r["match"]]
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "occupancy_check.json")
    with open(path, "w") as f:
        json.dump(
            {
                "device": props.get("name"),
                "profile": spec.name,
                "rows": rows,
                "constants": constants,
                "matches": len(rows) - len(bad),
                "mismatches": len(bad),
            },
            f,
            indent=1,
            default=str,
        )
    print(tabulate(constants, headers="keys", tablefmt="github"))
    shown = [r for r in rows if r["match"]][:: max(1, len(rows) // 40)] + bad
    print(tabulate(shown, headers="keys", tablefmt="github"))
    print(
        f"{props.get('name')}: {len(rows) - len(bad)}/{len(rows)} occupancy answers match "
        f"attn_sim on profile {spec.name}; full table in {path}"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
