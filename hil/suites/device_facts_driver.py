"""What the driver reports: torch's device properties, and the CUDA runtime API via ctypes.

torch exposes a version-dependent subset of ``cudaDeviceProp`` (torch 2.1 lacks the warp size,
registers and shared-memory fields); the rest comes from ``cudaDeviceGetAttribute`` in the
runtime library torch itself loaded (CoreX ships a CUDA-compatible ``libcudart``), else one
found on the usual paths, else the driver API's ``cuDeviceGetAttribute`` (same attribute
numbers). Where both torch and the runtime answer, torch's value is recorded and the method
says whether the runtime agrees.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys
from collections.abc import Callable
from typing import Optional

from device_facts_record import absent, measured

# (fact, unit, torch property or None, cudaDeviceAttr number and name or None)
# Attribute numbers: CUDA's driver_types.h (cudaDevAttr*), equal to the driver API's CU_DEVICE_*.
DRIVER_FACTS = (
    ("sm_count", "SMs", "multi_processor_count", (16, "cudaDevAttrMultiProcessorCount")),
    ("warp_size", "threads", "warp_size", (10, "cudaDevAttrWarpSize")),
    ("max_threads_per_block", "threads", "max_threads_per_block",
     (1, "cudaDevAttrMaxThreadsPerBlock")),
    ("max_threads_per_sm", "threads", "max_threads_per_multi_processor",
     (39, "cudaDevAttrMaxThreadsPerMultiProcessor")),
    ("max_blocks_per_sm", "blocks", None, (106, "cudaDevAttrMaxBlocksPerMultiprocessor")),
    ("registers_per_sm", "registers", "regs_per_multiprocessor",
     (82, "cudaDevAttrMaxRegistersPerMultiprocessor")),
    ("max_registers_per_block", "registers", None, (12, "cudaDevAttrMaxRegistersPerBlock")),
    ("shared_mem_per_block", "bytes", "shared_memory_per_block",
     (8, "cudaDevAttrMaxSharedMemoryPerBlock")),
    ("shared_mem_per_block_optin", "bytes", "shared_memory_per_block_optin",
     (97, "cudaDevAttrMaxSharedMemoryPerBlockOptin")),
    ("shared_mem_per_sm", "bytes", "shared_memory_per_multiprocessor",
     (81, "cudaDevAttrMaxSharedMemoryPerMultiprocessor")),
    ("shared_mem_reserved_per_block", "bytes", None,
     (111, "cudaDevAttrReservedSharedMemoryPerBlock")),
    ("l2_bytes", "bytes", "L2_cache_size", (38, "cudaDevAttrL2CacheSize")),
    ("memory_bytes", "bytes", "total_memory", None),
    ("compute_capability_major", "", "major", (75, "cudaDevAttrComputeCapabilityMajor")),
    ("compute_capability_minor", "", "minor", (76, "cudaDevAttrComputeCapabilityMinor")),
    ("memory_clock_khz", "kHz", None, (36, "cudaDevAttrMemoryClockRate")),
    ("memory_bus_bits", "bits", None, (37, "cudaDevAttrGlobalMemoryBusWidth")),
)  # fmt: skip
NO_REGS_PER_THREAD = (
    "no runtime attribute reports it (ptxas caps it: 255 on CUDA since cc 3.5); the profile's "
    "value stands"
)


class Runtime:
    """``attribute(number) -> int or None`` over whichever library answered, and its name."""

    def __init__(self, label: str, get: Callable[[int], Optional[int]]) -> None:
        self.label = label
        self.get = get


def _loaded_paths(stem: str) -> list:
    """Paths of ``stem*`` libraries already mapped into this process (torch's own runtime)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if stem in line and "/" in line}
    except OSError:
        return []
    return sorted(p for p in paths if os.path.basename(p).startswith(stem))


def cudart_candidates() -> list:
    """Where a CUDA(-compatible) runtime may be: already loaded, the linker's, the toolkits'."""
    found = _loaded_paths("libcudart")
    name = ctypes.util.find_library("cudart")
    if name:
        found.append(name)
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/corex",
             "/usr/local/cuda"]  # fmt: skip
    dirs = [os.path.join(r, sub) for r in roots if r for sub in ("lib64", "lib")]
    for site in sys.path:
        dirs += glob.glob(os.path.join(site, "nvidia", "cuda_runtime", "lib"))
        dirs += glob.glob(os.path.join(site, "nvidia", "cu*", "lib"))
        dirs.append(os.path.join(site, "torch", "lib"))
    for d in dirs:
        found += sorted(glob.glob(os.path.join(d, "libcudart.so*")))
    return list(dict.fromkeys(found))


def _cudart(device: int) -> tuple:
    tried = []
    for path in cudart_candidates():
        try:
            lib = ctypes.CDLL(path)
            fn = lib.cudaDeviceGetAttribute
        except (OSError, AttributeError) as exc:
            tried.append(f"{path}: {exc}")
            continue

        def get(attr: int, fn=fn) -> Optional[int]:
            value = ctypes.c_int()
            rc = fn(ctypes.byref(value), ctypes.c_int(attr), ctypes.c_int(device))
            return value.value if rc == 0 else None

        return Runtime(f"cudaDeviceGetAttribute via ctypes ({path})", get), tried
    return None, tried


def _driver(device: int) -> tuple:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        handle = ctypes.c_int()
        if lib.cuInit(0) != 0 or lib.cuDeviceGet(ctypes.byref(handle), device) != 0:
            return None, ["libcuda.so.1: cuInit / cuDeviceGet failed"]
    except (OSError, AttributeError) as exc:
        return None, [f"libcuda.so.1: {exc}"]

    def get(attr: int) -> Optional[int]:
        value = ctypes.c_int()
        rc = lib.cuDeviceGetAttribute(ctypes.byref(value), ctypes.c_int(attr), handle)
        return value.value if rc == 0 else None

    return Runtime("cuDeviceGetAttribute via ctypes (libcuda.so.1)", get), []


def find_runtime(device: int) -> tuple:
    """(Runtime or None, why none): the runtime API first, then the driver API."""
    rt, tried = _cudart(device)
    if rt is not None:
        return rt, ""
    rt, more = _driver(device)
    if rt is not None:
        return rt, ""
    return None, "; ".join(tried + more) or "no libcudart found"


def driver_facts(device: int) -> tuple:
    """(facts, runtime label or why none) for CUDA device ``device``."""
    import torch

    props = torch.cuda.get_device_properties(device)
    rt, why_none = find_runtime(device)
    facts = {}
    for name, unit, prop, attr in DRIVER_FACTS:
        from_torch = getattr(props, prop, None) if prop else None
        from_rt = rt.get(attr[0]) if rt is not None and attr is not None else None
        if from_torch is not None:
            method = f"torch.cuda.get_device_properties().{prop}"
            if from_rt is not None:
                agree = "agrees" if from_rt == from_torch else f"says {from_rt}"
                method += f" ({attr[1]} {agree})"
            facts[name] = measured(int(from_torch), unit, method)
        elif from_rt is not None:
            facts[name] = measured(from_rt, unit, f"{attr[1]}: {rt.label}")
        else:
            why = [f"torch {torch.__version__} has no property {prop}" if prop else None]
            if attr is None:
                why.append("no runtime attribute")
            elif rt is None:
                why.append(f"no CUDA runtime to ask ({why_none})")
            else:
                why.append(f"{attr[1]} gave an error")
            facts[name] = absent(unit, "; ".join(w for w in why if w))
    facts["max_registers_per_thread"] = absent("registers", NO_REGS_PER_THREAD)
    return facts, (rt.label if rt is not None else f"none: {why_none}")


def gpu_only_names() -> list:
    return [name for name, *_ in DRIVER_FACTS] + ["max_registers_per_thread"]


def units() -> dict:
    return {name: unit for name, unit, *_ in DRIVER_FACTS} | {
        "max_registers_per_thread": "registers"
    }
