"""attn-core's native decode kernel as designs the cost model prices.

The grid, partition count and resource use come from attn-core's decode plan for the native
backend (:func:`attn_core.plan_decode`, whose split the executor launches) and
``kernel_facts.json`` (ptxas, sm_90). Traffic: the partition
kernel reads each KV head's K/V once for the whole GQA group, the queries once per block, the
block-table entries of its partition, and writes fp32 partials (output + log-sum-exp per query
head and partition) or, with one partition, the output; the merge kernel reads the partials
and writes the output. Arithmetic: on the CUDA-core body (CoreX's, and NVIDIA's fp32 queries)
``q.k`` and ``p.v`` are two fp32 FMAs per (token, head dim, query head), plus the softmax's
exponentials; on the matrix-unit body (NVIDIA, 16-bit queries over 16-bit or fp8 caches, fp8
widened in registers) the products run on the matrix units over 8 columns per block (m16n8k16's
N side: the group's heads, zero-padded), and only the softmax stays on CUDA cores.

On the BI-V100 the split reads ``kernel_facts.json``'s ``corex`` records: nvcc's ptxas on the
source as CoreX compiles it (the CUDA-core body, no nvcc-only feature). Their shared memory is
the body's static arrays, the same on both compilers; their registers are sm_90's, an
assumption until the lab records CoreX's build.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Optional

from attn_core.core.settings import DecodeOverrides
from attn_core.core.shapes import AttentionShape
from attn_core.decode.plan import DecodeLengths, DecodePlan, plan_decode
from attn_core.device.capabilities import profile_capabilities
from attn_core.device.spec import DeviceSpec
from attn_core.native.facts import MMA
from attn_core.native.split import NativeSplit, merge_grid, merge_is_dependent
from attn_sim.designs import FP32, KernelDesign, evaluate


def native_plan(spec: DeviceSpec, shape: AttentionShape, num_seqs: int, ctx: int) -> DecodePlan:
    """attn-core's plan for the native backend on ``spec`` (its capabilities as that device's
    torch would report them, the native kernel assumed built and verified there)."""
    caps = dataclasses.replace(profile_capabilities(spec, shape.dtype), native_decode=True)
    overrides = DecodeOverrides(backend="native")
    return plan_decode(shape, DecodeLengths(num_seqs, ctx), spec, caps, overrides)


def native_split_for(
    spec: DeviceSpec, shape: AttentionShape, num_seqs: int, ctx: int
) -> NativeSplit:
    split = native_plan(spec, shape, num_seqs, ctx).native
    assert split is not None  # a native plan always carries its split
    return split


def native_designs(
    spec: DeviceSpec,
    shape: AttentionShape,
    num_seqs: int,
    ctx: int,
    split: Optional[NativeSplit] = None,
) -> list:
    """The partition launch and, with more than one partition, the merge launch (``split``:
    the plan's, when the caller already has it)."""
    split = split or native_split_for(spec, shape, num_seqs, ctx)
    heads = num_seqs * shape.num_heads
    kv = 2 * num_seqs * shape.num_kv_heads * ctx * shape.head_size * shape.cache_element_size
    table = num_seqs * shape.num_kv_heads * split.head_groups * -(-ctx // shape.block_size) * 4
    query = split.partition_blocks * split.slots * shape.head_size * shape.element_size
    out = heads * shape.head_size * shape.element_size
    partials = heads * split.num_partitions * (shape.head_size + 1) * FP32
    softmax = 8 * heads * ctx  # exp, max, sum per score
    mma = split.partition.body == MMA
    if mma:  # 8 matrix columns per block, whatever the group
        rows = num_seqs * shape.num_kv_heads * split.head_groups * 8
        flops, tensor = softmax, 4 * rows * ctx * shape.head_size
    else:  # FMAs x 2
        flops, tensor = 4 * heads * ctx * shape.head_size + softmax, 0
    body = "matrix units" if mma else "CUDA cores"
    warps = split.partition.threads // 32  # the matrix-unit body's warp streams a block
    partition = KernelDesign(
        name="native_partition",
        grid=(shape.num_kv_heads * split.head_groups, split.num_partitions, num_seqs),
        threads=split.partition.threads,
        static_smem=split.partition.smem_bytes,
        dynamic_smem=0,
        registers=split.partition.registers,
        kv_bytes_read=kv,
        other_bytes=table + query + (partials if split.merged else out),
        flops=flops,
        source=f"attn-core native kernel ({body}), {split.num_partitions} x "
        f"{split.partition_size} tokens",
        tensor_flops=tensor,
        serial_tiles=-(-split.partition_size // (MMA_TILE_TOKENS * warps)) if mma else 0,
        fixed_latency_s=MMA_BLOCK_FIXED_S if mma else 0.0,
    )
    if not split.merged:
        return [partition]
    grid = merge_grid(num_seqs, shape.num_heads, shape.head_size, split.num_partitions)
    merge = KernelDesign(
        name="native_merge",
        grid=grid,
        threads=split.merge.threads,
        static_smem=split.merge.smem_bytes,
        dynamic_smem=0,
        registers=split.merge.registers,
        other_bytes=partials + out,
        flops=4 * heads * split.num_partitions * shape.head_size,
        source="attn-core native kernel, log-sum-exp merge",
        fixed_latency_s=MERGE_LATENCY_S,
        dependent=merge_is_dependent(spec, math.prod(grid)),
    )
    return [partition, merge]


# The matrix-unit body's latency roof: each of a block's warps works through its 16-token tiles one
# after another with one tile's loads in flight, and a tile takes a warp at least MMA_WARP_TILE_S
# whatever the bytes; fit with the merge's round trip (H200, build b546514573a34bfb3004;
# docs/benchmarks.md#simulator-calibration) to the twelve-row table and to Nsight Compute's
# per-kernel times (the partition kernel at 1 x 8K, 4 tiles a warp, 15.4 us). The roof is what one
# SM's warps can have in flight, so a launch priced by it streams its bytes at the whole device's
# rate, not at its busy SMs' share (``Waves.memory_efficiency`` would count the same limit twice):
# at 2K-16K tokens, 32-128 blocks on 132 SMs, the step grew with its bytes at 3.4-4.3 TB/s
# (docs/benchmarks.md#native-decode: 24 / 4 heads 1 x 2K, 64 blocks, 0.0100 ms; 1 x 4K, 128 blocks,
# 0.0124; 1 x 8K 0.0163), where the busy-SM share priced all three alike.
MMA_TILE_TOKENS = 16
MMA_WARP_TILE_S = 2.2e-6
# A partition block's fixed phases, from the per-block %globaltimer stamps of
# bench/decode_timeline.py on the committed kernel (H200, docs/benchmarks.md#decode-kernel-choices;
# five shapes, 1 x 8K to 1 x 100K): its queries ready 1.5-1.7 us after it starts (the length, the
# queries and the first tiles' page ids requested together), then its tiles, then 2.2-2.3 us to fold
# its warps (0.6-0.7) and store its partials (1.5-1.6). MMA_FIRST_TILE_S is what the step times
# leave beyond those and the roof, fit to docs/benchmarks.md#native-decode's table and its short
# rows together (twenty rows): the first tile's keys, waited on with nothing else in flight, and the
# spread of block ends (0.3-0.6 us at 8K, 2.2-2.8 at 100K in the stamps), which the model has no
# term for. The merge waits on one round trip beyond bandwidth (the streaming merge requests the
# log-sum-exps and the partials together): MERGE_LATENCY_S, one kernel on every profile, so it
# applies to the BI-V100 too. On NVIDIA compute 9.0+ the merge is a programmatic dependent
# (``dependent_launch_gap_s``: its first work 0.5 us after the last partition block, not a launch
# gap of 2.8). 16-bit caches stream at the DRAM rate beyond 32K and the roof does not bind there.
# Measured on the H200 only: the tile constants apply to every NVIDIA profile (CoreX builds run the
# CUDA-core body, which has none of them here).
MMA_PROLOGUE_S = 1.6e-6
MMA_EPILOGUE_S = 2.2e-6
MMA_FIRST_TILE_S = 0.6e-6
MMA_BLOCK_FIXED_S = MMA_PROLOGUE_S + MMA_FIRST_TILE_S + MMA_EPILOGUE_S
MERGE_LATENCY_S = 0.75e-6


# Streaming and arithmetic added, not overlapped: on the H200 (Nsight Compute, 1 x 100K tokens) the
# CUDA-core kernel sat at 50 % of DRAM bandwidth and 50 % of issue slots with 16 warps per SM,
# neither saturated: the latency of the FMA chains is not hidden behind the loads. The matrix-unit
# body takes the larger of that sum and its tile roof, plus its block's fixed phases. Against the
# H200 (datasheet h200 profile; tests/test_native_design.py keeps both tables): the twelve-row table
# of docs/benchmarks.md#native-decode -11.7 % to +5.8 % and its eight short rows (2K-16K tokens)
# -3.5 % to +11.8 %, where the model before this (no dependent launch, the busy-SM share under the
# roof) was -9.6 % to +6.8 % and +2 % to +37 %.
def native_step_s(spec: DeviceSpec, designs: list) -> float:
    """Device seconds of one step as a CUDA graph replays it (inf if a launch cannot fit)."""
    total = 0.0
    for d in designs:
        judged = evaluate(spec, d)
        w = judged.waves
        if w is None:
            return float("inf")
        share = 1.0 if d.serial_tiles else w.memory_efficiency  # the roof holds the per-SM limit
        memory_s = (d.kv_bytes_read + d.other_bytes) / spec.hbm_bandwidth / share
        compute_s = (d.flops / spec.fp32_flops + d.tensor_flops / spec.fp16_flops) / w.efficiency
        roof_s = w.waves * d.serial_tiles * MMA_WARP_TILE_S
        gap_s = spec.dependent_launch_gap_s if d.dependent else spec.launch_gap_s
        total += max(memory_s + compute_s, roof_s) + d.fixed_latency_s + gap_s
    return total


HEADLINE_CONTEXTS = (32 * 1024, 100 * 1024, 256 * 1024)
HEADLINE_BATCHES = (1, 8, 64)


def native_rows(
    spec: DeviceSpec, shape: AttentionShape, torch_graph_ms: Callable[[int, int], float]
) -> list[dict]:
    """Per-layer decode: the HBM floor, the native kernel (modelled) and the torch path
    (``torch_graph_ms(batch, context)``, traced), at 32K / 100K / 256K x batch 1 / 8 / 64."""
    rows = []
    for ctx in HEADLINE_CONTEXTS:
        for batch in HEADLINE_BATCHES:
            try:
                split = native_split_for(spec, shape, batch, ctx)
            except ValueError as exc:  # the kernel cannot be resident on this profile
                rows.append({"batch": batch, "context": ctx, "fits": False, "why": str(exc)})
                continue
            designs = native_designs(spec, shape, batch, ctx, split)
            kv = designs[0].kv_bytes_read
            floor_ms = kv / spec.hbm_bandwidth * 1e3
            native_ms = native_step_s(spec, designs) * 1e3
            torch_ms = torch_graph_ms(batch, ctx)
            workspace = split.workspace_bytes(batch, shape.num_heads, shape.head_size)
            smem = max(d.smem for d in designs)
            rows.append(
                {
                    "batch": batch,
                    "context": ctx,
                    "floor_ms": round(floor_ms, 4),
                    "native_ms": round(native_ms, 4),
                    "native/floor": round(native_ms / floor_ms, 2),
                    "torch_ms": torch_ms,
                    "torch/native": round(torch_ms / native_ms, 2),
                    "partitions": f"{split.num_partitions} x {split.partition_size}",
                    "blocks_per_sm": split.blocks_per_sm,
                    "registers": split.partition.registers,
                    "smem/budget": f"{smem}/{spec.shared_mem_per_block}",
                    "fits": all(evaluate(spec, d).fits for d in designs)
                    and smem <= spec.shared_mem_per_block,
                    "kv+partials_GB": round((kv + workspace) / 1e9, 2),
                    "fits_device_memory": kv + workspace <= spec.memory_bytes,
                }
            )
    return rows


NATIVE_LEGEND = (
    "One attention layer's decode step as a CUDA graph replays it. `floor_ms`: K+V read once at "
    "the profile's `hbm_bandwidth`. `native_ms`: attn-core's native kernel (`attn_core.native`), "
    "priced from its own split (`partitions` of the context per sequence, resident "
    "`blocks_per_sm` from the kernel's recorded `registers` and shared memory) with streaming "
    "and fp32 arithmetic added, not overlapped (the H200's measurement; on an Iluvatar profile "
    "the records are `kernel_facts.json`'s `corex` stand-in: see the report's first line); "
    "on NVIDIA's matrix-unit body, the larger of that "
    "and its tile roof (each warp spends `MMA_WARP_TILE_S` on each of its 16-token tiles in "
    "turn), streaming at the whole device's rate, plus a block's fixed phases "
    "(`MMA_BLOCK_FIXED_S`: its queries, first tile, fold and stores); the merge adds one "
    "dependent read (`MERGE_LATENCY_S`) and, where the device has a programmatic dependent "
    "launch (`dependent_launch_gap_s` > 0), starts that long after the partition grid instead "
    "of a launch gap; measured on the H200. `torch_ms`: the portable torch "
    "path, traced and replayed the same way (as in the decode table below). `fits`: every "
    "launch is resident within the per-block shared-memory budget; `fits_device_memory`: K+V + "
    "the fp32 partials fit the device's memory."
)
