"""``python -m attn_sim calibrate``: fit device and host constants to measured decode steps.

Two kinds of measured time, because they answer different questions:

- *graph* (CUDA-graph replay of one step; how vLLM runs decode): device time only. It fixes the
  **device terms** ``hbm_bandwidth``, ``fp16_flops``, ``fp32_flops`` and ``launch_gap_s`` (the
  device time every launch costs even with the host far ahead).
- *eager* (a plain call): the host issues every launch (``launch_overhead_s`` each, pipelined
  with the device). On GPU run 1's H200 host this was ~28 us per launch, so every batch-1 step
  measured ~2 ms whatever its context: eager times alone cannot pin the device terms (that
  fit put fp32_flops at 2e15). With graph times present the host term is fitted on eager times
  *after* the device terms, holding them fixed; with eager times only (old files), bandwidth,
  rates and ``launch_overhead_s`` are fitted together as before, ``launch_gap_s`` kept.

Input: a JSON file of measured steps, read and checked by :mod:`attn_sim.measurements`.

Cases are sorted and split alternately within each (path, tier) group: even ones fit the
constants (least squares on ``log(predicted / measured)`` with bounds: no throughput above the
profile's peak, and a tiny pull towards the profile so terms the data cannot see stay put; the
traces are made once, only the constants move), odd ones validate. A record's ``tier`` (the
decode bench's) is forced while tracing, so the trace runs what was measured. Writes the
calibrated profile JSON and reports per-case errors of both kinds of time, before and after.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
from pathlib import Path
from typing import Optional, Union

from attn_core.core.files import write_atomic
from attn_core.device.spec import DeviceSpec
from attn_sim.cost import op_launch_shape, pipelined
from attn_sim.measurements import (  # noqa: F401 (parse_* re-exported: the bench reads them here)
    Timing,
    parse_measurements,
    parse_timings,
    read_timings,
)
from attn_sim.occupancy import blocks_per_sm, waves
from attn_sim.profiles import CALIBRATABLE, DEVICE_TERMS, HOST_TERMS, save_profile
from attn_sim.workloads import Case, base_name, trace_case

MODES = ("eager", "graph")
EAGER_ONLY_TERMS = ("hbm_bandwidth", "fp16_flops", "fp32_flops", "launch_overhead_s")
# Bounds, as factors of the profile's value: throughputs at most the profile's (a datasheet peak
# or a measured copy rate; bandwidth gets 25 % above it for a profile whose number is a copy),
# at least 1/100 of it. Latencies anywhere in [10 ns, 1 ms].
UPPER = {"hbm_bandwidth": 1.25, "fp16_flops": 1.0, "fp32_flops": 1.0}
LATENCY_BOUNDS = (1e-8, 1e-3)
RIDGE = 1e-3  # pull per term, on log(value / profile value)^2; a 10 % case error costs 1e-2


@dataclasses.dataclass
class _Launch:
    nbytes: int
    flops: int
    half: bool  # tensor-core rate (fp16/bf16 matmul) or the fp32 one
    efficiency: float  # slot quantisation (compute-bound)
    memory_efficiency: float  # SM quantisation (bandwidth-bound)


def launches_of(spec: DeviceSpec, case: Case) -> list[_Launch]:
    record, _ = trace_case(spec, case)
    out = []
    for op in record.kernels():
        blocks, threads, regs, smem = op_launch_shape(op)
        occ = blocks_per_sm(spec, threads, regs, min(smem, spec.shared_mem_per_block))
        w = waves(spec, blocks, max(occ.blocks_per_sm, 1))
        half = op.cost.half_inputs
        out.append(
            _Launch(
                op.cost.bytes_read + op.cost.bytes_written,
                op.cost.flops,
                half,
                w.efficiency,
                w.memory_efficiency,
            )
        )
    return out


def predict(launches: list[_Launch], params: dict, mode: str = "eager") -> float:
    """The cost model's step time with these constants: ``eager`` (host issue pipelined with
    the device, :attr:`StepCost.time_s`) or ``graph`` (device only, ``graph_time_s``)."""
    gap = params.get("launch_gap_s", 0.0)
    runs = []
    for ln in launches:
        rate = params["fp16_flops"] if ln.half else params["fp32_flops"]
        memory = ln.nbytes / params["hbm_bandwidth"] / ln.memory_efficiency
        runs.append(max(memory, ln.flops / rate / ln.efficiency) + gap)
    if mode == "graph":
        return sum(runs)
    return pipelined(runs, [params["launch_overhead_s"]] * len(runs))


def _bounds(key: str, start: float) -> tuple[float, float]:
    if key in UPPER:
        return math.log(start / 100), math.log(start * UPPER[key])
    return tuple(math.log(b) for b in LATENCY_BOUNDS)  # type: ignore[return-value]


def fit(
    samples: list[tuple[list[_Launch], float]],
    start: dict,
    keys: tuple[str, ...] = EAGER_ONLY_TERMS,
    mode: str = "eager",
) -> dict:
    """``start`` with ``keys`` moved to minimise the squared log error over ``samples``
    (bounded Nelder-Mead in log space, plus :data:`RIDGE` towards ``start``)."""
    from scipy.optimize import minimize

    x0 = [math.log(max(start[k], LATENCY_BOUNDS[0])) for k in keys]
    bounds = [_bounds(k, start[k]) for k in keys]
    x0 = [min(max(x, lo), hi) for x, (lo, hi) in zip(x0, bounds, strict=True)]

    def params_of(x) -> dict:
        return {**start, **{k: math.exp(v) for k, v in zip(keys, x, strict=True)}}

    def loss(x) -> float:
        params = params_of(x)
        data = sum(math.log(predict(ls, params, mode) / m) ** 2 for ls, m in samples)
        pull = sum((v - x0v) ** 2 for v, x0v in zip(x, x0, strict=True))
        return data + RIDGE * pull

    best = minimize(
        loss,
        x0,
        method="Nelder-Mead",
        bounds=bounds,
        options={"maxiter": 4000, "xatol": 1e-4, "fatol": 1e-9},
    )
    out = params_of(best.x)
    for k in keys:  # exp(log(x)) may land an ulp past a bound
        if k in UPPER:
            out[k] = min(max(out[k], start[k] / 100), start[k] * UPPER[k])
    return out


def fit_half(timings: list[Timing]) -> list[int]:
    """Indices of the fit cases: every other case of each (path, forced tier) group in order, so
    each tier a file measured (decode_bench replays both) lands in both halves."""
    seen: dict[tuple, int] = {}
    out = []
    for i, t in enumerate(timings):
        key = (t.case.path, t.case.tier)
        if seen.get(key, 0) % 2 == 0:
            out.append(i)
        seen[key] = seen.get(key, 0) + 1
    return out


def _timings(measurements) -> list[Timing]:
    out = []
    for m in measurements:
        out.append(m if isinstance(m, Timing) else Timing(m[0], eager_s=float(m[1])))
    return out


def calibrate(
    spec: DeviceSpec,
    measurements: list[Union[Timing, tuple[Case, float]]],
    source: str,
) -> tuple[DeviceSpec, list[dict], dict]:
    """Fit on the even cases; returns ``(calibrated spec, per-case rows, provenance)``.

    ``measurements``: :class:`Timing` values, or ``(case, eager seconds)`` pairs. With at least
    two graph times among the fit cases the device terms are fitted on graph times and then the
    host term on eager times; otherwise everything but ``launch_gap_s`` on eager times.
    ``provenance`` holds an entry for each fitted term only.
    """
    timings = _timings(measurements)
    if len(timings) < 2:
        raise ValueError(f"measurements must hold at least 2 usable cases, got {len(timings)}")
    traced = [launches_of(spec, t.case) for t in timings]
    train = set(fit_half(timings))

    def samples(mode: str) -> list[tuple[list[_Launch], float]]:
        return [(traced[i], timings[i].time(mode)) for i in train if timings[i].time(mode)]

    start = {k: getattr(spec, k) for k in CALIBRATABLE}
    graph_fit, eager_fit = samples("graph"), samples("eager")
    when = datetime.date.today().isoformat()
    prov = {}
    if len(graph_fit) >= 2:
        fitted = fit(graph_fit, start, DEVICE_TERMS, "graph")
        note = f"CUDA-graph replay times ({len(graph_fit)} fit cases)"
        prov.update({k: note for k in DEVICE_TERMS})
        if eager_fit:
            fitted = fit(eager_fit, fitted, HOST_TERMS, "eager")
            note = f"eager times, device terms held ({len(eager_fit)} fit cases)"
            prov.update({k: note for k in HOST_TERMS})
    elif eager_fit:
        fitted = fit(eager_fit, start, EAGER_ONLY_TERMS, "eager")
        note = f"eager times only ({len(eager_fit)} fit cases)"
        prov.update({k: note for k in EAGER_ONLY_TERMS})
    else:
        raise ValueError("measurements must hold a time for at least one fit case")
    prov = {
        k: f"measured: calibrated from {source}, {v}, {when}; {getattr(spec, k):.4g} before"
        for k, v in prov.items()
    }
    rows = []
    for i, (t, ls) in enumerate(zip(timings, traced, strict=True)):
        row: dict = {
            "case": t.case.label() + (f" {t.case.tier}" if t.case.tier else ""),
            "split": "fit" if i in train else "validate",
            "traced_launches": len(ls),
            "device_launches": t.device_launches,
        }
        for mode in MODES:
            measured = t.time(mode)
            before, after = predict(ls, start, mode), predict(ls, fitted, mode)
            row[f"{mode}_measured_ms"] = measured * 1e3 if measured else None
            row[f"{mode}_uncalibrated_ms"] = before * 1e3
            row[f"{mode}_calibrated_ms"] = after * 1e3
            for tag, value in (("uncalibrated", before), ("calibrated", after)):
                err = 100 * (value - measured) / measured if measured else None
                row[f"{mode}_{tag}_err_pct"] = err
        rows.append(row)
    name = f"{base_name(spec)}+calibrated"
    calibrated = dataclasses.replace(spec, name=name, **{k: fitted[k] for k in CALIBRATABLE})
    return calibrated, rows, prov


def summary(rows: list[dict]) -> dict:
    """Max and median |error| per split, kind of time, before/after; ``None`` where no case."""
    out = {}
    for split in ("fit", "validate"):
        sel = [r for r in rows if r["split"] == split]
        for mode in MODES:
            for tag in ("uncalibrated", "calibrated"):
                col = f"{mode}_{tag}_err_pct"
                errs = sorted(abs(r[col]) for r in sel if r.get(col) is not None)
                out[f"{split}_{col}_max"] = errs[-1] if errs else None
                out[f"{split}_{col}_median"] = errs[len(errs) // 2] if errs else None
            out[f"{split}_{mode}_cases"] = sum(1 for r in sel if r.get(f"{mode}_measured_ms"))
    return out


def compact_rows(rows: list[dict]) -> list[dict]:
    """The per-case table to print: measured ms and error % after (and before) calibration."""

    def err(r: dict, mode: str) -> Optional[str]:
        after, before = r[f"{mode}_calibrated_err_pct"], r[f"{mode}_uncalibrated_err_pct"]
        return None if after is None else f"{after:+.1f} ({before:+.1f})"

    out = []
    for r in rows:
        out.append(
            {
                "case": r["case"],
                "split": r["split"],
                "launches traced/device": f"{r['traced_launches']}/{r['device_launches'] or '-'}",
                "eager_ms": r["eager_measured_ms"],
                "eager_err_% (uncal.)": err(r, "eager"),
                "graph_ms": r["graph_measured_ms"],
                "graph_err_% (uncal.)": err(r, "graph"),
            }
        )
    return out


def verdicts(result: dict, tolerance_pct: float) -> list[str]:
    """One line per kind of time measured: held-out max |error| after and before, PASS/FAIL."""
    s = result["summary"]
    lines = []
    for mode in MODES:
        worst = s.get(f"validate_{mode}_calibrated_err_pct_max")
        if worst is None:
            continue
        before = s[f"validate_{mode}_uncalibrated_err_pct_max"]
        verdict = "PASS" if worst <= tolerance_pct else "FAIL"
        lines.append(
            f"{mode}: validation half ({s[f'validate_{mode}_cases']} cases) max |error| "
            f"{worst:.1f}% calibrated ({before:.1f}% uncalibrated); +-{tolerance_pct:.0f}%: "
            f"{verdict}"
        )
    return lines


def launch_warnings(rows: list[dict], tolerance: float = 0.25) -> list[str]:
    """Cases whose measured kernel count is off the traced one by more than ``tolerance``: the
    measurements were probably made on other code than the tree traced here (the profiler also
    counts memsets and copies, ~10 % more on GPU run 1), and the fit would absorb the gap."""
    out = []
    for r in rows:
        traced, device = r["traced_launches"], r["device_launches"]
        if device and abs(device - traced) > tolerance * traced:
            out.append(f"{r['case']}: {device} kernels measured, {traced} traced")
    if out:
        out.insert(0, "warning: measured and traced launches differ (other code measured?):")
    return out


def run(spec: DeviceSpec, measurement_file: Path, out: Path, variant: Optional[str]) -> dict:
    """Calibrate ``spec`` on the file; writes ``out/calibrated_profile.json`` (a profile file
    over the built-in base) and ``out/calibration.json``."""
    timings = read_timings(Path(measurement_file), variant)
    try:
        calibrated, rows, prov = calibrate(spec, timings, str(measurement_file))
    except ValueError as err:
        raise ValueError(f"measurements file {measurement_file}: {err}") from None
    profile_path = save_profile(calibrated, base_name(spec), out / "calibrated_profile.json", prov)
    result = {
        "profile": str(profile_path),
        "fitted_terms": sorted(prov),
        "fields": {k: getattr(calibrated, k) for k in CALIBRATABLE},
        "before": {k: getattr(spec, k) for k in CALIBRATABLE},
        "provenance": prov,
        "rows": rows,
        "summary": summary(rows),
    }
    write_atomic(out / "calibration.json", json.dumps(result, indent=1))
    return result
