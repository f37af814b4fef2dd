"""Kernel designs as data: grid, block, shared memory and registers of each launch.

Sources of the numbers:

- vLLM 0.6.3 ``csrc/attention/attention_kernels.cu`` (launchers of ``paged_attention_v1`` /
  ``paged_attention_v2``): ``NUM_THREADS = 128``, ``NUM_WARPS = NUM_THREADS / WARP_SIZE``;
  V1 grid ``(num_heads, num_seqs, 1)`` with dynamic shared memory
  ``max(padded_max_seq_len * 4, (NUM_WARPS / 2) * head_size * 4)`` where ``padded_max_seq_len``
  rounds ``max_seq_len`` up to ``block_size``; V2 ``PARTITION_SIZE = 512``, grid
  ``(num_heads, num_seqs, ceil(max_seq_len / 512))`` with ``max(512 * 4, (NUM_WARPS / 2) *
  head_size * 4)`` and a reduce kernel on ``(num_heads, num_seqs)`` with
  ``2 * max_num_partitions * 4`` bytes. Static shared memory of the attention kernel: the query
  vectors (``head_size`` elements) and ``red_smem[2 * NUM_WARPS]`` floats; of the reduce kernel:
  ``red_smem[2 * NUM_WARPS]``.
- attn-core's plans: each :class:`attn_core.core.plan_types.KernelStep` becomes a design as it is.
- The GQA-gridded reference design (the issue's): grid ``(num_seqs, num_kv_heads,
  num_partitions)``, K and V tiles of ``[tile_tokens, head_size]`` in shared memory, plus the
  group's query and a tile of fp32 scores; reduce on ``(num_seqs, num_kv_heads)``.
- A single-pass variant: the same partition blocks publish ``(max, sum, partial out)`` and merge
  their predecessors' through decoupled look-back (CUB's single-pass scan: each block reads the
  aggregates of earlier partitions, waiting on flags, instead of a second kernel). Blocks must
  take partition ids from an atomic ticket (not ``blockIdx``) so a waiting block's
  predecessors are already resident: no deadlock whatever the scheduler's order. The model
  charges its extra traffic (aggregate + inclusive prefix written, predecessors read) but no
  latency for the look-back chain, which overlaps the partitions still computing.

Registers are not known for kernels nobody compiled for the device: they are assumptions
(``REGISTERS_ATTENTION`` / ``REGISTERS_REDUCE``), and ``bench/occupancy_check.py`` measures the
occupancy rule itself on the H200.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from attn_core.core.plan_types import KernelStep
from attn_core.core.shapes import QWEN36 as ATTN_QWEN36
from attn_core.core.shapes import AttentionShape
from attn_core.device.spec import DeviceSpec, opted_in
from attn_sim.occupancy import Occupancy, Waves, blocks_per_sm, waves

VLLM_NUM_THREADS = 128
VLLM_PARTITION_SIZE = 512
# assumed: nvcc gives vLLM's attention kernels ~100-170 registers per thread on sm_80/sm_90
# depending on head size; 128 is the middle. The reduce kernel is small.
REGISTERS_ATTENTION = 128
REGISTERS_REDUCE = 32
FP32 = 4


@dataclass(frozen=True)
class KernelDesign:
    """One launch: grid ``(x, y, z)`` of blocks of ``threads`` threads.

    ``kv_bytes_read``: bytes of K/V the launch streams from HBM (every block's reads; a query-head
    grid reads each KV head's K/V once per query head); ``other_bytes``: workspace and output
    traffic; ``flops``: arithmetic, counted as fp32 FMAs x 2; ``tensor_flops``: the part on the
    matrix units. ``opts_in``: the launcher raises the kernel's dynamic shared-memory limit, so
    the budget is the device's opt-in one.
    """

    name: str
    grid: tuple[int, int, int]
    threads: int
    static_smem: int
    dynamic_smem: int
    registers: int
    kv_bytes_read: int = 0
    other_bytes: int = 0
    flops: int = 0
    source: str = ""
    tensor_flops: int = 0  # matrix-unit arithmetic (fp16 in, fp32 accumulate)
    opts_in: bool = False  # dynamic shared memory past the default per-block limit (CUDA opt-in)
    serial_tiles: int = 0  # tiles one warp works through in turn (a latency roof; 0: none)
    fixed_latency_s: float = 0.0  # dependent round trips every launch waits, whatever its size
    # launched as a programmatic dependent of the launch before it: pays the device's
    # dependent_launch_gap_s instead of launch_gap_s
    dependent: bool = False

    @property
    def blocks(self) -> int:
        x, y, z = self.grid
        return x * y * z

    @property
    def smem(self) -> int:
        return self.static_smem + self.dynamic_smem


@dataclass(frozen=True)
class DesignOnDevice:
    """A design judged on a profile: does it fit, how many blocks per SM, how many waves."""

    design: KernelDesign
    occupancy: Occupancy
    waves: Waves | None  # None when it cannot launch
    smem_budget: int

    @property
    def fits(self) -> bool:
        return self.occupancy.blocks_per_sm > 0

    @property
    def smem_over(self) -> int:
        """Bytes over the per-block budget (<= 0 when it fits)."""
        return self.design.smem - self.smem_budget


def evaluate(spec: DeviceSpec, design: KernelDesign) -> DesignOnDevice:
    on = opted_in(spec) if design.opts_in and design.dynamic_smem > 0 else spec
    occ = blocks_per_sm(on, design.threads, design.registers, design.smem)
    w = waves(spec, design.blocks, occ.blocks_per_sm) if occ.blocks_per_sm else None
    return DesignOnDevice(design, occ, w, on.shared_mem_per_block)


# The layer shape is attn-core's AttentionShape (one class for engine-patch, the simulator and
# the HIL suites); the designs read its compute element size for queries and outputs and its
# cache element size for K/V.
QWEN36 = ATTN_QWEN36


def shape_json(shape: AttentionShape) -> dict:
    """The shape as report.json has always written it (``dtype_bytes``: the cache element)."""
    return {
        "num_heads": shape.num_heads,
        "num_kv_heads": shape.num_kv_heads,
        "head_size": shape.head_size,
        "block_size": shape.block_size,
        "dtype_bytes": shape.cache_element_size,
    }


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _kv_bytes(shape: AttentionShape, num_seqs: int, ctx: int, readers: int) -> int:
    return 2 * num_seqs * readers * ctx * shape.head_size * shape.cache_element_size


def _attn_flops(shape: AttentionShape, num_seqs: int, ctx: int) -> int:
    return 4 * num_seqs * shape.num_heads * ctx * shape.head_size  # q.k and p.v, 2 each


def _vllm_static(shape: AttentionShape, warp_size: int) -> int:
    num_warps = max(VLLM_NUM_THREADS // warp_size, 1)
    return shape.head_size * shape.element_size + 2 * num_warps * FP32


def vllm_v1(
    spec: DeviceSpec, shape: AttentionShape, num_seqs: int, max_seq_len: int
) -> KernelDesign:
    """vLLM 0.6.3 ``paged_attention_v1``: the whole padded sequence's logits in shared memory."""
    num_warps = max(VLLM_NUM_THREADS // spec.warp_size, 1)
    padded = _ceil(max_seq_len, shape.block_size) * shape.block_size
    dynamic = max(padded * FP32, (num_warps // 2) * shape.head_size * FP32)
    return KernelDesign(
        name="vllm_v1",
        grid=(shape.num_heads, num_seqs, 1),
        threads=VLLM_NUM_THREADS,
        static_smem=_vllm_static(shape, spec.warp_size),
        dynamic_smem=dynamic,
        registers=REGISTERS_ATTENTION,
        kv_bytes_read=_kv_bytes(shape, num_seqs, max_seq_len, shape.num_heads),
        other_bytes=2 * num_seqs * shape.num_heads * shape.head_size * shape.element_size,
        flops=_attn_flops(shape, num_seqs, max_seq_len),
        source="vLLM 0.6.3 paged_attention_v1_launcher",
    )


def vllm_v2(spec: DeviceSpec, shape: AttentionShape, num_seqs: int, max_seq_len: int) -> list:
    """vLLM 0.6.3 ``paged_attention_v2``: 512-token partitions per query head, then a reduce."""
    num_warps = max(VLLM_NUM_THREADS // spec.warp_size, 1)
    parts = _ceil(max_seq_len, VLLM_PARTITION_SIZE)
    partials = (
        num_seqs * shape.num_heads * parts * (shape.head_size * shape.element_size + 2 * FP32)
    )
    out = num_seqs * shape.num_heads * shape.head_size * shape.element_size
    return [
        KernelDesign(
            name="vllm_v2_partition",
            grid=(shape.num_heads, num_seqs, parts),
            threads=VLLM_NUM_THREADS,
            static_smem=_vllm_static(shape, spec.warp_size),
            dynamic_smem=max(VLLM_PARTITION_SIZE * FP32, (num_warps // 2) * shape.head_size * FP32),
            registers=REGISTERS_ATTENTION,
            kv_bytes_read=_kv_bytes(shape, num_seqs, max_seq_len, shape.num_heads),
            other_bytes=partials + out,
            flops=_attn_flops(shape, num_seqs, max_seq_len),
            source="vLLM 0.6.3 paged_attention_v2_launcher",
        ),
        KernelDesign(
            name="vllm_v2_reduce",
            grid=(shape.num_heads, num_seqs, 1),
            threads=VLLM_NUM_THREADS,
            static_smem=2 * num_warps * FP32,
            dynamic_smem=2 * parts * FP32,
            registers=REGISTERS_REDUCE,
            other_bytes=partials + out,
            flops=4 * num_seqs * shape.num_heads * parts * shape.head_size,
            source="vLLM 0.6.3 paged_attention_v2_launcher (reduce)",
        ),
    ]


def gqa_tile_smem(shape: AttentionShape, tile_tokens: int) -> int:
    """K and V tiles ``[tile_tokens, head_size]``, the group's query, fp32 scores of one tile."""
    kv = 2 * tile_tokens * shape.head_size * shape.cache_element_size
    query = shape.group * shape.head_size * shape.element_size
    scores = shape.group * tile_tokens * FP32
    return kv + query + scores


def gqa_partitioned(
    spec: DeviceSpec,
    shape: AttentionShape,
    num_seqs: int,
    max_seq_len: int,
    *,
    partition_size: int = VLLM_PARTITION_SIZE,
    tile_tokens: int = 32,
    threads: int = 128,
) -> list:
    """Grid on KV heads: one block reads a partition's K/V once for the whole query group."""
    parts = _ceil(max_seq_len, partition_size)
    partials = num_seqs * shape.num_heads * parts * (shape.head_size + 2) * FP32
    out = num_seqs * shape.num_heads * shape.head_size * shape.element_size
    return [
        KernelDesign(
            name="gqa_partition",
            grid=(num_seqs, shape.num_kv_heads, parts),
            threads=threads,
            static_smem=0,
            dynamic_smem=gqa_tile_smem(shape, tile_tokens),
            registers=REGISTERS_ATTENTION,
            kv_bytes_read=_kv_bytes(shape, num_seqs, max_seq_len, shape.num_kv_heads),
            other_bytes=partials,
            flops=_attn_flops(shape, num_seqs, max_seq_len),
            source=f"GQA design, partition {partition_size}, tile {tile_tokens}",
        ),
        KernelDesign(
            name="gqa_reduce",
            grid=(num_seqs, shape.num_kv_heads, 1),
            threads=threads,
            static_smem=0,
            dynamic_smem=2 * parts * shape.group * FP32,
            registers=REGISTERS_REDUCE,
            other_bytes=partials + out,
            flops=4 * num_seqs * shape.num_heads * parts * shape.head_size,
            source="GQA design, reduce on KV heads",
        ),
    ]


def gqa_single_pass(
    spec: DeviceSpec, shape: AttentionShape, num_seqs: int, max_seq_len: int, **knobs: int
) -> list:
    """One launch: partitions merge through decoupled look-back instead of a reduce kernel.

    The partition kernel is :func:`gqa_partitioned`'s, with its ``knobs`` (``partition_size``,
    ``tile_tokens``, ``threads``). Each block also reads its predecessors' published aggregates
    (fp32 out + max + sum per query head, and a flag); with look-back that is a short window,
    charged here as one aggregate per partition read back, and the merge's FLOPs move into this
    kernel.
    """
    part, _ = gqa_partitioned(spec, shape, num_seqs, max_seq_len, **knobs)
    parts = part.grid[2]
    merge_state = shape.group * 2 * FP32 + FP32  # running (max, sum) per head + flag word
    out = num_seqs * shape.num_heads * shape.head_size * shape.element_size
    return [
        KernelDesign(
            name="gqa_single_pass",
            grid=part.grid,
            threads=part.threads,
            static_smem=merge_state,
            dynamic_smem=part.dynamic_smem,
            registers=REGISTERS_ATTENTION,
            kv_bytes_read=part.kv_bytes_read,
            other_bytes=2 * part.other_bytes + out,
            flops=part.flops + 4 * num_seqs * shape.num_heads * parts * shape.head_size,
            source="decoupled look-back (CUB single-pass scan pattern) over GQA partitions",
        )
    ]


def from_steps(steps: Iterable[KernelStep], source: str = "attn-core plan") -> list:
    """attn-core plan steps as designs (their shared memory counted as dynamic)."""
    return [
        KernelDesign(
            name=s.name,
            grid=tuple(s.grid),
            threads=s.threads_per_block,
            static_smem=0,
            dynamic_smem=s.shared_mem_bytes,
            registers=s.registers_per_thread,
            source=source,
        )
        for s in steps
    ]


def plan_designs(plan) -> list:
    """A decode plan's steps as designs, with the traffic a device kernel would have.

    The attention step (``single_tile`` / ``one_pass`` / ``partition``) reads the context's
    K+V once per KV head (``plan.kv_bytes``) and writes fp32 partials (output, max, sum per
    query head and partition); ``reduce`` reads them and writes the output. Steps of other
    names (streaming merges) keep no traffic.
    """
    designs = from_steps(plan.steps, source=f"attn-core plan ({plan.tier})")
    heads, parts = plan.num_seqs * plan.num_heads, plan.num_partitions
    partials = heads * parts * (plan.head_size + 2) * FP32
    out = heads * plan.head_size * plan.cache_element_size
    flops = 4 * heads * plan.context_tokens * plan.head_size
    traffic = {
        "single_tile": (plan.kv_bytes, out, flops),
        "one_pass": (plan.kv_bytes, out, flops),
        "partition": (plan.kv_bytes, partials, flops),
        "reduce": (0, partials + out, 4 * heads * parts * plan.head_size),
    }
    out_designs = []
    for d in designs:
        kv, other, fl = traffic.get(d.name, (0, 0, 0))
        out_designs.append(dataclasses.replace(d, kv_bytes_read=kv, other_bytes=other, flops=fl))
    return out_designs


def design_families(spec: DeviceSpec, shape: AttentionShape, num_seqs: int, ctx: int) -> dict:
    """The reference designs the report compares, keyed by family name."""
    return {
        "vllm_v1": [vllm_v1(spec, shape, num_seqs, ctx)],
        "vllm_v2": vllm_v2(spec, shape, num_seqs, ctx),
        "gqa_partitioned": gqa_partitioned(spec, shape, num_seqs, ctx),
        "gqa_single_pass": gqa_single_pass(spec, shape, num_seqs, ctx),
    }
