"""``report.md``: the report's tables, each with a short legend of what its columns mean.

The legends answer what a first reader asks: why ``launches`` and ``plan_launches`` differ, why
the design table's analytic time is far below the traced time, which steps do not fit the
device's memory.
"""

from __future__ import annotations

from typing import Optional

from tabulate import tabulate

from attn_sim import linear_layer
from attn_sim.native_design import NATIVE_LEGEND

REFERENCE_CONTEXT = 100 * 1024
# The one caveat a reader of a BI-V100 report needs before any number (it was a clause deep in
# the native table's legend).
COREX_CAVEAT = "BI-V100 rows use the NVIDIA build's registers until the lab records CoreX's."


def caveat(report: dict) -> Optional[str]:
    """:data:`COREX_CAVEAT` for an Iluvatar profile (``bi-v100...``), else None."""
    return COREX_CAVEAT if str(report["profile"]).startswith("bi-v100") else None


BUDGET_LEGEND = (
    "Longest batch-1 context whose launches all fit one block's shared-memory budget "
    "(`budget_bytes`, the profile's `shared_mem_per_block`)."
)
DESIGN_LEGEND = (
    "Each kernel a design would launch, as data: `grid` and `blocks`, resident `blocks_per_sm` "
    "and the resource that limits it, `waves` over the SMs and the busy share of the last "
    "(`tail`), shared memory `smem` against `budget`. `time_us` is *analytic*: one launch "
    "priced from the bytes and FLOPs the design must move (`max(bytes / bandwidth, flops / "
    "rate)`, occupancy and waves applied), nothing else; empty where the design does not fit. "
    "It is what a purpose-built kernel could reach, not what attn-core's torch code takes: "
    "the decode table below traces that code, every gather, cast, matmul and merge a launch of "
    "its own, plus the host's issue time."
)
DECODE_LEGEND = (
    "`tier` and `partitions`: the plan's choice (KV partitions per sequence; 1 for "
    "single_tile / one_pass). `launches`: torch kernel launches the traced step issued (every "
    "aten op that runs on the device). `plan_launches`: launches a purpose-built kernel "
    "following the plan would make (partition + reduce); the gates bound both. `time_ms`: an "
    "eager step (the host issues each launch at `launch_overhead_s`, pipelined with the "
    "device); `graph_ms`: the same launches replayed from a CUDA graph (device time only; how "
    "vLLM runs decode). `transient_MB`: reusable workspace + peak new allocations of a "
    "steady-state call; `kv_MB`: K+V of the context. `cache_fits_device`: K+V alone fits the "
    "device's memory; `step_fits_device` / `device_memory`: K+V + transient fits (OVER: the "
    "step cannot run on this device as planned)."
)
PREFILL_LEGEND = (
    "`backend`: the plan's prefill backend (`torch`, the portable online softmax; `sdpa`, "
    "torch's fused flash kernel, on NVIDIA profiles; the vendor's kernel on bi-v100 is not "
    "modelled, so bi-v100 is priced on `torch`). `query_tile` / `key_tile`: the "
    "torch backend's tiles in tokens; `stream_chunk`: context tokens gathered at once (0: the "
    "whole context once per sequence); `tile_updates`: (query tile, key tile) updates per "
    "sequence. `launches`: torch launches the traced call issued; `plan_steps`: launches of "
    "one tile update as the plan describes them. Times and memory columns as for decode."
)


def shape_text(shape: dict) -> str:
    return (
        f"{shape['num_heads']}/{shape['num_kv_heads']} heads, head {shape['head_size']}, "
        f"{8 * shape['dtype_bytes']}-bit, block {shape['block_size']}"
    )


def design_vs_traced(report: dict) -> Optional[str]:
    """The plan's kernels priced analytically against its traced torch code, at batch 1 and
    100K tokens (the design target) or else the longest context both tables have."""
    traced = {r["context"]: r for r in report["decode"] if r["batch"] == 1}
    contexts = sorted({d["context"] for d in report["designs"]}, reverse=True)
    for ctx in sorted(contexts, key=lambda c: c != REFERENCE_CONTEXT):
        plan = [d for d in report["designs"] if d["context"] == ctx]
        plan = [d for d in plan if d["family"].startswith("attn-core plan")]
        if ctx not in traced or not plan or any(d["time_us"] is None for d in plan):
            continue
        analytic_ms = sum(d["time_us"] for d in plan) / 1e3
        t = traced[ctx]
        return (
            f"At {ctx:,} tokens, batch 1: the plan's {len(plan)} kernels priced analytically "
            f"take {analytic_ms:.3g} ms; attn-core's torch code for the same plan, traced, "
            f"{t['graph_ms']:.3g} ms replayed ({t['time_ms']:.3g} ms eager) in {t['launches']} "
            f"launches: {t['graph_ms'] / analytic_ms:.1f}x, the room a native kernel has."
        )
    return None


def memory_warning(rows: list[dict], memory_bytes: int, what: str) -> Optional[str]:
    over = [r for r in rows if not r["step_fits_device"]]
    if not over:
        return None
    cases = ", ".join(f"b{r['batch']} x {r['context']:,} ({r['kv+transient_GB']} GB)" for r in over)
    return (
        f"**{len(over)} {what} cases need more than the device's {memory_bytes / 1e9:.1f} GB "
        f"({memory_bytes / 2**30:.4g} GiB)** "
        f"(K+V + transient): {cases}."
    )


def _section(title: str, rows: list[dict], *notes: Optional[str]) -> list[str]:
    out = [f"## {title}", tabulate(rows, headers="keys", tablefmt="github"), ""]
    out += [f"{n}\n" for n in notes if n]
    return out


TTFT_LEGEND = (
    "Seconds of attention for one full-attention layer to prefill the whole prompt chunk by "
    "chunk (chunk i over i chunks of context), priced by attn-core's prefill cost function "
    "(attn_core.prefill.cost) from each profile's rates. `torch_s`: the torch path; "
    "`native_matrix_s`: the native kernel's matrix variant (`matrix_variant`; never run on "
    "bi-v100: CoreX's wmma is unverified and its fp16 rate a datasheet figure); `native_fma_s`: "
    "its CUDA-core tile; `plan_s` / `plan_picks`: what attn-core's plan picks per chunk when the "
    "traceable fused backend and every native variant the profile's vendor runs (its matrix "
    "variant and fma; never NVIDIA's wmma on bi-v100) are taken as verified. The native "
    "matrix efficiency is the H200's measurement of the 8-warp wmma tile (see the "
    "prices table); CoreX's is that tile's figure with its scores in shared memory (as CoreX's "
    "layer keeps them), assumed until the lab measures it."
)


HYBRID_LEGEND = (
    "One request on the hybrid model (layers from its config; default Qwen3.5-MoE class, "
    "`layers`), all layers of a kind together: `prefill_*_s` the whole prompt in 8192-token "
    "chunks, `decode_*_ms` one decode token at the prompt's length, `linear_share` the linear "
    "layers' part of the prefill. `path` is the linear layers': `fallback` transformers' "
    "torch_chunk_gated_delta_rule (a Python loop over 64-token chunks, ~19 launches a chunk by a "
    "dispatch counter; its host cost per op fitted to the H100's two prefill times), `torch` "
    "attn-core's torch path (one launch a 64-token chunk plus 44 a segment of chunks, the "
    "segment sized by its plan; a dispatch counter, since the tracer cannot run it on meta "
    "tensors), `native` attn-core's kernels as the library picks them: the fused 16-token kernel "
    "where its grid fills the SMs (chunks walked in sequence by each block: waves x chunks x "
    "per-chunk latency), else the chunk-parallel pair (chunk_prep in whole rounds of a wave, "
    "then chunk_pass's chunks in sequence), efficiencies fitted to H100 timings; decode's "
    "launch gap and bandwidth share assumed. Full "
    "attention is attn-core's plan (native kernels taken as verified) for `fallback` and "
    "`native`, its torch path for `torch`; decode is eager for the torch paths, a graph replay "
    "for native. Calibration: H100 errors in "
    "tests/test_linear_layer.py; nothing here is calibrated on BI-V100."
)
LINEAR_LEGEND = (
    "One linear layer's 8192-token prefill call (the request's chunk): launches, bytes and "
    "FLOPs, the sequential `chunks` and, for the native kernel, the per-chunk latency of a "
    "block, its `waves` and resident `blocks_per_sm` (shared memory "
    f"{linear_layer.NATIVE_PREFILL_SMEM:,} B a block against the profile's budget)."
)


def headline(text: str) -> str:
    """The start of a :func:`markdown` report up to its second section: the title, the
    assumptions line and the first table (decode: native kernel vs torch path vs the floor),
    which is what a terminal shows; the rest stays in report.md."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("## ")]
    end = starts[1] if len(starts) > 1 else len(lines)
    return "\n".join(lines[:end]).rstrip()


def markdown(report: dict) -> str:
    spec_line = {a["constant"]: a["value"] for a in report["assumptions"]}
    memory = report["memory_bytes"]
    first = caveat(report)
    parts = [
        f"# Simulated {report['profile']}: {shape_text(report['shape'])}",
        "",
        *([first, ""] if first else []),
        f"Assumed: {spec_line['sm_count']} SMs, {spec_line['shared_mem_per_block'] // 1024} KiB "
        f"shared memory per block, {spec_line['hbm_bandwidth'] / 1e9:.0f} GB/s, warp "
        f"{spec_line['warp_size']}. Torch under the profile: bmm writes fp32 scores: "
        f"{report['bmm_out_dtype']}. Registers of untraced kernel designs are assumed (128 "
        "attention, 32 reduce); one resident block is assumed to reach an SM's bandwidth share; "
        "torch's own grids are estimated from PyTorch's CUDA sources.",
        "",
    ]
    parts += _section(
        "Decode per layer: native kernel vs torch path vs the HBM floor",
        report["native"],
        NATIVE_LEGEND,
    )
    parts += [
        "## Assumptions",
        tabulate(report["assumptions"], headers="keys", tablefmt="github"),
        "",
    ]
    parts += _section(
        "Shared-memory budget: longest context that fits (batch 1)", report["budget"], BUDGET_LEGEND
    )
    parts += _section(
        "Kernel designs (batch 1)", report["designs"], DESIGN_LEGEND, design_vs_traced(report)
    )
    parts += _section(
        "Decode (traced attn-core)",
        report["decode"],
        memory_warning(report["decode"], memory, "decode"),
        DECODE_LEGEND,
    )
    parts += _section(
        f"Prefill (traced attn-core, {report['prefill_chunk']}-token chunk)",
        report["prefill"],
        memory_warning(report["prefill"], memory, "prefill"),
        PREFILL_LEGEND,
    )
    if report.get("prefill_ttft"):
        parts += _section(
            "Prefill: attention per full-attention layer for a whole prompt (time to first token)",
            report["prefill_ttft"],
            TTFT_LEGEND,
        )
        parts += _section("Prefill prices: rates and efficiencies", report["prefill_rates"])
    if report.get("hybrid_request"):
        parts += _section(
            "Attention time of one request (hybrid model: full and linear attention)",
            report["hybrid_request"],
            HYBRID_LEGEND,
        )
        parts += _section("Linear attention: one layer's 8K prefill call", report["linear_layer"],
                          LINEAR_LEGEND)  # fmt: skip
        parts += _section("Linear attention: constants and provenance", report["linear_constants"])
    return "\n".join(parts)
