"""What one prefill call costs on each backend: a pure price from the device profile's rates.

The plan (:func:`attn_core.prefill.plan.plan_prefill`) picks the cheapest backend among those
the capabilities say are verified here, and the simulator prices the same plans with the same
function, so the choice and the report cannot disagree. Every price is

    seconds = max(compute, memory) + launches x launch overhead

from three rates of the :class:`~attn_core.device.spec.DeviceSpec` (``fp16_flops``: the matrix
units; ``fp32_flops``: the CUDA-core FMA rate; ``hbm_bandwidth``), each scaled by the fraction
of it a backend reaches (:data:`EFFICIENCY`), which is a measurement where one exists and an
assumption, said so, where not.

Work of a call (per KV-head group, summed over sequences; every sequence is priced at the
longest query chunk and context, an upper bound): ``scores = q * ctx + q * (q + 1) / 2``
query-key pairs per query head (bottom-right causal within the chunk), ``flops = 4 *
head_size * scores * num_heads`` (QK^T and P@V, a multiply and an add each).
"""

from __future__ import annotations

from dataclasses import dataclass

from attn_core.core.shapes import AttentionShape
from attn_core.device.spec import DeviceSpec

# Bytes per score the torch path moves outside its GEMMs (2-byte scores; its plan's
# ELEMENTWISE_BYTES_PER_SCORE, repeated here so the price is importable without the planner).
TORCH_BYTES_PER_SCORE = 14


@dataclass(frozen=True)
class Efficiency:
    """The fraction of a profile rate a backend reaches, and where that number came from."""

    rate: str  # "fp16_flops" (matrix units) or "fp32_flops" (CUDA-core FMA)
    compute: float  # fraction of that rate the attention FLOPs run at
    memory: float  # fraction of hbm_bandwidth its memory traffic runs at
    provenance: str


# The prefill table (docs/benchmarks.md#native-chunked-prefill; H200, Qwen3.6 shape 24/4 heads, head
# 256, fp16, block 16): the compute floor at 100K / 2048 is 6.83 ms for 5.08 TFLOP, i.e. a measured
# matmul rate of ~744 TFLOP/s, 0.75 of the 989 datasheet figure; the torch path took 142 ms at 100K
# / 8192 = 28.2 ms of GEMMs + ~114 ms moving 287 GB elementwise (2.5 TB/s, 0.52 of 4.8 TB/s), and
# 35.8 ms at 100K / 2048 (priced 34.6); SDPA after a gather ran at 2.5x the floor, 0.30 of the
# datasheet rate.
EFFICIENCY: dict[str, Efficiency] = {
    "torch": Efficiency(
        "fp16_flops", 0.75, 0.52,
        "measured: H200, native prefill table (matmul 0.75 of datasheet, elementwise 0.52 of HBM)",
    ),
    "sdpa": Efficiency(
        "fp16_flops", 0.30, 1.0,
        "measured: H200, native prefill table (SDPA after a gather at 2.5x the matmul floor)",
    ),
    "vendor_flash": Efficiency(
        "fp16_flops", 0.30, 1.0, "assumed: as SDPA after a gather (not measured on BI-V100)"
    ),
    # 85.4 ms at 100K / 8192 and 20.8 at 100K / 2048 (H200,
    # docs/benchmarks.md#native-chunked-prefill; the 8-warp warp-rows tile with two K / V buffers,
    # copies spread through Q K^T, subnormals flushed): 245 TFLOP/s, 0.248 of the datasheet rate
    # (119.5 ms, 0.177, with the copies in one burst; 128 ms, 0.165, with S and P in shared memory;
    # 175 ms with the 16-warp tile). ncu (30K / 2048): tensor-core instructions now carry half the
    # stall samples, mostly waiting on their fragment loads. One buffer each (devices whose opt-in
    # shared memory is under 215 KiB): 92.2 ms, 0.229.
    "native:wmma": Efficiency(
        "fp16_flops", 0.248, 1.0,
        "measured: H200, 8-warp wmma tile, two K/V buffers, spread copies, 85.4 ms at 100K / 8192",
    ),
    # CoreX's layer keeps S and P in shared memory, so the NVIDIA tile's figure before the
    # scores moved to registers.
    "native:corex_wmma": Efficiency(
        "fp16_flops", 0.165, 1.0,
        "assumed: as the NVIDIA wmma tile with S in shared memory (never run on CoreX)",
    ),
    # The issue's target for the CUDA-core tile: 40% of the H200's measured fp32 FMA rate
    # (50.6 TFLOP/s, device-facts), i.e. 0.30 of the 67 TFLOP/s datasheet figure.
    "native:fma": Efficiency(
        "fp32_flops", 0.30, 1.0, "assumed: the issue's target, 40% of the measured FMA rate"
    ),
}  # fmt: skip


@dataclass(frozen=True)
class PrefillWork:
    """The work of one call: attention FLOPs, scores, and context K/V bytes per read."""

    flops: float
    scores: float  # query-key pairs summed over query heads and sequences
    kv_bytes: float  # the context's K and V in the cache, once


@dataclass(frozen=True)
class PrefillCost:
    """A backend's price for one call.

    Attributes:
        backend: ``"torch"``, ``"sdpa"``, ``"vendor_flash"`` or ``"native:<mma variant>"``.
        seconds: the price.
        compute_s / memory_s / launch_s: its terms (``seconds = max(compute, memory) + launch``).
        provenance: where the efficiency behind it came from.
    """

    backend: str
    seconds: float
    compute_s: float
    memory_s: float
    launch_s: float
    provenance: str


def prefill_work(
    shape: AttentionShape, num_seqs: int, max_query_len: int, max_context_len: int
) -> PrefillWork:
    """The work of ``num_seqs`` sequences of ``max_query_len`` new tokens over
    ``max_context_len`` cached ones each."""
    q, ctx = float(max_query_len), float(max_context_len)
    per_head = q * ctx + q * (q + 1) / 2
    scores = num_seqs * per_head * shape.num_heads
    kv = 2.0 * num_seqs * ctx * shape.num_kv_heads * shape.head_size * shape.cache_element_size
    return PrefillWork(4.0 * shape.head_size * scores, scores, kv)


def price(
    backend: str,
    work: PrefillWork,
    spec: DeviceSpec,
    *,
    launches: int = 1,
    kv_reads: int = 1,
) -> PrefillCost:
    """``backend``'s price for ``work`` on ``spec``.

    Args:
        backend: a key of :data:`EFFICIENCY`.
        launches: kernel launches of the call (the torch path's many small ops; a native
            split adds its merge).
        kv_reads: times the context K/V is read (a native kernel reads it once per query tile;
            the torch path's elementwise traffic is priced per score instead).
    """
    if backend not in EFFICIENCY:
        raise ValueError(f"backend must be one of {sorted(EFFICIENCY)}, got {backend!r}")
    eff = EFFICIENCY[backend]
    rate = getattr(spec, eff.rate) * eff.compute
    compute = work.flops / rate
    traffic = work.kv_bytes * max(kv_reads, 1)
    if backend == "torch":
        traffic += work.scores * TORCH_BYTES_PER_SCORE
        compute_s, memory_s = compute, traffic / (spec.hbm_bandwidth * eff.memory)
        # the torch path's GEMMs and elementwise passes are separate launches: they add up
        return PrefillCost(
            backend, compute_s + memory_s + launches * spec.launch_overhead_s, compute_s,
            memory_s, launches * spec.launch_overhead_s, eff.provenance,
        )  # fmt: skip
    memory = traffic / (spec.hbm_bandwidth * eff.memory)
    launch = launches * spec.launch_overhead_s
    return PrefillCost(
        backend, max(compute, memory) + launch, compute, memory, launch, eff.provenance
    )
