"""The decode backends, registered by name: what each one's plans are, whether it can serve a
shape on a device, and how its plans run.

:func:`attn_core.paged_decode` and the resolver look a plan's backend up here instead of testing
plan types; a new backend is its own module (planner, executor) and one :func:`register` line.
The pure planner (:func:`attn_core.plan_decode`) still decides *which* backend a call gets, from
:class:`~attn_core.device.capabilities.Capabilities` that the resolver fills from each backend's
:attr:`DecodeBackend.ready`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

import torch

from attn_core.core.settings import NativeSettings
from attn_core.core.shapes import AttentionShape
from attn_core.core.workspace import Workspace
from attn_core.decode.inputs import DecodeInputs
from attn_core.decode.native_step import partial_sizes, run_native_decode
from attn_core.decode.plan import DecodePlan
from attn_core.decode.plan_native import NativeDecodePlan
from attn_core.decode.torch_path import run_torch_decode
from attn_core.native.decode import DecodeLibrary, PreparedDecode, variant_for
from attn_core.native.loader import native_ready

# (plan, validated inputs, out, workspace) -> the launch a steady-state call may repeat, or None
Run = Callable[[Any, DecodeInputs, torch.Tensor, Workspace], Optional[PreparedDecode]]
# (settings, device, shape) -> (library, "") where it can serve the shape, else (None, why)
Ready = Callable[[NativeSettings, torch.device, AttentionShape], tuple[Any, str]]


@dataclass(frozen=True)
class DecodeBackend:
    """One way a decode step runs.

    Attributes:
        name: what ``backend=`` and ``ATTN_CORE_DECODE_BACKEND`` call it.
        plan_type: the plan class its planner makes.
        run: runs a plan on validated inputs; returns the launch a steady-state call repeats.
        ready: the impure can-serve step (build or load, verify against the float64
            reference); None for a backend that serves everything (the torch path).
        partials: the fp32 partial elements ``(out, lse)`` a plan's launch needs for a query.
    """

    name: str
    plan_type: type
    run: Run
    ready: Optional[Ready] = None
    partials: Callable[[Any, torch.Tensor], tuple[int, int]] = lambda plan, query: (0, 0)


BACKENDS: dict[str, DecodeBackend] = {}


def register(backend: DecodeBackend) -> None:
    BACKENDS[backend.name] = backend


def backend_of(plan: object) -> DecodeBackend:
    """The registered backend that runs ``plan``; ``ValueError`` for anything else."""
    backend = BACKENDS.get(getattr(plan, "backend", None))  # type: ignore[arg-type]
    if backend is None or not isinstance(plan, backend.plan_type):
        names = " or ".join(b.plan_type.__name__ for b in BACKENDS.values())
        raise ValueError(f"plan must be an attn_core {names}, got {type(plan).__name__}")
    return backend


def _run_torch(
    plan: DecodePlan, inputs: DecodeInputs, out: torch.Tensor, workspace: Workspace
) -> None:
    run_torch_decode(plan, inputs, out, workspace)
    return None


def _native_ready(
    settings: NativeSettings, device: torch.device, shape: AttentionShape
) -> tuple[Optional[DecodeLibrary], str]:
    return native_ready(DecodeLibrary, variant_for(shape.group), settings, device, shape)


register(DecodeBackend("torch", DecodePlan, _run_torch))
register(DecodeBackend("native", NativeDecodePlan, run_native_decode, _native_ready, partial_sizes))
