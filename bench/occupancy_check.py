"""Compare attn_sim's occupancy with the CUDA driver's on this GPU (run on the H200).

For kernels compiled through CuPy (NVRTC) with different register pressure (unrolled fp32
accumulators, capped by ``--maxrregcount``) and static shared memory, over block sizes and
dynamic shared-memory sizes, ask the driver ``cuOccupancyMaxActiveBlocksPerMultiprocessor`` and
compare with :func:`attn_sim.occupancy.blocks_per_sm` on the matching profile, fed the kernel's
*actual* register count and static shared memory (``kernel.attributes``). Dynamic sizes above
48 KiB opt in (``max_dynamic_shared_size_bytes``) and are checked against a profile whose
per-block budget is the device's opt-in maximum. Also compares the profile's constants with the
device's properties.

Nothing here is fatal short of CuPy missing: a device property that cannot be read or is not
text (CuPy returns ``uuid`` / ``luid`` as raw bytes: GPU run 1 crashed decoding one, byte 0xe5),
a kernel that does not compile, a driver query that fails: each is recorded under ``errors`` and
the comparison runs on everything else.

Usage: python3 bench/occupancy_check.py [--profile h200] [--out results/]
Prints a table (mismatches last) and writes ``OUT/occupancy_check.json``. Exit 0 when every
answer matches, 1 on any mismatch, 2 when no comparison could be made at all. Needs cupy and a
CUDA device; nothing is launched, kernels are only loaded.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from collections.abc import Callable
from typing import Any, Optional

ACCUMULATORS = (4, 24, 48, 96, 160)  # unrolled fp32 values live across a loop -> register use
MAX_REGS = (None, 32, 64, 128)  # --maxrregcount caps
STATIC_FLOATS = (0, 1024, 5000, 11264)  # 0 B, 4 KiB, ~20 KB, 44 KiB static shared memory
THREADS = (32, 64, 96, 128, 256, 384, 512, 768, 1024)
DYNAMIC = (0, 1000, 8192, 20000, 40000, 100_000, 200_000)  # bytes; > 48 KiB opt in
DEFAULT_SMEM_PER_BLOCK = 48 * 1024  # without opting in (every CUDA GPU since Kepler)

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

# profile field -> CUDA device property (cudaDeviceProp names, as CuPy spells them)
PROFILE_PROPERTIES = (
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
)


def kernel_source(accumulators: int, static_floats: int) -> str:
    return f"#define NACC {accumulators}\n#define STATIC_FLOATS {static_floats}\n" + KERNEL


def _error(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


def property_value(value: Any) -> Any:
    """A device property as JSON-friendly data.

    Text fields (``name``) arrive as NUL-padded bytes; identifiers (``uuid``, ``luid``) are raw
    bytes that are not text at all, so anything that is not clean UTF-8 becomes hex.
    """
    if isinstance(value, (bytes, bytearray)):
        raw = bytes(value)
        body = raw.rstrip(b"\0")  # C strings are NUL-padded; a NUL inside means binary
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            return raw.hex()
        return text if b"\0" not in body and text.isprintable() else raw.hex()
    if isinstance(value, dict):
        return {str(k): property_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [property_value(v) for v in value]
    return value


def read_properties(cupy, errors: list[dict]) -> dict[str, Any]:
    """The current device's properties, cleaned; failures go to ``errors`` (``{}`` at worst)."""
    try:
        device_id = cupy.cuda.Device().id
        raw = cupy.cuda.runtime.getDeviceProperties(device_id)
        items = list(raw.items())
    except Exception as err:  # noqa: BLE001 - reported, the comparison can still run
        errors.append({"where": "getDeviceProperties", "error": _error(err)})
        return {}
    props: dict[str, Any] = {}
    for key, value in items:
        try:
            props[str(key)] = property_value(value)
        except Exception as err:  # noqa: BLE001
            errors.append({"where": f"property {key!r}", "error": _error(err)})
    return props


def int_property(props: dict, key: str, errors: list[dict]) -> Optional[int]:
    """``props[key]`` as an int, or None (missing, or not a number: recorded in ``errors``)."""
    if props.get(key) is None:
        return None
    try:
        return int(props[key])
    except (TypeError, ValueError) as err:
        errors.append({"where": f"property {key!r}", "error": _error(err)})
        return None


def compare_rows(rows: list[dict], sim: Callable[[int, int, int, bool], tuple]) -> list[dict]:
    """Fill ``sim`` / ``limiter`` / ``match`` of rows that hold the driver's answer.

    Rows without one (an ``error`` instead) get ``match=None``: neither agreement nor mismatch.
    """
    for r in rows:
        if r.get("driver") is None:
            r.update(sim=None, limiter=None, match=None)
            continue
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


def measure(cupy, props: Optional[dict] = None, errors: Optional[list] = None) -> list[dict]:
    """One row per (kernel, threads, dynamic bytes): the driver's blocks/SM, or an ``error``.

    ``props``: cleaned device properties (read here when None); ``errors`` collects failures
    that are not tied to one row (a kernel that does not compile).
    """
    errors = [] if errors is None else errors
    props = read_properties(cupy, errors) if props is None else props
    default = int_property(props, "sharedMemPerBlock", errors) or DEFAULT_SMEM_PER_BLOCK
    optin = int_property(props, "sharedMemPerBlockOptin", errors) or default
    rows = []
    for nacc, cap, static in itertools.product(ACCUMULATORS, MAX_REGS, STATIC_FLOATS):
        name = f"acc{nacc}" + (f"/cap{cap}" if cap else "") + f"/s{static}"
        options = (f"--maxrregcount={cap}",) if cap else ()
        try:
            kern = cupy.RawKernel(kernel_source(nacc, static), "probe", options=options)
            attrs = kern.attributes
            regs, static_bytes = int(attrs["num_regs"]), int(attrs["shared_size_bytes"])
            max_threads = int(attrs["max_threads_per_block"])
        except Exception as err:  # noqa: BLE001 - one kernel lost, not the run
            errors.append({"where": f"kernel {name}", "error": _error(err)})
            continue
        for threads, dynamic in itertools.product(THREADS, DYNAMIC):
            if threads > max_threads:
                continue
            opt_in = static_bytes + dynamic > default
            if opt_in and static_bytes + dynamic > optin:
                continue
            row: dict[str, Any] = {
                "kernel": name,
                "threads": threads,
                "regs": regs,
                "static": static_bytes,
                "dynamic": dynamic,
                "opt_in": opt_in,
                "driver": None,
            }
            try:
                if opt_in:
                    kern.max_dynamic_shared_size_bytes = optin - static_bytes
                row["driver"] = _driver_occupancy(cupy, kern.kernel.ptr, threads, dynamic)
            except Exception as err:  # noqa: BLE001 - recorded on the row
                row["error"] = _error(err)
            rows.append(row)
    return rows


def profile_check(spec, props: dict) -> list[dict]:
    """The profile's constants against the device's; a property missing or unreadable is None
    (``match`` None: not compared)."""
    out = []
    for field, key in PROFILE_PROPERTIES:
        device = props.get(key)
        try:
            device = None if device is None else int(device)
        except (TypeError, ValueError):
            out.append(
                {
                    "constant": field,
                    "profile": getattr(spec, field),
                    "device": device,
                    "match": None,
                }
            )
            continue
        out.append(
            {
                "constant": field,
                "profile": getattr(spec, field),
                "device": device,
                "match": None if device is None else device == getattr(spec, field),
            }
        )
    return out


def summarise(rows: list[dict], constants: list[dict], errors: list[dict]) -> dict:
    compared = [r for r in rows if r["match"] is not None]
    bad = [r for r in compared if not r["match"]]
    return {
        "compared": len(compared),
        "matches": len(compared) - len(bad),
        "mismatches": len(bad),
        "row_errors": sum(1 for r in rows if r.get("error")),
        "errors": len(errors),
        "constant_mismatches": [c["constant"] for c in constants if c["match"] is False],
        "exit": 2 if not compared else 1 if bad else 0,
    }


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="h200")
    parser.add_argument("--out", default="results")
    args = parser.parse_args(argv)

    import cupy
    from tabulate import tabulate

    from attn_sim.occupancy import blocks_per_sm
    from attn_sim.profiles import load_profile

    spec = load_profile(args.profile)
    errors: list[dict] = []
    props = read_properties(cupy, errors)
    optin = int_property(props, "sharedMemPerBlockOptin", errors) or spec.shared_mem_per_block
    optin_spec = spec.with_overrides(shared_mem_per_block=optin)

    def sim(threads: int, regs: int, smem: int, opt_in: bool) -> tuple:
        occ = blocks_per_sm(optin_spec if opt_in else spec, threads, regs, smem)
        return occ.blocks_per_sm, occ.limiter

    rows = compare_rows(measure(cupy, props, errors), sim)
    constants = profile_check(spec, props)
    summary = summarise(rows, constants, errors)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "occupancy_check.json")
    payload = {
        "device": props.get("name"),
        "profile": spec.name,
        "summary": summary,
        "errors": errors,
        "constants": constants,
        "rows": rows,
        "properties": props,
    }
    with open(path, "w") as f:
        json.dump(payload, f, indent=1, default=str)
    print(tabulate(constants, headers="keys", tablefmt="github"))
    if errors or summary["row_errors"]:
        failed = errors + [
            {"where": f"{r['kernel']} t{r['threads']} d{r['dynamic']}", "error": r["error"]}
            for r in rows
            if r.get("error")
        ]
        print(f"{len(failed)} reads failed (not fatal; first 10):")
        print(tabulate(failed[:10], headers="keys", tablefmt="github"))
    good = [r for r in rows if r["match"]]
    bad = [r for r in rows if r["match"] is False]
    columns = ("kernel", "threads", "regs", "static", "dynamic", "opt_in", "driver", "sim")
    shown = good[:: max(1, len(good) // 40)] + bad
    print(
        tabulate(
            [{c: r[c] for c in columns + ("limiter", "match")} for r in shown],
            headers="keys",
            tablefmt="github",
        )
    )
    print(
        f"{props.get('name', 'device')}: {summary['matches']}/{summary['compared']} occupancy "
        f"answers match attn_sim on profile {spec.name} ({summary['row_errors']} rows and "
        f"{summary['errors']} other reads failed); full table in {path}"
    )
    return summary["exit"]


if __name__ == "__main__":
    sys.exit(main())
