"""How each prefill backend's plans run, registered by name.

:func:`attn_core.paged_prefix_prefill` looks a plan's runner up here instead of testing plan
types: the torch path, the native kernel, and every fused backend of
:data:`attn_core.prefill.backends.BACKENDS` (one runner serves them all: the fused driver calls
the backend the plan names). A new backend is its own module and one :func:`register` line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

import torch

from attn_core.core.workspace import Workspace, default_workspace
from attn_core.prefill.backends import BACKENDS as FUSED_BACKENDS
from attn_core.prefill.fused import run_fused_prefill
from attn_core.prefill.native_path import run_native_prefill
from attn_core.prefill.plan import PrefillPlan
from attn_core.prefill.plan_native import NativePrefillPlan
from attn_core.prefill.problem import Problem, SeqSpan
from attn_core.prefill.torch_path import run_torch_prefill
from attn_core.prefill.verify import ensure_verified


@dataclass(frozen=True)
class PrefillCall:
    """One validated call as every runner receives it.

    Attributes:
        lengths: ``(query_start_loc, seq_lens, context_lens)`` as the caller passed them (on the
            device: the native kernel reads them there).
        max_query_len / max_context_len: the call's longest chunk and context.
        workspace: the caller's scratch, or None (a runner that needs one takes the thread's).
    """

    problem: Problem
    spans: list[SeqSpan]
    lengths: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    max_query_len: int
    max_context_len: int
    out: torch.Tensor
    workspace: Optional[Workspace]


@dataclass(frozen=True)
class PrefillRunner:
    """How one backend's plans run.

    Attributes:
        plan_type: the plan class its planner makes.
        run: runs a plan on a validated call, writing ``call.out``.
        features: whether it takes ALiBi slopes and a sliding window.
        cache_bound: its plans are made for one cache layout (block size, cache dtype).
        needs_library: its plans run a native library the resolver attaches.
        verify: ``(backend, device, dtype, head_size)``: raises unless the backend matched the
            float64 reference there (once per process), for backends checked at first use.
    """

    plan_type: type
    run: Callable[[Any, PrefillCall], None]
    features: bool = True
    cache_bound: bool = False
    needs_library: bool = False
    verify: Optional[Callable[[str, torch.device, torch.dtype, int], None]] = None


RUNNERS: dict[str, PrefillRunner] = {}


def register(names: tuple[str, ...], runner: PrefillRunner) -> None:
    for name in names:
        RUNNERS[name] = runner


def runner_of(plan: object) -> PrefillRunner:
    """The registered runner of ``plan``'s backend; ``ValueError`` for anything else."""
    runner = RUNNERS.get(getattr(plan, "backend", None))  # type: ignore[arg-type]
    if runner is None or not isinstance(plan, runner.plan_type):
        raise ValueError(
            f"plan must be an attn_core PrefillPlan or NativePrefillPlan, got {type(plan).__name__}"
        )
    return runner


def _torch(plan: PrefillPlan, call: PrefillCall) -> None:
    run_torch_prefill(plan, call.problem, call.spans, call.out, call.workspace)


def _fused(plan: PrefillPlan, call: PrefillCall) -> None:
    run_fused_prefill(plan, call.problem, call.spans, call.out)


def _native(plan: NativePrefillPlan, call: PrefillCall) -> None:
    ws = call.workspace if call.workspace is not None else default_workspace()
    run_native_prefill(
        plan, call.problem, call.lengths, call.max_query_len, call.max_context_len, call.out, ws
    )


register(("torch",), PrefillRunner(PrefillPlan, _torch))
register(
    tuple(FUSED_BACKENDS),
    PrefillRunner(PrefillPlan, _fused, features=False, verify=ensure_verified),
)
register(
    ("native",),
    PrefillRunner(NativePrefillPlan, _native, cache_bound=True, needs_library=True),
)
