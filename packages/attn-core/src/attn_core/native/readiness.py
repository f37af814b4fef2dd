"""Whether the native kernel may serve a configuration on this device (the impure step).

``native_ready`` loads the library (:mod:`.library`: prebuilt, cached or built now) and asks
the verify-once registry whether it matched the float64 reference here (:mod:`.verify`). A
verification syncs, so during a CUDA-graph capture an unverified configuration is reported as
not ready (the registry keeps no verdict then) and that plan takes the torch path. Only the
resolver (:mod:`attn_core.runtime.resolve`) calls this, once per resolved plan; the planners read
its answer as :attr:`attn_core.device.capabilities.Capabilities.native_decode` and never import it.
"""

from __future__ import annotations

from typing import Optional

import torch

from attn_core.core.settings import NativeSettings
from attn_core.core.shapes import AttentionShape
from attn_core.native.library import NativeLibrary, load_native
from attn_core.native.verify import verify_native


def native_ready(
    settings: NativeSettings, device: torch.device, shape: AttentionShape
) -> tuple[Optional[NativeLibrary], str]:
    """``(library, "")`` when the kernel may serve ``shape`` on ``device``, else ``(None, why)``."""
    if device.type != "cuda":
        return None, f"needs a CUDA device, got {device.type}"
    lib, status = load_native(settings, device, shape.group)
    if lib is None:
        return None, f"not available ({status.detail})"
    verdict = verify_native(
        lib, device, shape.dtype, shape.kv_cache_dtype, shape.head_size, shape.block_size,
        shape.group,
    )  # fmt: skip
    if not verdict.ok:
        return None, f"not verified: it did not match the float64 reference ({verdict.detail})"
    return lib, ""
