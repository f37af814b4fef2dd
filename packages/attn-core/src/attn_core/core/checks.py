"""Argument checks whose errors name the argument, the expected and the actual value.

Every public entry point validates shapes, dtypes and devices with these before planning, so a
bad call fails with ``ValueError: block_tables must be torch.int32, got torch.int64`` instead of
silent garbage. None of them reads tensor *values* (that would sync the host with the device);
value checks live behind ``ATTN_CORE_CHECKS=1`` (see :func:`value_checks_enabled`).

Scalars (``scale``, ``k_scale``, ``v_scale``) go through :func:`check_positive_finite` in every
entry point: NaN passes ``value <= 0`` and inf passes ``value > 0``, and either turns every
output into NaN/inf without an error. They are Python numbers, never tensors (reading a tensor's
value would sync the device).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Optional, Union

import torch

from attn_core.core.settings import current_overrides

Dim = Union[int, None]  # None: any size in this position


def value_checks_enabled() -> bool:
    """``ATTN_CORE_CHECKS=1`` turns on checks that read device values (and so sync).

    Read through :mod:`attn_core.core.settings` (cached on the raw environment values), so a value
    such as ``ATTN_CORE_CHECKS=maybe`` is a ``ValueError`` naming the variable, not "off".
    """
    return current_overrides().checks


def check_tensor(
    name: str,
    tensor: object,
    *,
    shape: Optional[Sequence[Dim]] = None,
    ndim: Optional[int] = None,
    dtype: Optional[Union[torch.dtype, Sequence[torch.dtype]]] = None,
    device: Optional[torch.device] = None,
) -> torch.Tensor:
    """Validate one tensor argument; returns it for chaining.

    ``shape`` entries that are ``None`` accept any size. ``dtype`` may be one dtype or several.
    """
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if shape is not None:
        ndim = len(shape)
    if ndim is not None and tensor.dim() != ndim:
        raise ValueError(
            f"{name} must have {ndim} dimensions"
            + (f" {_fmt_shape(shape)}" if shape is not None else "")
            + f", got {tensor.dim()} with shape {tuple(tensor.shape)}"
        )
    if shape is not None:
        for axis, want in enumerate(shape):
            if want is not None and tensor.shape[axis] != want:
                raise ValueError(
                    f"{name} must have shape {_fmt_shape(shape)}, got {tuple(tensor.shape)} "
                    f"(dimension {axis} is {tensor.shape[axis]}, expected {want})"
                )
    if dtype is not None:
        allowed = (dtype,) if isinstance(dtype, torch.dtype) else tuple(dtype)
        if tensor.dtype not in allowed:
            want_text = " or ".join(str(d) for d in allowed)
            raise ValueError(f"{name} must be {want_text}, got {tensor.dtype}")
    if device is not None and not _same_device(tensor.device, device):
        raise ValueError(f"{name} must be on {device}, got {tensor.device}")
    return tensor


def _same_device(a: torch.device, b: torch.device) -> bool:
    if a.type != b.type:
        return False
    # cuda and cuda:0 are the same place when the index is implied.
    return a.index is None or b.index is None or a.index == b.index


def _fmt_shape(shape: Optional[Sequence[Dim]]) -> str:
    if shape is None:
        return "[...]"
    return "[" + ", ".join("*" if d is None else str(d) for d in shape) + "]"


def check_positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def check_positive_finite(name: str, value: object) -> float:
    """A real number, finite and > 0 (``scale``, ``k_scale``, ``v_scale``); returns it as float.

    bool is refused (``True`` is an int to Python, never a meaningful scale); numpy scalars are
    accepted (they are :class:`numbers.Real`); tensors are refused (reading one would sync).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a positive float, got {type(value).__name__} {value!r}")
    as_float = float(value)
    if not (math.isfinite(as_float) and as_float > 0):
        raise ValueError(f"{name} must be a positive float, got {value!r} (expected finite, > 0)")
    return as_float


def resolve_scale(scale: Optional[float], head_size: int) -> float:
    """``scale=None`` means ``1/sqrt(head_size)``, as in vLLM; otherwise finite and > 0."""
    if scale is None:
        return head_size**-0.5
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise ValueError(f"scale must be a float or None, got {type(scale).__name__}")
    return check_positive_finite("scale", scale)
