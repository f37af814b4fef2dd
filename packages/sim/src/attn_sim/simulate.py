"""One simulated step: attn-core's plan judged on a profile, and its traced code timed there.

:func:`simulate` is what the report, the gates, calibration and the sweep share. It reads the
plan (tier, partitions, the launches a device kernel would make) and every design the plan could
choose for the case (all decode tiers), checks them against the shared-memory budget, traces the
real torch code on meta tensors and prices each launch with :mod:`attn_sim.cost`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Optional

from attn_core.device.spec import DeviceSpec
from attn_sim.cost import step_cost
from attn_sim.designs import DesignOnDevice, KernelDesign, evaluate, from_steps
from attn_sim.workloads import DTYPES, Case, plan_for, trace_case

DECODE_TIERS = ("single_tile", "one_pass", "partitioned")


@dataclass
class DesignCheck:
    name: str
    grid: tuple
    threads: int
    smem: int
    budget: int
    blocks_per_sm: int
    limiter: str
    waves: int
    tail_utilisation: float
    fits: bool
    chosen: bool  # the plan picked it for this case (others are what other tiers would run)


@dataclass
class CaseResult:
    profile: str
    path: str
    num_seqs: int
    context: int
    label: str
    tier: str
    partitions: int
    launches: int  # torch launches the traced step issued
    plan_launches: int  # device launches the plan describes
    syncs: int
    bytes: int
    flops: int
    max_waves: int
    time_s: float  # eager: host issue pipelined with device execution
    peak_bytes: int  # new allocations live at once during the steady call
    workspace_bytes: int  # reusable scratch kept between calls
    kv_bytes: int  # K+V of the cached context
    cache_fits_device: bool
    smem_budget: int
    designs: list[DesignCheck] = field(default_factory=list)
    trace_s: float = 0.0
    graph_time_s: float = 0.0  # the same launches replayed from a CUDA graph (device only)

    @property
    def transient_bytes(self) -> int:
        return self.peak_bytes + self.workspace_bytes

    @property
    def smem_max(self) -> int:
        return max((d.smem for d in self.designs if d.chosen), default=0)

    @property
    def plan_fits(self) -> bool:
        """Every launch of the chosen plan fits the budget (other tiers are informational)."""
        return all(d.fits for d in self.designs if d.chosen)

    def to_json(self) -> dict:
        out = asdict(self)
        out["transient_bytes"] = self.transient_bytes
        out["smem_max"] = self.smem_max
        out["plan_fits"] = self.plan_fits
        return out


def check_design(spec: DeviceSpec, design: KernelDesign, chosen: bool) -> DesignCheck:
    judged: DesignOnDevice = evaluate(spec, design)
    return DesignCheck(
        name=design.name,
        grid=tuple(design.grid),
        threads=design.threads,
        smem=design.smem,
        budget=spec.shared_mem_per_block,
        blocks_per_sm=judged.occupancy.blocks_per_sm,
        limiter=judged.occupancy.limiter,
        waves=judged.waves.waves if judged.waves else 0,
        tail_utilisation=judged.waves.tail_utilisation if judged.waves else 0.0,
        fits=judged.fits,
        chosen=chosen,
    )


def choosable_plans(spec: DeviceSpec, case: Case, planner: Callable) -> list:
    """``(plan, chosen)`` pairs: the plan for the case, and for decode each other tier's."""
    plan = planner(spec, case)
    plans = [(plan, True)]
    if case.path == "decode":
        for tier in DECODE_TIERS:
            if tier != getattr(plan, "tier", None):
                try:
                    plans.append((planner(spec, case, tier=tier), False))
                except ValueError:
                    continue  # a tier this case cannot take is not a choice
    return plans


def simulate(
    spec: DeviceSpec,
    case: Case,
    *,
    planner: Optional[Callable] = None,
    tracer: Optional[Callable] = None,
) -> CaseResult:
    """Plan, check and trace one case on ``spec``.

    ``planner(spec, case, tier=None)`` and ``tracer(spec, case) -> (Trace, workspace_bytes)``
    default to attn-core's; tests inject deliberately bad ones.
    """
    planner = planner or plan_for
    tracer = tracer or trace_case
    plans = choosable_plans(spec, case, planner)
    plan = plans[0][0]
    checks = [
        check_design(spec, d, chosen)
        for p, chosen in plans
        for d in from_steps(getattr(p, "steps", ()))
    ]
    start = time.perf_counter()
    record, workspace = tracer(spec, case)
    elapsed = time.perf_counter() - start
    cost = step_cost(spec, record)
    s = case.shape
    elem = _element_size(case.dtype)
    kv = 2 * case.num_seqs * s.num_kv_heads * case.context * s.head_size * elem
    return CaseResult(
        profile=spec.name,
        path=case.path,
        num_seqs=case.num_seqs,
        context=case.context,
        label=case.label(),
        tier=str(getattr(plan, "tier", getattr(plan, "backend", "?"))),
        partitions=int(getattr(plan, "num_partitions", getattr(plan, "key_tile", 0)) or 0),
        launches=record.launches,
        plan_launches=len(getattr(plan, "steps", ())),
        syncs=record.syncs,
        bytes=cost.bytes,
        flops=cost.flops,
        max_waves=cost.max_waves,
        time_s=cost.time_s,
        graph_time_s=cost.graph_time_s,
        peak_bytes=record.peak_bytes,
        workspace_bytes=workspace,
        kv_bytes=kv,
        cache_fits_device=kv <= spec.memory_bytes,
        smem_budget=spec.shared_mem_per_block,
        designs=checks,
        trace_s=elapsed,
    )


def _element_size(dtype: str) -> int:
    import torch

    return torch.empty((), dtype=DTYPES[dtype]).element_size()
