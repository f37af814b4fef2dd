"""``python -m attn_sim report``: tables, a plot and a JSON of the simulated device.

For one profile (default ``bi-v100``) and the Qwen3.6 shape (24/4 heads, head 256, fp16,
block 16):

- the assumptions used (every profile constant with its provenance);
- kernel designs per context: vLLM's V1 / V2, the GQA-gridded partition + reduce, the
  single-pass look-back variant and attn-core's planned steps: blocks, blocks per SM and what
  limits it, waves and tail, shared memory against the budget, analytic time;
- decode and prefill as traced from attn-core, contexts 1K..1M, batches 1..64: tier, partitions,
  launches, bytes, FLOPs, waves, shared memory vs budget, predicted time, transient memory.

Writes ``report.md``, ``report.json`` and ``report.png`` into the output directory.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from tabulate import tabulate

from attn_core.device_spec import DeviceSpec
from attn_core.shapes import AttentionShape
from attn_sim.cost import design_cost
from attn_sim.designs import (
    QWEN36,
    Shape,
    design_families,
    evaluate,
    from_steps,
    gqa_partitioned,
    plan_designs,
    vllm_v1,
    vllm_v2,
)
from attn_sim.simulate import CaseResult, simulate
from attn_sim.workloads import BMM_OUT_DTYPE, Case, base_name, plan_for

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
    "memory_bytes",
)


def assumptions(spec: DeviceSpec) -> list[dict]:
    return [
        {"constant": f, "value": getattr(spec, f), "provenance": spec.provenance.get(f, "?")}
        for f in ASSUMPTION_FIELDS
    ]


def design_rows(spec: DeviceSpec, shape: Shape = QWEN36, num_seqs: int = 1) -> list[dict]:
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


def budget_rows(spec: DeviceSpec, shape: Shape = QWEN36) -> list[dict]:
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


def traced_cases(shape: Shape = QWEN36) -> list[Case]:
    cases = [Case("decode", b, c, shape) for c in DECODE_CONTEXTS for b in DECODE_BATCHES]
    cases += [Case("prefill", b, c, shape, query_len=PREFILL_CHUNK) for b, c in PREFILL_CASES]
    return cases


def result_row(r: CaseResult) -> dict:
    return {
        "batch": r.num_seqs,
        "context": r.context,
        "tier": r.tier,
        "partitions": r.partitions,
        "launches": r.launches,
        "plan_launches": r.plan_launches,
        "GB": round(r.bytes / 1e9, 3),
        "GFLOP": round(r.flops / 1e9, 2),
        "max_waves": r.max_waves,
        "smem/budget": f"{r.smem_max}/{r.smem_budget}",
        "fits": r.plan_fits,
        "time_ms": round(r.time_s * 1e3, 3),
        "graph_ms": round(r.graph_time_s * 1e3, 3),
        "transient_MB": round(r.transient_bytes / 1e6, 1),
        "kv_MB": round(r.kv_bytes / 1e6, 1),
        "cache_fits_device": r.cache_fits_device,
    }


def build(spec: DeviceSpec, shape: Shape = QWEN36) -> dict:
    start = time.perf_counter()
    results = [simulate(spec, c) for c in traced_cases(shape)]
    return {
        "profile": spec.name,
        "shape": dataclasses.asdict(shape),
        "assumptions": assumptions(spec),
        "bmm_out_dtype": BMM_OUT_DTYPE.get(base_name(spec), False),
        "designs": design_rows(spec, shape),
        "budget": budget_rows(spec, shape),
        "results": [r.to_json() for r in results],
        "decode": [result_row(r) for r in results if r.path == "decode"],
        "prefill": [result_row(r) for r in results if r.path == "prefill"],
        "elapsed_s": time.perf_counter() - start,
    }


def shape_text(shape: dict) -> str:
    return (
        f"{shape['num_heads']}/{shape['num_kv_heads']} heads, head {shape['head_size']}, "
        f"{8 * shape['dtype_bytes']}-bit, block {shape['block_size']}"
    )


def parse_shape(text: str) -> Shape:
    """``"24,4,256"`` or ``"24,4,256,16"`` (heads, KV heads, head size[, block size]), checked as
    :class:`attn_core.shapes.AttentionShape` checks a shape (fp16): a ``ValueError`` naming the
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
    try:
        AttentionShape(*numbers)
    except ValueError as err:
        raise ValueError(f"shape {text!r}: {err}") from None
    return Shape(*numbers)


def markdown(report: dict) -> str:
    spec_line = {a["constant"]: a["value"] for a in report["assumptions"]}
    parts = [
        f"# Simulated {report['profile']}: {shape_text(report['shape'])}",
        "",
        f"Assumed: {spec_line['sm_count']} SMs, {spec_line['shared_mem_per_block'] // 1024} KiB "
        f"shared memory per block, {spec_line['hbm_bandwidth'] / 1e9:.0f} GB/s, warp "
        f"{spec_line['warp_size']}. Torch under the profile: bmm writes fp32 scores: "
        f"{report['bmm_out_dtype']}. Registers of untraced kernel designs are assumed (128 "
        "attention, 32 reduce); one resident block is assumed to reach an SM's bandwidth share; "
        "torch's own grids are estimated from PyTorch's CUDA sources.",
        "",
        "## Assumptions",
        tabulate(report["assumptions"], headers="keys", tablefmt="github"),
        "",
        "## Shared-memory budget: longest context that fits (batch 1)",
        tabulate(report["budget"], headers="keys", tablefmt="github"),
        "",
        "## Kernel designs (batch 1)",
        tabulate(report["designs"], headers="keys", tablefmt="github"),
        "",
        "## Decode (traced attn-core)",
        tabulate(report["decode"], headers="keys", tablefmt="github"),
        "",
        f"## Prefill (traced attn-core, {PREFILL_CHUNK}-token chunk)",
        tabulate(report["prefill"], headers="keys", tablefmt="github"),
        "",
    ]
    return "\n".join(parts)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12, 4.5))
    for path_name, rows, style in (
        ("decode", report["decode"], "-o"),
        ("prefill", report["prefill"], "--s"),
    ):
        for batch in sorted({r["batch"] for r in rows}):
            sel = [r for r in rows if r["batch"] == batch]
            ctx = [r["context"] for r in sel]
            ax_t.plot(ctx, [r["time_ms"] for r in sel], style, label=f"{path_name} b{batch}")
            ax_m.plot(ctx, [r["transient_MB"] for r in sel], style, label=f"{path_name} b{batch}")
    for ax, label in ((ax_t, "predicted time per step (ms)"), (ax_m, "transient memory (MB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    ax_t.legend(fontsize=7)
    fig.suptitle(f"attn-core on simulated {report['profile']} ({shape_text(report['shape'])})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(report: dict, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    md, js, png = out_dir / "report.md", out_dir / "report.json", out_dir / "report.png"
    md.write_text(markdown(report))
    with open(js, "w") as f:
        json.dump(report, f, indent=1, default=str)
    plot(report, png)
    return [md, js, png]
