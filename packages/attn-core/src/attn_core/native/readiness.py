"""Whether the native kernel may serve a configuration on this device.

``native_ready`` answers once per (device, configuration) whether the kernel is built, loaded
and has matched the float64 reference on this device (:mod:`attn_core.native.verify`). A
verification syncs, so during a CUDA-graph capture an unverified configuration is reported as
not ready and that call's plan takes the torch path. ``with_native_capability`` turns the
answer into :attr:`attn_core.capabilities.Capabilities.native_decode`, the only thing the pure
planner reads.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from attn_core.capabilities import Capabilities
from attn_core.native.library import NativeLibrary, load_native
from attn_core.native.verify import verdicts, verify_native
from attn_core.settings import NativeSettings, Overrides
from attn_core.shapes import AttentionShape
from attn_core.workspace import is_capturing


def native_ready(
    settings: NativeSettings,
    device: torch.device,
    dtype: torch.dtype,
    kv_cache_dtype: str,
    head_size: int,
    block_size: int,
    group: int,
) -> tuple[Optional[NativeLibrary], str]:
    """``(library, "")`` when the kernel may serve this configuration, else ``(None, why)``.

    A ready answer is kept for the process (every decode call asks: one dict lookup, no driver
    query, no lock); a "not ready" one is asked again, since a capture may have deferred it.
    """
    key = (settings, str(device), dtype, kv_cache_dtype, head_size, block_size, group)
    ready = _READY.get(key)
    if ready is not None:
        return ready, ""
    lib, status = load_native(settings, device, group)
    if lib is None:
        return None, f"not available ({status.detail})"
    verdict = verdicts().get(key[1:])
    if verdict is None:
        if is_capturing(device):
            return None, "not yet verified on this device, and a CUDA graph is being captured"
        verdict = verify_native(lib, device, dtype, kv_cache_dtype, head_size, block_size, group)
    if not verdict.ok:
        return None, f"not verified: it did not match the float64 reference ({verdict.detail})"
    _READY[key] = lib
    return lib, ""


_READY: dict[tuple, NativeLibrary] = {}


def with_native_capability(
    caps: Capabilities,
    settings: Overrides,
    device: torch.device,
    shape: AttentionShape,
) -> Capabilities:
    """``caps`` with ``native_decode`` set for this device and configuration.

    Asks only where the native kernel could be chosen (a CUDA device, the backend not forced
    to torch); a forced ``native`` that cannot run raises here, naming why.
    """
    if settings.decode.backend == "torch" or device.type != "cuda":
        if settings.decode.backend == "native":
            raise ValueError(
                f"ATTN_CORE_DECODE_BACKEND=native needs a CUDA device, got {device.type}"
            )
        return caps
    lib, why = native_ready(
        settings.native,
        device,
        shape.dtype,
        shape.kv_cache_dtype,
        shape.head_size,
        shape.block_size,
        shape.group,
    )
    if lib is None and settings.decode.backend == "native":
        raise ValueError(f"ATTN_CORE_DECODE_BACKEND=native, but the native kernel is {why}")
    return dataclasses.replace(caps, native_decode=lib is not None)
