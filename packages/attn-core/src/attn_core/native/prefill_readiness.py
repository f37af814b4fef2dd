"""Whether a native prefill MMA variant may serve a configuration here (the impure step).

:func:`prefill_variant_ready` loads the variant's library (:mod:`.prefill_library`: prebuilt,
cached or built now) and asks the verify-once registry whether it matched the float64 reference
for this configuration (:mod:`.prefill_verify`; never during a CUDA-graph capture: that answer is
"not verified" and not kept). Only the resolver (:mod:`attn_core.runtime.resolve`) calls it; the
planner reads its answer as ``Capabilities.native_prefill``.
"""

from __future__ import annotations

from typing import Optional

import torch

from attn_core.core.settings import NativeSettings
from attn_core.core.shapes import AttentionShape
from attn_core.native.prefill_library import PrefillLibrary, load_prefill
from attn_core.native.prefill_verify import verify_native_prefill


def prefill_variant_ready(
    settings: NativeSettings, device: torch.device, shape: AttentionShape, variant: str
) -> tuple[Optional[PrefillLibrary], str]:
    """``(library, "")`` when ``variant`` may serve ``shape`` on ``device``, else
    ``(None, why)``."""
    if device.type != "cuda":
        return None, f"needs a CUDA device, got {device.type}"
    lib, how = load_prefill(
        variant, device, cuda_home=settings.cuda_home, cache_dir=settings.cache_dir,
        build=settings.build, arch=settings.arch,
    )  # fmt: skip
    if lib is None:
        return None, f"{variant} not available ({how})"
    verdict = verify_native_prefill(lib, device, shape)
    if not verdict.ok:
        return None, f"{variant} not verified here ({verdict.detail})"
    return lib, ""
