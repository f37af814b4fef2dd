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
from typing import Any, Optional, Union

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


class ArgumentTypeError(ValueError, TypeError):
    """An argument of the wrong Python type: both a ``TypeError`` (what it is) and a
    ``ValueError`` (what attn-core's entry points raise for every bad argument, so callers that
    catch one keep working)."""


def type_name(value: object) -> str:
    """``value``'s type as an error message shows it (``torch.Tensor``, ``DecodePlan``, ...)."""
    kind = type(value)
    return "torch.Tensor" if isinstance(value, torch.Tensor) else kind.__name__


def check_type(name: str, value: object, types: Union[type, tuple], expected: str) -> Any:
    """``value`` must be an instance of ``types`` (bool is no int here); returns it.

    ``expected`` says what in words: ``"an AttentionShape"``, ``"None or a DeviceSpec"``.
    """
    wanted = types if isinstance(types, tuple) else (types,)
    bool_sneaks_in = isinstance(value, bool) and bool not in wanted
    if bool_sneaks_in or not isinstance(value, wanted):
        raise ArgumentTypeError(f"{name} must be {expected}, got {type_name(value)} {value!r}")
    return value


def check_device(name: str, value: object) -> torch.device:
    """A ``torch.device`` or a device string (``"cpu"``, ``"cuda:0"``); returns the device."""
    if isinstance(value, torch.device):
        return value
    if isinstance(value, str):
        try:
            return torch.device(value)
        except (RuntimeError, ValueError):
            pass
    raise ArgumentTypeError(
        f"{name} must be a torch.device or a device string such as 'cpu' or 'cuda:0', "
        f"got {type_name(value)} {value!r}"
    )


def check_out(
    out: object,
    shape: Sequence[int],
    dtype: torch.dtype,
    device: torch.device,
    *,
    contiguous: bool = False,
) -> torch.Tensor:
    """The entry points' ``out=``: a tensor of ``shape`` / ``dtype`` / ``device`` whose
    elements are distinct memory (an expanded or self-overlapping view would have two results
    written to one place; torch refuses some of those writes with an error that does not name
    ``out``, and silently keeps the last one elsewhere). ``contiguous``: also dense, row-major.
    """
    check_tensor("out", out, shape=tuple(shape), dtype=dtype, device=device)
    assert isinstance(out, torch.Tensor)
    if _may_overlap(out):
        raise ValueError(
            f"out must not have overlapping elements (an expanded or overlapping view), got "
            f"shape {tuple(out.shape)} with strides {out.stride()}"
        )
    if contiguous and not out.is_contiguous():
        raise ValueError(f"out must be contiguous, got strides {out.stride()}")
    return out


def _may_overlap(t: torch.Tensor) -> bool:
    """True unless every element of ``t`` has its own memory: each dimension (by increasing
    stride) must step past everything the smaller ones reach."""
    if t.numel() <= 1:
        return False
    reach = 0  # the largest offset the dimensions seen so far reach
    dims = sorted((st, sz) for sz, st in zip(t.shape, t.stride(), strict=True) if sz > 1)
    for stride, size in dims:
        if stride <= reach:
            return True
        reach += stride * (size - 1)
    return False


def check_backend(backend: object, choices: tuple[str, ...]) -> Optional[str]:
    """``backend=`` of an entry point or resolver: None or one of ``choices`` (a str; a list,
    bytes or bool is refused, never hashed into a plan cache key)."""
    if backend is None:
        return None
    if not isinstance(backend, str) or backend not in choices:
        got = repr(backend) if isinstance(backend, str) else f"{type_name(backend)} {backend!r}"
        raise ValueError(f"backend must be None or one of {', '.join(choices)}, got {got}")
    return backend


def check_types(*checks: tuple[str, object, type]) -> None:
    """``(name, value, type)`` triples, each value an instance of its attn-core type: the
    planners' arguments, whose fields they read at once (a wrong object would otherwise be an
    ``AttributeError`` from inside them). A type whose name ends in ``Overrides`` also takes
    None."""
    for name, value, kind in checks:
        optional = kind.__name__.endswith("Overrides")
        if optional and value is None:
            continue
        check_type(name, value, kind, ("None or " if optional else "") + f"a {kind.__name__}")


def check_window(sliding_window: object) -> int:
    """``sliding_window``: None, 0 or -1 (none), or a window in tokens; returns 0 for none."""
    if sliding_window is None:
        return 0
    if isinstance(sliding_window, bool) or not isinstance(sliding_window, int):
        raise ArgumentTypeError(
            f"sliding_window must be an int or None, got {type_name(sliding_window)} "
            f"{sliding_window!r}"
        )
    if sliding_window < -1:
        raise ValueError(f"sliding_window must be >= -1 (-1 and 0: none), got {sliding_window}")
    return max(sliding_window, 0)


def check_heads(query: torch.Tensor) -> None:
    """``query [tokens, num_heads, head_size]`` has at least one head (a shape that divides
    by any KV-head count, and plans nothing)."""
    if query.shape[1] < 1:
        raise ValueError(
            f"query's num_heads (dimension 1) must be >= 1, got shape {tuple(query.shape)}"
        )


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
