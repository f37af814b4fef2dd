"""A profile for a CUDA device no built-in profile matches, from what its driver reports.

Never silently the bi-v100 profile: an unknown NVIDIA GPU gets its own SM count, warp size,
thread, register, shared-memory, L2 and memory limits from ``torch.cuda.get_device_properties``
(provenance "reported by the driver"). What the driver does not report (bandwidth, FLOP/s,
launch costs, allocation granularities) is taken from the built-in profile of the nearest
architecture and marked "assumed: as <profile>"; a device-facts run measures those
(``python -m hil --suite device-facts``, then ``python -m attn_sim profile-from``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from attn_core.device.spec import DeviceSpec, get_device_spec

# property of torch's _CudaDeviceProperties -> DeviceSpec field (torch 2.1 lacks some: absent
# ones keep the base profile's value, marked assumed)
_DRIVER_FIELDS = {
    "multi_processor_count": "sm_count",
    "warp_size": "warp_size",
    "max_threads_per_block": "max_threads_per_block",
    "max_threads_per_multi_processor": "max_threads_per_sm",
    "regs_per_multiprocessor": "registers_per_sm",
    "shared_memory_per_block": "shared_mem_per_block",
    "shared_memory_per_multiprocessor": "shared_mem_per_sm",
    "L2_cache_size": "l2_bytes",
    "total_memory": "memory_bytes",
}


def base_profile_for(major: int) -> DeviceSpec:
    """The built-in profile of the nearest NVIDIA architecture: Hopper and later -> h200,
    earlier -> a100."""
    return get_device_spec("h200" if major >= 9 else "a100")


def spec_from_properties(props: Any) -> DeviceSpec:
    """A :class:`DeviceSpec` from a ``torch.cuda.get_device_properties`` result (or any object
    with those attributes)."""
    base = base_profile_for(int(getattr(props, "major", 8)))
    changes: dict[str, Any] = {}
    provenance = {k: f"assumed: as {base.name}" for k in base.provenance}
    for prop, field in _DRIVER_FIELDS.items():
        value = getattr(props, prop, None)
        if isinstance(value, int) and value > 0:
            changes[field] = value
            provenance[field] = f"reported by the driver ({prop})"
    name = str(getattr(props, "name", "cuda device")).strip().lower().replace(" ", "-")
    return dataclasses.replace(base, name=f"{name}+driver", provenance=provenance, **changes)


def driver_spec(device: torch.device) -> DeviceSpec:
    """The driver-built profile of CUDA ``device``."""
    return spec_from_properties(torch.cuda.get_device_properties(device))
