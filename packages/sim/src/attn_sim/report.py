"""``python -m attn_sim report``: tables, a plot and a JSON of the simulated device.

For one profile (default ``bi-v100``) and the Qwen3.6 shape (24/4 heads, head 256, fp16,
block 16):

- the assumptions used (every profile constant with its provenance);
- kernel designs per context: vLLM's V1 / V2, the GQA-gridded partition + reduce, the
  single-pass look-back variant and attn-core's planned steps: blocks, blocks per SM and what
  limits it, waves and tail, shared memory against the budget, analytic time;
- decode and prefill as traced from attn-core, contexts 1K..1M, batches 1..64: tier and
  partitions (decode), backend and tiles (prefill), launches, bytes, FLOPs, waves, shared memory
  vs budget, predicted time, transient memory and whether K+V + transient fit the device;
- attention time per full-attention layer to prefill a whole 32K / 128K / 256K prompt in 2K /
  8K chunks on bi-v100 and h200, torch path vs the native kernel (:mod:`attn_sim.prefill_ttft`,
  attn-core's own plans and cost function), with the rates behind it;
- attention time of one request on the hybrid model (Qwen3.5-MoE class, 30 Gated DeltaNet + 10
  full-attention layers): prefill and one decode step per path (:mod:`attn_sim.hybrid_request`).

Writes ``report.md`` (:mod:`attn_sim.report_text`), ``report.json`` and ``report.png``
(:mod:`attn_sim.report_plot`) into the output directory.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import torch

from attn_core.core.files import write_atomic
from attn_core.core.shapes import AttentionShape
from attn_core.device.spec import DeviceSpec
from attn_sim.cost import design_cost
from attn_sim.designs import (
    QWEN36,
    design_families,
    evaluate,
    from_steps,
    gqa_partitioned,
    plan_designs,
    shape_json,
    vllm_v1,
    vllm_v2,
)
from attn_sim.hybrid_request import HybridModel, linear_layer_rows, provenance_rows, request_rows
from attn_sim.native_design import native_rows
from attn_sim.prefill_ttft import PROFILES as TTFT_PROFILES
from attn_sim.prefill_ttft import rate_rows, ttft_rows
from attn_sim.profiles import load_profile
from attn_sim.report_plot import plot
from attn_sim.report_text import headline, markdown, shape_text  # noqa: F401 (the CLI's)
from attn_sim.simulate import CaseResult, simulate
from attn_sim.workloads import Case, plan_for, sim_capabilities

K = 1024
DECODE_CONTEXTS = (1 * K, 4 * K, 8 * K, 32 * K, 100 * K, 256 * K, 1024 * K)
DECODE_BATCHES = (1, 4, 16, 64)
PREFILL_CASES = [(b, c) for b in (1, 4) for c in (4 * K, 32 * K, 100 * K, 256 * K)] + [
    (1, 1024 * K)
]
PREFILL_CHUNK = 2048
DESIGN_CONTEXTS = (1 * K, 8 * K, 12 * K, 32 * K, 100 * K, 256 * K, 1024 * K)
ASSUMPTION_FIELDS = (
    "sm_count",
    "warp_size",
    "shared_mem_per_block",
    "shared_mem_per_sm",
    "max_blocks_per_sm",
    "registers_per_sm",
    "hbm_bandwidth",
    "fp16_flops",
    "fp32_flops",
    "launch_overhead_s",
    "launch_gap_s",
    "dependent_launch_gap_s",
    "memory_bytes",
)


def assumptions(spec: DeviceSpec) -> list[dict]:
    return [
        {"constant": f, "value": getattr(spec, f), "provenance": spec.provenance.get(f, "?")}
        for f in ASSUMPTION_FIELDS
    ]


def design_rows(spec: DeviceSpec, shape: AttentionShape = QWEN36, num_seqs: int = 1) -> list[dict]:
    rows = []
    for ctx in DESIGN_CONTEXTS:
        families = design_families(spec, shape, num_seqs, ctx)
        plan = plan_for(spec, Case("decode", num_seqs, ctx, shape))
        families[f"attn-core plan ({plan.tier})"] = plan_designs(plan)
        for family, designs in families.items():
            for d in designs:
                judged = evaluate(spec, d)
                cost = design_cost(spec, d) if d.kv_bytes_read or d.other_bytes else None
                rows.append(
                    {
                        "context": ctx,
                        "family": family,
                        "kernel": d.name,
                        "grid": "x".join(map(str, d.grid)),
                        "blocks": d.blocks,
                        "blocks_per_sm": judged.occupancy.blocks_per_sm,
                        "limiter": judged.occupancy.limiter,
                        "waves": judged.waves.waves if judged.waves else None,
                        "tail": round(judged.waves.tail_utilisation, 3) if judged.waves else None,
                        "smem": d.smem,
                        "budget": spec.shared_mem_per_block,
                        "fits": judged.fits,
                        "time_us": round(cost.time_s * 1e6, 1) if cost and judged.fits else None,
                    }
                )
    return rows


def longest_fitting_context(spec: DeviceSpec, build, bs: int, limit: int = 1 << 24) -> int:
    """Largest context (a multiple of ``bs``) whose designs all fit; 0 if none."""

    def ok(ctx: int) -> bool:
        return all(evaluate(spec, d).fits for d in build(spec, ctx))

    if not ok(bs):
        return 0
    lo, hi = 1, limit // bs  # in blocks: ok(lo) holds
    if ok(hi * bs):
        return hi * bs
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid * bs) else (lo, mid)
    return lo * bs


def budget_rows(spec: DeviceSpec, shape: AttentionShape = QWEN36) -> list[dict]:
    """Per design family: the longest context at batch 1 whose launches fit the budget."""
    builders = {
        "vllm_v1": lambda sp, c: [vllm_v1(sp, shape, 1, c)],
        "vllm_v2": lambda sp, c: vllm_v2(sp, shape, 1, c),
        "gqa_partitioned (tile 32)": lambda sp, c: gqa_partitioned(sp, shape, 1, c),
        "gqa_partitioned (tile 16)": lambda sp, c: gqa_partitioned(sp, shape, 1, c, tile_tokens=16),
        "attn-core plan": lambda sp, c: from_steps(plan_for(sp, Case("decode", 1, c, shape)).steps),
    }
    rows = []
    for name, build in builders.items():
        longest = longest_fitting_context(spec, build, shape.block_size)
        rows.append(
            {
                "design": name,
                "budget_bytes": spec.shared_mem_per_block,
                "longest_fitting_context": longest if longest < 1 << 24 else ">= 16M",
            }
        )
    return rows


def traced_cases(shape: AttentionShape = QWEN36) -> list[Case]:
    cases = [Case("decode", b, c, shape) for c in DECODE_CONTEXTS for b in DECODE_BATCHES]
    cases += [Case("prefill", b, c, shape, query_len=PREFILL_CHUNK) for b, c in PREFILL_CASES]
    return cases


def memory_columns(r: CaseResult, spec: DeviceSpec) -> dict:
    """K+V of the context plus the step's transient memory, against the device's memory."""
    need = r.kv_bytes + r.transient_bytes
    fits = need <= spec.memory_bytes
    return {
        "cache_fits_device": r.cache_fits_device,
        "kv+transient_GB": round(need / 1e9, 2),
        "step_fits_device": fits,
        "device_memory": "ok"
        if fits
        else f"OVER {need / 1e9:.1f} > {spec.memory_bytes / 1e9:.1f} GB",
    }


def cost_columns(r: CaseResult, spec: DeviceSpec) -> dict:
    """What a step moves, computes, needs on chip and costs in time and memory: the columns
    a decode row and a prefill row share, in the report's order."""
    return {
        "GB": round(r.bytes / 1e9, 3),
        "GFLOP": round(r.flops / 1e9, 2),
        "max_waves": r.max_waves,
        "smem/budget": f"{r.smem_max}/{r.smem_budget}",
        "fits": r.plan_fits,
        "time_ms": round(r.time_s * 1e3, 3),
        "graph_ms": round(r.graph_time_s * 1e3, 3),
        "transient_MB": round(r.transient_bytes / 1e6, 1),
        "kv_MB": round(r.kv_bytes / 1e6, 1),
        **memory_columns(r, spec),
    }


def result_row(r: CaseResult, spec: DeviceSpec) -> dict:
    """One decode step as the report's table shows it."""
    return {
        "batch": r.num_seqs,
        "context": r.context,
        "tier": r.tier,
        "partitions": r.partitions,
        "launches": r.launches,
        "plan_launches": r.plan_launches,
        **cost_columns(r, spec),
    }


def prefill_row(r: CaseResult, case: Case, spec: DeviceSpec) -> dict:
    """One prefill call: the plan's backend and tiles instead of decode's tier / partitions."""
    plan = plan_for(spec, case)
    cached = case.context - case.query_len
    return {
        "batch": r.num_seqs,
        "context": r.context,
        "new_tokens": case.query_len,
        "backend": plan.backend,
        "query_tile": plan.query_tile,
        "key_tile": plan.key_tile,
        "stream_chunk": plan.stream_chunk,
        "tile_updates": plan.num_tile_updates(case.query_len, cached),
        "launches": r.launches,
        "plan_steps": r.plan_launches,
        **cost_columns(r, spec),
    }


def build(spec: DeviceSpec, shape: AttentionShape = QWEN36) -> dict:
    start = time.perf_counter()
    cases = traced_cases(shape)
    results = [simulate(spec, c) for c in cases]
    decode = [result_row(r, spec) for r in results if r.path == "decode"]
    traced = {(r.num_seqs, r.context): r for r in results if r.path == "decode"}

    def torch_graph_ms(batch: int, ctx: int) -> float:
        r = traced.get((batch, ctx)) or simulate(spec, Case("decode", batch, ctx, shape))
        return round(r.graph_time_s * 1e3, 3)

    prefill = [
        prefill_row(r, c, spec) for r, c in zip(results, cases, strict=True) if r.path == "prefill"
    ]
    return {
        "profile": spec.name,
        "shape": shape_json(shape),
        "assumptions": assumptions(spec),
        "bmm_out_dtype": sim_capabilities(spec, torch.float16).bmm_writes_fp32,
        "memory_bytes": spec.memory_bytes,
        "prefill_chunk": PREFILL_CHUNK,
        "native": native_rows(spec, shape, torch_graph_ms),
        "designs": design_rows(spec, shape),
        "budget": budget_rows(spec, shape),
        "results": [r.to_json() for r in results],
        "decode": decode,
        "prefill": prefill,
        "prefill_ttft": ttft_rows(shape, _ttft_specs(spec)),
        "prefill_rates": rate_rows(_ttft_specs(spec)),
        **hybrid_tables(_ttft_specs(spec)),
        "over_device_memory": [
            r.label for r in results if r.kv_bytes + r.transient_bytes > spec.memory_bytes
        ],
        "elapsed_s": time.perf_counter() - start,
    }


def hybrid_tables(specs: list[DeviceSpec], config: Optional[dict] = None) -> dict:
    """The hybrid model's request table and its linear layer's prices
    (:mod:`attn_sim.hybrid_request`)."""
    model = HybridModel.from_config(config)
    return {
        "hybrid_request": [row for sp in specs for row in request_rows(sp, model)],
        "linear_layer": [row for sp in specs for row in linear_layer_rows(sp, model.linear)],
        "linear_constants": provenance_rows(),
    }


def _ttft_specs(spec: DeviceSpec) -> list[DeviceSpec]:
    """bi-v100 and h200 always (the issue's comparison), and the report's own profile."""
    specs = [load_profile(name) for name in TTFT_PROFILES]
    return specs if spec.name in TTFT_PROFILES else [*specs, spec]


# Heads per rank: the largest published models have 128; the report's work grows with the
# heads (99,999,999 of them ran for more than ten minutes), so the bound is checked first.
MAX_HEADS = 1024


def parse_shape(text: str) -> AttentionShape:
    """``"24,4,256"`` or ``"24,4,256,16"`` (heads, KV heads, head size[, block size]), checked as
    :class:`attn_core.core.shapes.AttentionShape` checks a shape (fp16): a ``ValueError`` naming the
    part that is wrong."""
    parts = text.split(",")
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        numbers = []
    if len(parts) not in (3, 4) or len(numbers) != len(parts):
        raise ValueError(
            f"shape must be 'heads,kv_heads,head_size[,block_size]' (integers), got {text!r}"
        )
    if numbers[0] > MAX_HEADS or numbers[1] > MAX_HEADS:
        raise ValueError(
            f"shape {text!r}: heads and kv_heads must be <= {MAX_HEADS}, got "
            f"{numbers[0]} and {numbers[1]}"
        )
    try:
        AttentionShape(*numbers)
    except ValueError as err:
        raise ValueError(f"shape {text!r}: {err}") from None
    return AttentionShape(*numbers)


def write(report: dict, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    md, js, png = out_dir / "report.md", out_dir / "report.json", out_dir / "report.png"
    write_atomic(md, markdown(report))
    write_atomic(js, json.dumps(report, indent=1, default=str))
    plot(report, png)
    return [md, js, png]
