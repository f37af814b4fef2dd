"""``python -m attn_sim sweep``: plan constants that minimise predicted time, per profile.

Three sweeps:

- attn-core's decode plan, traced: each of ``ATTN_CORE_DECODE_PARTITION_SIZE``,
  ``ATTN_CORE_DECODE_SUBSCRIPTION`` and ``ATTN_CORE_DECODE_SINGLE_TILE_MAX`` is varied alone
  (the others at attn-core's defaults) over decode cases at 8K-256K, batches 1/8/64; score = the
  geometric mean of predicted step time relative to the defaults. A value whose chosen plan
  does not fit shared memory is ruled out.
- the GQA-gridded kernel design, analytic: partition size x K/V tile tokens, the fastest design
  that fits the profile's shared-memory budget (what a device kernel should be built with).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from attn_core.core.settings import ENV_VARS, DecodeOverrides, PrefillOverrides
from attn_core.device.spec import DeviceSpec
from attn_sim.cost import design_cost
from attn_sim.designs import QWEN36, evaluate, gqa_partitioned
from attn_sim.simulate import simulate
from attn_sim.workloads import Case

K = 1024
SWEEP_CASES = [Case("decode", b, c) for b in (1, 8) for c in (8 * K, 32 * K, 100 * K, 256 * K)]
SWEEP_CASES.append(Case("decode", 64, 8 * K))
# Labelled by the environment variable a user would set; swept as DecodeOverrides fields.
CANDIDATES: dict[str, list[Optional[int]]] = {
    "ATTN_CORE_DECODE_PARTITION_SIZE": [None, 256, 512, 1024, 2048, 4096],
    "ATTN_CORE_DECODE_SUBSCRIPTION": [None, 1, 2, 4, 8],
    "ATTN_CORE_DECODE_SINGLE_TILE_MAX": [None, 512, 1024, 2048, 4096],
}
_OVERRIDE = {v.name: v.attr for v in ENV_VARS if v.section == "decode"}
DESIGN_PARTITIONS = (256, 512, 1024, 2048, 4096)
DESIGN_TILES = (8, 16, 32, 64)


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def sweep_plan(spec: DeviceSpec, cases: Optional[list[Case]] = None) -> list[dict]:
    """One row per (constant, value): relative time, fits, and whether it is the best."""
    cases = cases or SWEEP_CASES
    default = [simulate(spec, c).time_s for c in cases]
    rows = []
    for name, values in CANDIDATES.items():
        group = []
        for value in values:
            try:
                forced = DecodeOverrides(**{_OVERRIDE[name]: value})
                results = [simulate(spec, dataclasses.replace(c, decode=forced)) for c in cases]
            except ValueError as err:  # attn-core refused the value for some case
                group.append({"constant": name, "value": value, "error": str(err)[:80]})
                continue
            rel = _geomean([r.time_s / d for r, d in zip(results, default, strict=True)])
            at_100k = [r.time_s for r in results if r.label == "decode b1 ctx102400"]
            group.append(
                {
                    "constant": name,
                    "value": "default" if value is None else value,
                    "relative_time": round(rel, 4),
                    "fits": all(r.plan_fits for r in results),
                    "time_ms_b1_100k": round(at_100k[0] * 1e3, 3) if at_100k else None,
                }
            )
        ok = [g for g in group if g.get("fits")]
        best = min(ok, key=lambda g: g["relative_time"]) if ok else None
        for g in group:
            g["best"] = g is best
        rows += group
    return rows


def sweep_design(spec: DeviceSpec, num_seqs: int = 1, context: int = 100 * K) -> list[dict]:
    rows = []
    for ps in DESIGN_PARTITIONS:
        for tile in DESIGN_TILES:
            designs = gqa_partitioned(
                spec, QWEN36, num_seqs, context, partition_size=ps, tile_tokens=tile
            )
            fits = all(evaluate(spec, d).fits for d in designs)
            t = sum(design_cost(spec, d).time_s for d in designs) if fits else None
            rows.append(
                {
                    "partition": ps,
                    "tile_tokens": tile,
                    "smem": designs[0].smem,
                    "blocks": designs[0].blocks,
                    "fits": fits,
                    "time_us": round(t * 1e6, 1) if t else None,
                }
            )
    ok = [r for r in rows if r["fits"]]
    best = min(ok, key=lambda r: r["time_us"]) if ok else None
    for r in rows:
        r["best"] = r is best
    return rows


PREFILL_CASES = [Case("prefill", 1, c, query_len=2048) for c in (32 * K, 100 * K)]
PREFILL_KEY_TILES = (1024, 2048, 4096, 8192, 16384)
PREFILL_QUERY_TILES = (None, 512, 1024)  # None: the plan's own (largest under the budget)


def sweep_prefill(spec: DeviceSpec, cases: Optional[list[Case]] = None) -> list[dict]:
    """attn-core's torch prefill with forced (query tile, key tile), traced.

    The tiles are the cases' ``PrefillOverrides`` (``query_tile`` / ``key_tile``); a pair is
    ruled out if any case's transient memory exceeds K+V plus the prefill budget
    (``gates.toml``) or a launch does not fit.
    """
    from attn_sim.config import load_gates

    torch_backend = PrefillOverrides(backend="torch")  # NVIDIA profiles' auto plan is sdpa
    cases = [dataclasses.replace(c, prefill=torch_backend) for c in cases or PREFILL_CASES]
    over = load_gates()["prefill"]["transient_over_kv_bytes"]
    default = [simulate(spec, c).time_s for c in cases]
    rows = []
    for key_tile in PREFILL_KEY_TILES:
        for query_tile in PREFILL_QUERY_TILES:
            forced = PrefillOverrides(backend="torch", key_tile=key_tile, query_tile=query_tile)
            try:
                results = [simulate(spec, dataclasses.replace(c, prefill=forced)) for c in cases]
            except ValueError as err:  # the plan refused the pair (over its budget)
                rows.append(
                    {"key_tile": key_tile, "query_tile": query_tile, "error": str(err)[:60]}
                )
                continue
            ok = all(r.plan_fits and r.transient_bytes <= r.kv_bytes + over for r in results)
            rel = _geomean([r.time_s / d for r, d in zip(results, default, strict=True)])
            rows.append(
                {
                    "key_tile": key_tile,
                    "query_tile": query_tile or "plan",
                    "relative_time": round(rel, 4),
                    "launches": max(r.launches for r in results),
                    "transient_MB": round(max(r.transient_bytes for r in results) / 1e6, 1),
                    "fits": ok,
                }
            )
    ok_rows = [r for r in rows if r.get("fits")]
    best = min(ok_rows, key=lambda r: r["relative_time"]) if ok_rows else None
    for r in rows:
        r["best"] = r is best
    return rows
