"""``python -m attn_sim calibrate``: fit bandwidth, rates and launch overhead to measurements.

Input: a JSON file of measured steps. Accepted shapes: a list of records, or an object holding
one under ``records`` / ``results`` / ``rows``. A record is either ``{"case": {...},
"measured_s": t}`` or flat; field names of the decode bench and of the HIL long-context suite
are both read: path (``path`` | ``kind``), batch (``num_seqs`` | ``batch``), context
(``context`` | ``context_len`` | ``seq_len``; for prefill ``context`` counts the new tokens,
the HIL suite's ``context_len`` only the cached prefix), ``query_len``, shape (``num_heads``,
``num_kv_heads``, ``head_size``, ``block_size``, default Qwen3.6), ``dtype``, and the time
(``measured_s`` | ``median_s`` | ``time_s`` | ``median_ms``). Records carrying a ``variant``
are kept only when it names attn-core (or matches ``--variant``).

Cases are sorted and split alternately: even ones fit the four constants (least squares on
``log(predicted / measured)``; the traces are made once, only the constants move), odd ones
validate. Writes the calibrated profile JSON and prints per-case errors before and after.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
from pathlib import Path
from typing import Optional

from attn_core.device_spec import DeviceSpec
from attn_sim.cost import op_launch_shape, pipelined
from attn_sim.designs import Shape
from attn_sim.occupancy import blocks_per_sm, waves
from attn_sim.profiles import CALIBRATABLE, save_profile
from attn_sim.workloads import Case, base_name, trace_case

TIME_KEYS = (
    ("measured_s", 1.0),
    ("median_s", 1.0),
    ("time_s", 1.0),
    ("median_ms", 1e-3),
    ("ms", 1e-3),  # bench/decode_bench.py rows
)
# Variant names that mean "attn-core's default plan" (decode_bench also times forced tiers,
# partition sizes and baselines under other names; those are not what the sim predicts).
DEFAULT_VARIANTS = ("attn_core plan", "attn_core", "attn-core", "paged_decode")
# decode_bench.py keeps the shape once, at the top level, under these names
SHAPE_ALIASES = {"heads": "num_heads", "kv_heads": "num_kv_heads"}


def _first(record: dict, *keys, default=None):
    for k in keys:
        if k in record and record[k] is not None:
            return record[k]
    return default


def parse_measurements(data, variant: Optional[str] = None) -> list[tuple[Case, float]]:
    """``(case, measured seconds)`` pairs from any accepted file shape.

    ``variant``: keep only records of that exact variant name (default: attn-core's default
    plan, :data:`DEFAULT_VARIANTS`); records without a variant are always kept.
    """
    shared: dict = {}
    if isinstance(data, dict):
        top = data.get("shape") if isinstance(data.get("shape"), dict) else {}
        shared = {SHAPE_ALIASES.get(k, k): v for k, v in top.items()}
        data = _first(data, "records", "results", "rows", default=[])
    wanted = (variant,) if variant else DEFAULT_VARIANTS
    out = []
    for raw in data:
        case_part = raw.get("case") if isinstance(raw.get("case"), dict) else {}
        rec = {**shared, **raw, **case_part}
        name = rec.get("variant") or rec.get("impl")
        if name is not None and str(name) not in wanted:
            continue
        seconds = next((rec[k] * f for k, f in TIME_KEYS if rec.get(k) is not None), None)
        context = _first(rec, "context", "context_len", "seq_len")
        if seconds is None or context is None or rec.get("skipped"):
            continue
        path = str(_first(rec, "path", "kind", default="decode"))
        query_len = int(_first(rec, "query_len", default=1))
        if path == "prefill" and "context" not in rec and "context_len" in rec:
            context += query_len  # the HIL suite's context_len is the cached prefix only
        shape = Shape(
            num_heads=int(_first(rec, "num_heads", default=24)),
            num_kv_heads=int(_first(rec, "num_kv_heads", default=4)),
            head_size=int(_first(rec, "head_size", default=256)),
            block_size=int(_first(rec, "block_size", default=16)),
        )
        dtype = str(_first(rec, "dtype", default="float16")).replace("torch.", "")
        case = Case(
            path=path,
            num_seqs=int(_first(rec, "num_seqs", "batch", default=1)),
            context=int(context),
            shape=shape,
            dtype=dtype,
            query_len=query_len,
        )
        out.append((case, float(seconds)))
    return sorted(out, key=lambda cm: (cm[0].path, cm[0].num_seqs, cm[0].context))


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


def predict(launches: list[_Launch], params: dict) -> float:
    """The cost model's pipelined step time with these constants."""
    runs = []
    for ln in launches:
        rate = params["fp16_flops"] if ln.half else params["fp32_flops"]
        memory = ln.nbytes / params["hbm_bandwidth"] / ln.memory_efficiency
        runs.append(max(memory, ln.flops / rate / ln.efficiency))
    return pipelined(runs, [params["launch_overhead_s"]] * len(runs))


def fit(samples: list[tuple[list[_Launch], float]], start: dict) -> dict:
    """Constants minimising the squared log error over ``samples`` (scipy's Nelder-Mead)."""
    from scipy.optimize import minimize

    keys = list(CALIBRATABLE)
    x0 = [math.log(start[k]) for k in keys]

    def loss(x) -> float:
        params = {k: math.exp(v) for k, v in zip(keys, x, strict=True)}
        return sum(math.log(predict(ls, params) / m) ** 2 for ls, m in samples)

    best = minimize(loss, x0, method="Nelder-Mead", options={"maxiter": 4000, "xatol": 1e-4})
    return {k: math.exp(v) for k, v in zip(keys, best.x, strict=True)}


def calibrate(
    spec: DeviceSpec, measurements: list[tuple[Case, float]], source: str
) -> tuple[DeviceSpec, list[dict], dict]:
    """Fit on the even cases; returns ``(calibrated spec, per-case rows, provenance)``."""
    if len(measurements) < 2:
        raise ValueError(f"measurements must hold at least 2 usable cases, got {len(measurements)}")
    traced = [(launches_of(spec, c), m) for c, m in measurements]
    train = [t for i, t in enumerate(traced) if i % 2 == 0]
    start = {k: getattr(spec, k) for k in CALIBRATABLE}
    fitted = fit(train, start)
    rows = []
    for i, ((case, measured), (ls, _)) in enumerate(zip(measurements, traced, strict=True)):
        before, after = predict(ls, start), predict(ls, fitted)
        rows.append(
            {
                "case": case.label(),
                "split": "fit" if i % 2 == 0 else "validate",
                "measured_ms": measured * 1e3,
                "uncalibrated_ms": before * 1e3,
                "uncalibrated_err_pct": 100 * (before - measured) / measured,
                "calibrated_ms": after * 1e3,
                "calibrated_err_pct": 100 * (after - measured) / measured,
            }
        )
    when = datetime.date.today().isoformat()
    prov = {
        k: f"measured: calibrated from {source} ({len(train)} fit cases, {when}); "
        f"{getattr(spec, k):.4g} before"
        for k in CALIBRATABLE
    }
    name = f"{base_name(spec)}+calibrated"
    calibrated = dataclasses.replace(spec, name=name, **fitted)
    return calibrated, rows, prov


def summary(rows: list[dict]) -> dict:
    out = {}
    for split in ("fit", "validate"):
        sel = [r for r in rows if r["split"] == split]
        for col in ("uncalibrated_err_pct", "calibrated_err_pct"):
            errs = sorted(abs(r[col]) for r in sel)
            out[f"{split}_{col}_max"] = errs[-1] if errs else None
            out[f"{split}_{col}_median"] = errs[len(errs) // 2] if errs else None
    return out


def run(spec: DeviceSpec, measurement_file: Path, out: Path, variant: Optional[str]) -> dict:
    data = json.loads(Path(measurement_file).read_text())
    pairs = parse_measurements(data, variant)
    calibrated, rows, prov = calibrate(spec, pairs, str(measurement_file))
    profile_path = save_profile(calibrated, base_name(spec), out / "calibrated_profile.json", prov)
    result = {
        "profile": str(profile_path),
        "fields": {k: getattr(calibrated, k) for k in CALIBRATABLE},
        "before": {k: getattr(spec, k) for k in CALIBRATABLE},
        "rows": rows,
        "summary": summary(rows),
    }
    (out / "calibration.json").write_text(json.dumps(result, indent=1))
    return result
