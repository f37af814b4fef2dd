"""Predicted time of traced ops and of kernel designs on a device profile.

Per launch: a grid from the op's size, occupancy and waves on the profile, then

    device = max(bytes / hbm_bandwidth / memory_efficiency,
                 flops / rate / efficiency) + launch_gap_s
    time = device + launch_overhead_s

with the two wave-quantisation factors of :class:`attn_sim.occupancy.Waves`: compute-bound
blocks lose the tail wave's idle slots (``exact_waves / ceil(waves)``); bandwidth-bound ones
lose bandwidth only when the tail (or the grid) has fewer blocks than SMs.

A step is its launches in order. ``launch_gap_s`` is device time every launch costs (launch
latency, a tiny kernel's ramp; measured from CUDA-graph replay on the H200: ~2.8 us);
``launch_overhead_s`` is the host's time to issue one launch from eager PyTorch. The device
runs kernels in issue order, so an eager step is simulated as a pipeline: kernel ``i`` starts
once issued (``(i + 1) * launch_overhead_s``) and once kernel ``i - 1`` is done. Short kernels
are then launch-bound (the sum of overheads) and long ones device-bound (the sum of device
times), as eager PyTorch behaves (``time_s``). A CUDA-graph replay (how vLLM runs decode) has
no host issue: ``graph_time_s`` is the sum of device times. ``serial_time_s`` (the plain sum of
both) is kept beside them.

Grids of torch's own kernels (assumed from PyTorch's CUDA sources, good enough to count waves):
elementwise and gather kernels run 128 threads x 4 elements per block (``Loops.cuh``);
reductions 512 threads over 4096 inputs per block; matrix products one block of 128 threads per
64 x 64 output tile (16 x 64 when ``m <= 16``, the decode shape ``group x tokens``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from attn_core.device.spec import DeviceSpec
from attn_sim.designs import KernelDesign, evaluate
from attn_sim.occupancy import Waves, blocks_per_sm, waves
from attn_sim.tracer import OpRecord, Trace

ELEMENTWISE_THREADS, ELEMENTWISE_ITEMS = 128, 4
REDUCE_THREADS, REDUCE_ITEMS = 512, 4096
MATMUL_THREADS, MATMUL_REGS = 128, 128


@dataclass(frozen=True)
class LaunchCost:
    """One launch on a profile: its grid, how it spreads, and its predicted time."""

    name: str
    kind: str
    blocks: int
    blocks_per_sm: int
    waves: int
    efficiency: float  # slot quantisation (compute-bound)
    memory_efficiency: float  # SM quantisation (bandwidth-bound)
    bytes: int
    flops: int
    time_s: float  # device time (with launch_gap_s) + one launch overhead
    memory_s: float  # bytes / bandwidth before wave quantisation
    compute_s: float
    overhead_s: float = 0.0  # the launch overhead included in time_s

    @property
    def device_s(self) -> float:
        return self.time_s - self.overhead_s


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def op_launch_shape(op: OpRecord) -> tuple[int, int, int, int]:
    """``(blocks, threads, registers, shared_mem)`` a CUDA kernel for this op would launch."""
    out = max((_numel(s) for s in op.out_shapes), default=0)
    inp = max((_numel(s) for s in op.in_shapes), default=0)
    if op.cost.kind == "matmul":
        *batch, m, n = op.out_shapes[0]
        tm = 16 if m <= 16 else 64
        blocks = _numel(batch) * _ceil(m, tm) * _ceil(n, 64)
        elem = 2 if op.cost.half_inputs else 4
        smem = 2 * (tm + 64) * 32 * elem  # A and B tiles, k-step 32, double-buffered
        return max(blocks, 1), MATMUL_THREADS, MATMUL_REGS, smem
    if op.cost.kind == "attention":  # one block per (batch x head, 128 query rows)
        *batch, rows, _ = op.in_shapes[0]
        return max(_numel(batch) * _ceil(rows, 128), 1), 128, 128, 2 * 64 * 128 * 2
    if op.cost.kind == "reduction":
        return max(_ceil(inp, REDUCE_ITEMS), 1), REDUCE_THREADS, 32, 0
    work = max(out, inp if op.cost.kind == "sync" else 0)
    return max(_ceil(work, ELEMENTWISE_THREADS * ELEMENTWISE_ITEMS), 1), ELEMENTWISE_THREADS, 32, 0


def _numel(shape: Iterable[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _rate(spec: DeviceSpec, op: OpRecord) -> float:
    if op.cost.half_inputs:
        return spec.fp16_flops
    return spec.fp32_flops


def launch_time(
    spec: DeviceSpec, nbytes: int, flops: int, rate: float, w: Waves
) -> tuple[float, float, float]:
    """``(time, memory_s, compute_s)`` of one launch (the last two before quantisation)."""
    memory_s = nbytes / spec.hbm_bandwidth
    compute_s = flops / rate if rate else 0.0
    busy = max(memory_s / w.memory_efficiency, compute_s / w.efficiency)
    return busy + spec.launch_gap_s + spec.launch_overhead_s, memory_s, compute_s


def op_cost(spec: DeviceSpec, op: OpRecord) -> LaunchCost:
    blocks, threads, regs, smem = op_launch_shape(op)
    occ = blocks_per_sm(spec, threads, regs, min(smem, spec.shared_mem_per_block))
    w = waves(spec, blocks, max(occ.blocks_per_sm, 1))
    nbytes = op.cost.bytes_read + op.cost.bytes_written
    time_s, mem_s, comp_s = launch_time(spec, nbytes, op.cost.flops, _rate(spec, op), w)
    return LaunchCost(
        overhead_s=spec.launch_overhead_s,
        name=op.name,
        kind=op.cost.kind,
        blocks=blocks,
        blocks_per_sm=occ.blocks_per_sm,
        waves=w.waves,
        efficiency=w.efficiency,
        memory_efficiency=w.memory_efficiency,
        bytes=nbytes,
        flops=op.cost.flops,
        time_s=time_s,
        memory_s=mem_s,
        compute_s=comp_s,
    )


@dataclass(frozen=True)
class StepCost:
    """A traced step on a profile."""

    launches: list[LaunchCost]
    peak_bytes: int
    syncs: int

    @property
    def time_s(self) -> float:
        """Pipelined: host issue and device execution overlap (see the module docstring)."""
        return pipelined([c.device_s for c in self.launches], [c.overhead_s for c in self.launches])

    @property
    def graph_time_s(self) -> float:
        """The step replayed from a CUDA graph: device times only, back to back."""
        return sum(c.device_s for c in self.launches)

    @property
    def serial_time_s(self) -> float:
        return sum(c.time_s for c in self.launches)

    @property
    def bytes(self) -> int:
        return sum(c.bytes for c in self.launches)

    @property
    def flops(self) -> int:
        return sum(c.flops for c in self.launches)

    @property
    def max_waves(self) -> int:
        return max((c.waves for c in self.launches), default=0)


def pipelined(device_s: list[float], overhead_s: list[float]) -> float:
    """End time of in-order kernels issued one after another by the host."""
    issued = done = 0.0
    for run, issue in zip(device_s, overhead_s, strict=True):
        issued += issue
        done = max(done, issued) + run
    return done


def step_cost(spec: DeviceSpec, trace: Trace) -> StepCost:
    return StepCost(
        launches=[op_cost(spec, op) for op in trace.kernels()],
        peak_bytes=trace.peak_bytes,
        syncs=trace.syncs,
    )


def design_cost(spec: DeviceSpec, design: KernelDesign) -> LaunchCost:
    """Analytic time of a kernel design (fp32 arithmetic on CUDA cores, as vLLM's kernels, plus
    any on the matrix units at their fp16 rate)."""
    judged = evaluate(spec, design)
    nbytes = design.kv_bytes_read + design.other_bytes
    w = judged.waves
    if w is not None:
        # tensor arithmetic as the fp32 FLOPs that take as long (one rate in launch_time)
        flops = design.flops + design.tensor_flops * spec.fp32_flops / spec.fp16_flops
        time_s, mem_s, comp_s = launch_time(spec, nbytes, flops, spec.fp32_flops, w)
    else:  # cannot launch
        time_s, mem_s, comp_s = float("inf"), nbytes / spec.hbm_bandwidth, 0.0
    return LaunchCost(
        overhead_s=spec.launch_overhead_s,
        name=design.name,
        kind="design",
        blocks=design.blocks,
        blocks_per_sm=judged.occupancy.blocks_per_sm,
        waves=w.waves if w else 0,
        efficiency=w.efficiency if w else 0.0,
        memory_efficiency=w.memory_efficiency if w else 0.0,
        bytes=nbytes,
        flops=design.flops,
        time_s=time_s,
        memory_s=mem_s,
        compute_s=comp_s,
    )
