"""Which executor serves a linear-attention call: the torch path or the native library.

``backend=None`` (default): the native Gated DeltaNet library (:mod:`attn_core.native.
gated_delta`) where it is loaded and matched the float64 reference on this CUDA device and its
kernels serve the call's sizes and layouts, else the torch path. ``"torch"``: always the torch
path. ``"native"``: the native library, or a ``ValueError`` that says why it cannot serve.

Readiness is :func:`attn_core.native.loader.native_ready`: the library is loaded once per
process and checked once per (device, dtype, head sizes, GQA group). The check syncs, so while
a CUDA graph is being captured an unchecked configuration takes the torch path (warm up
before capturing); a checked one costs a dictionary lookup, no sync.
"""

from __future__ import annotations

from typing import Optional

import torch

from attn_core.core.checks import check_backend
from attn_core.core.settings import current_overrides
from attn_core.native.gated_delta import VARIANT, GatedDeltaLibrary, LinearShape
from attn_core.native.loader import native_ready

BACKENDS = ("torch", "native")


def check_linear_backend(backend: object) -> Optional[str]:
    """``backend=`` of a linear-attention entry point: None, ``"torch"`` or ``"native"``."""
    return check_backend(backend, BACKENDS)


def native_library(
    backend: Optional[str],
    entry: str,
    device: torch.device,
    shape: LinearShape,
    unsupported: Optional[str],
) -> Optional[GatedDeltaLibrary]:
    """The verified library serving ``entry``'s call, or None for the torch path.

    Args:
        backend: the call's checked ``backend=``.
        entry: the entry point's name, for the error.
        shape: the call's verify-once key.
        unsupported: why the kernels cannot read this call's sizes or layouts, or None.

    Raises:
        ValueError: ``backend == "native"`` and the library cannot serve, naming why.
    """
    if backend == "torch":
        return None
    lib, why = None, unsupported
    if device.type != "cuda":  # the first reason, before any about sizes
        why = f"needs a CUDA device, got {device.type}"
    if why is None:
        lib, why = native_ready(GatedDeltaLibrary, VARIANT, current_overrides().native, device,
                                shape)  # fmt: skip
    if lib is None and backend == "native":
        raise ValueError(f"backend='native' cannot serve {entry} here: {why}")
    return lib
