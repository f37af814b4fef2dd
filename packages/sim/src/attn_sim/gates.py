"""Gates CI runs on every push: shared memory, launches, syncs, transient memory, time.

Per profile in ``gates.toml``:

1. ``shared_memory``: every design attn-core's plans choose over a grid of batches x contexts
   (decode) and query lengths x contexts (prefill) fits one block's budget and can launch.
2. ``launches`` / ``plan_launches`` / ``syncs``: per traced decode step (launches per tier where
   ``max_launches_by_tier`` names it, else ``max_launches``).
3. ``transient``: peak new allocations + reusable workspace of a step against the memory bound.
4. ``time``: predicted step time against ``baseline.json`` plus the tolerance (a case with no
   baseline fails too: ``update-baseline`` is the explicit way to accept new numbers).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional

from tabulate import tabulate

from attn_core.core.settings import DecodeOverrides
from attn_core.device.spec import DeviceSpec
from attn_sim import hybrid_request, linear_layer
from attn_sim.config import decode_threshold
from attn_sim.designs import evaluate, from_steps
from attn_sim.native_design import native_designs
from attn_sim.prefill_ttft import prompt_seconds
from attn_sim.simulate import CaseResult, simulate
from attn_sim.workloads import Case, base_name, plan_for


@dataclass(frozen=True)
class Violation:
    profile: str
    gate: str
    case: str
    value: float
    limit: float
    detail: str = ""

    @property
    def over_by(self) -> float:
        return self.value - self.limit

    @property
    def over_pct(self) -> float:
        return 100.0 * self.over_by / self.limit if self.limit else float("inf")


@dataclass
class GateReport:
    checks: int = 0
    violations: list[Violation] = field(default_factory=list)
    results: list[CaseResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


def plan_grid(gates: dict) -> list[Case]:
    """The cases whose plans must all fit: geometric contexts x batches, and prefill chunks."""
    g = gates["plan"]
    contexts, i = [], 0
    while True:
        ctx = round(g["context_min"] * 2 ** (i / g["steps_per_octave"]))
        if ctx > g["context_max"]:
            break
        if not contexts or ctx != contexts[-1]:
            contexts.append(ctx)
        i += 1
    cases = [Case("decode", b, c) for b in g["batches"] for c in contexts]
    octaves = contexts[:: g["steps_per_octave"]]  # prefill plans are costlier: one per octave
    for q in g.get("prefill_query_lens", []):
        cases += [Case("prefill", 1, c, query_len=q) for c in octaves if c >= q]
    return cases


def gated_cases(gates: dict) -> list[Case]:
    cases = [Case("decode", b, c) for b, c in gates["decode"]["cases"]]
    cases += [Case("prefill", b, c, query_len=q) for b, q, c in gates["prefill"]["cases"]]
    return cases


def check_plans(spec: DeviceSpec, gates: dict, planner: Callable, report: GateReport) -> None:
    """The plan grid as planned by default, then under each streaming chunk size."""
    _check_plan_grid(spec, planner, report, plan_grid(gates))
    decode = [c for c in plan_grid(gates) if c.path == "decode"]
    _check_native_grid(spec, report, decode)
    for tokens in gates["plan"].get("decode_stream_tokens", []):
        streamed = [
            dataclasses.replace(c, decode=DecodeOverrides(stream_tokens=tokens)) for c in decode
        ]
        _check_plan_grid(spec, planner, report, streamed, f" stream{tokens}")


def _check_native_grid(spec: DeviceSpec, report: GateReport, cases: list) -> None:
    """The native kernel's launches over the same grid: resident, within the smem budget."""
    for case in cases:
        try:
            designs = native_designs(spec, case.shape, case.num_seqs, case.context)
        except ValueError as exc:  # cannot be resident at all on this profile
            report.checks += 1
            report.violations.append(
                Violation(spec.name, "native_kernel", case.label(), 0, 1, str(exc))
            )
            continue
        for design in designs:
            report.checks += 1
            judged = evaluate(spec, design)
            # the budget is the opt-in one for a design whose launcher opts in (its dynamic
            # shared memory past 48 KiB, the matrix-unit decode body), else the default one
            if judged.fits and design.smem <= judged.smem_budget:
                continue
            report.violations.append(
                Violation(
                    profile=spec.name,
                    gate="native_kernel",
                    case=f"{case.label()} {design.name}",
                    value=design.smem,
                    limit=judged.smem_budget,
                    detail=f"{judged.occupancy.blocks_per_sm} blocks/SM, "
                    f"limited by {judged.occupancy.limiter}",
                )
            )


def _check_plan_grid(
    spec: DeviceSpec, planner: Callable, report: GateReport, cases: list, suffix: str = ""
) -> None:
    for case in cases:
        plan = planner(spec, case)
        for design in from_steps(plan.steps):
            report.checks += 1
            judged = evaluate(spec, design)
            if judged.fits:
                continue
            over_budget = design.smem > spec.shared_mem_per_block
            report.violations.append(
                Violation(
                    profile=spec.name,
                    gate="shared_memory" if over_budget else "occupancy",
                    case=f"{case.label()}{suffix} {design.name}",
                    value=design.smem if over_budget else 0,
                    limit=spec.shared_mem_per_block if over_budget else 1,
                    detail=f"limited by {judged.occupancy.limiter}",
                )
            )


def check_result(
    spec: DeviceSpec, gates: dict, r: CaseResult, baseline: dict, report: GateReport
) -> None:
    def gate(name: str, value: float, limit: float, detail: str = "") -> None:
        report.checks += 1
        if value > limit:
            report.violations.append(Violation(spec.name, name, r.label, value, limit, detail))

    if r.path == "decode":
        by_tier = gates["decode"].get("max_launches_by_tier", {})
        limit = by_tier.get(r.tier, gates["decode"]["max_launches"])
        gate("launches", r.launches, limit, f"torch launches per step ({r.tier})")
        gate("plan_launches", r.plan_launches, gates["decode"]["max_plan_launches"])
        gate("syncs", r.syncs, gates["decode"]["max_syncs"], "host reads per step")
        ratio = decode_threshold(gates, base_name(spec), "transient_kv_ratio")
        floor = gates["decode"]["transient_floor_bytes"]
        gate("transient", r.transient_bytes, ratio * r.kv_bytes + floor, f"{ratio} x K+V + floor")
    else:
        gate("syncs", r.syncs, gates["prefill"]["max_syncs"], "host reads per call")
        over = gates["prefill"]["transient_over_kv_bytes"]
        gate("transient", r.transient_bytes, r.kv_bytes + over, "K+V + prefill budget")
    if r.cache_fits_device:
        gate("device_memory", r.kv_bytes + r.transient_bytes, spec.memory_bytes, "K+V + transient")
    known = baseline.get("profiles", {}).get(spec.name, {}).get(r.label)
    if known is None:
        report.checks += 1
        report.violations.append(
            Violation(spec.name, "time", r.label, r.time_s, 0.0, "no baseline: update-baseline")
        )
        return
    tol = gates["time"]["tolerance"]
    detail = f"baseline {known['time_s']:.3e} s + {tol:.0%}"
    gate("time", r.time_s, known["time_s"] * (1 + tol), detail)


def run_gates(
    specs: list[DeviceSpec],
    gates: dict,
    baseline: dict,
    *,
    planner: Optional[Callable] = None,
    tracer: Optional[Callable] = None,
) -> GateReport:
    """Every gate on every profile; ``planner``/``tracer`` default to attn-core's real code."""
    planner = planner or plan_for
    report = GateReport()
    for spec in specs:
        check_plans(spec, gates, planner, report)
        for case in gated_cases(gates):
            r = simulate(spec, case, planner=planner, tracer=tracer)
            report.results.append(r)
            check_result(spec, gates, r, baseline, report)
        check_hybrid(spec, gates, report)
    return report


def check_hybrid(spec: DeviceSpec, gates: dict, report: GateReport) -> None:
    """``[hybrid]``: the linear layers' share of one request's prefill on the default hybrid
    model (:mod:`attn_sim.hybrid_request`), on the profiles the section names."""
    hybrid = gates.get("hybrid")
    if not hybrid or base_name(spec) not in hybrid["profiles"]:
        return
    model = hybrid_request.HybridModel.from_config(None)
    prompt, chunk, path = hybrid["prompt"], hybrid["chunk"], hybrid["path"]
    full = prompt_seconds(model.attention, spec, prompt, chunk)
    full_s = full["torch" if path == "torch" else "plan"] * model.full_layers
    lin_s = linear_layer.prefill(spec, model.linear, path, prompt, chunk) * model.linear_layers
    share = lin_s / (full_s + lin_s)
    report.checks += 1
    if share > hybrid["max_linear_share"]:
        detail = f"linear {lin_s:.3g} s vs full attention {full_s:.3g} s"
        case = f"hybrid {path} prefill {prompt}"
        report.violations.append(
            Violation(spec.name, "linear_share", case, share, hybrid["max_linear_share"], detail)
        )


def baseline_from(results: list[CaseResult], previous: Optional[dict] = None) -> dict:
    """A baseline of these results' predicted times; profiles not simulated keep their entries,
    simulated ones are replaced whole (no stale cases)."""
    base = {"profiles": dict((previous or {}).get("profiles", {}))}
    for profile in {r.profile for r in results}:
        base["profiles"][profile] = {}
    for r in results:
        base["profiles"][r.profile][r.label] = {"time_s": r.time_s, "launches": r.launches}
    return base


# What one of "N gate checks" is, for the line that counts them.
CHECKS_MEAN = (
    "a gate check is one threshold of gates.toml (shared memory, launches, syncs, transient "
    "memory, time against baseline.json) on one case of one profile, each threshold checked "
    "separately"
)


def format_violations(report: GateReport) -> str:
    if report.ok:
        return f"all {report.checks} gate checks passed ({CHECKS_MEAN})"
    rows = [
        (
            v.profile,
            v.gate,
            v.case,
            _num(v.value),
            _num(v.limit),
            _num(v.over_by),
            f"{v.over_pct:.1f}%",
            v.detail,
        )
        for v in report.violations
    ]
    head = ("profile", "gate", "case", "value", "limit", "over by", "over %", "detail")
    table = tabulate(rows, headers=head, tablefmt="github")
    return (
        f"{len(report.violations)} of {report.checks} gate checks FAILED ({CHECKS_MEAN})\n{table}"
    )


def _num(x: float) -> str:
    if isinstance(x, float) and abs(x) < 1:
        return f"{x:.3e}"
    return f"{int(round(x)):,}"
