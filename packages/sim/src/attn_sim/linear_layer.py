"""One Gated DeltaNet (linear-attention) layer priced on a profile, three ways.

- ``fallback``: transformers' ``torch_chunk_gated_delta_rule``, a Python loop over 64-token
  chunks; its recurrent form for decode.
- ``torch``: attn-core's torch path (:mod:`attn_core.linear`): 64-token chunks batched into
  segments (:func:`attn_core.linear.plan.plan_gated_delta`), one state pass a chunk.
- ``native``: attn-core's kernels (``native/csrc/gated_delta.cu``), the chunked prefill's kernel
  chosen as the library chooses it (:func:`attn_core.native.split.native_prefill_kernel`): the
  fused kernel (16-token chunks on CUDA cores, grid ``(V / 32, HV, N)`` x 128 threads, each
  block walking its whole sequence with its state slice in registers) or the chunk-parallel
  pair (``chunk_prep`` over every 64-token chunk of a segment, then ``chunk_pass`` walking the
  segment's chunks with ``V / 16`` blocks a value head), and for 16-bit inputs on a profile
  with NVIDIA's matrix instructions the same pair with 16-bit operands
  (``native/csrc/gated_delta_pair16.cuh``: ``chunk_prep16``, then ``chunk_pass16`` with
  ``V / 32`` blocks a value head, one an SM); decode step grid ``(V / 32, HV / heads_per_block,
  N)``; the width-4 convolution's kernels beside each.

A chunk pass is sequential: a block cannot start chunk ``i + 1`` before chunk ``i``'s state, so
the native prefill is ``waves x chunks x per-chunk latency``, not its FLOPs over the device.
The torch paths are priced as the other eager steps are (:mod:`attn_sim.cost`): the host's
issue of each launch pipelined with the device's work, whichever is longer.

Why counted, not traced: the tracer stops at the torch path's host read of each segment's
validity mask (``attn_core.linear.chunked``), and transformers is not a dependency; the launch
counts are the dispatch counter's (provenance in :data:`PROVENANCE`).

Shapes: 16 key / 32 value heads, K = V = 128, bf16 by default (:class:`LinearShape`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Optional

from attn_core.device.spec import DeviceSpec, occupancy_limits
from attn_core.linear.plan import CHUNK as TORCH_CHUNK
from attn_core.linear.plan import chunk_slot_intermediate_bytes, plan_gated_delta
from attn_core.native.split import (
    CHUNK_PASS16_COLUMNS,
    CHUNK_PASS_COLUMNS,
    NATIVE_WORKSPACE_BYTES,
    chunk_record_bytes,
    chunk_segments,
    chunk_slots,
    native_prefill_kernel,
    pass_wave_seqs,
)
from attn_core.native.split import NATIVE_CHUNK as PAR_CHUNK

FP32 = 4
PATHS = ("fallback", "torch", "native")

# --- transformers' fallback ---------------------------------------------------------------
FALLBACK_CHUNK = 64
FALLBACK_LAUNCHES_PER_CHUNK = 19
# Host seconds one op of the fallback's Python loop costs (slicing, dispatch, launch): the one
# parameter that equalises the error at the H100's two prefill points (83 ms at 32K, 380 ms at
# 128K; 512 and 2048 chunks x 19 launches): +8 % / -8 %. Fitted to 32K alone it missed 128K by
# -15 % (the measured time grows faster than the chunk count).
FALLBACK_HOST_OP_S = 8.9e-6
# The preparation before the loop (cumulated decays, the 63-step intra-chunk solve over every
# chunk at once) holds 5.8 GB at 32K and 23 GB at 128K: ~177 KB a token, written and read once.
FALLBACK_PREP_BYTES_PER_TOKEN = 177e3
FALLBACK_PREP_PASSES = 2
FALLBACK_PREP_LAUNCHES = 63 * 6
# Fp32 state passes of one loop iteration (k_cumdecay @ S, q @ S, the decay and the update:
# read + write): each moves the whole [HV, K, V] state.
FALLBACK_STATE_PASSES = 5
FALLBACK_DECODE_LAUNCHES = 34

# --- attn-core's torch path -----------------------------------------------------------------
TORCH_SEGMENT_LAUNCHES = 44
TORCH_DECODE_LAUNCHES = 47
TORCH_BMM_EFFICIENCY = 0.101

# --- native kernels -------------------------------------------------------------------------
NATIVE_CHUNK = 16
NATIVE_THREADS = 128
NATIVE_COLUMNS = 32
NATIVE_DECODE_REGISTERS = 96
NATIVE_PREFILL_REGISTERS = 168
NATIVE_PREFILL_SMEM = 32192
NATIVE_DECODE_SMEM = 3120
NATIVE_CHUNK_FIXED_S = 1.0e-6
NATIVE_FMA_EFFICIENCY_PER_WARP = 0.0275
NATIVE_FMA_EFFICIENCY_MAX = 0.8
NATIVE_CONV_LAUNCHES_PREFILL = 2
NATIVE_CONV_LAUNCHES_DECODE = 1
# the chunk-parallel pair
PAR_PREP_EFFICIENCY = 0.171
PAR_PREP_THREADS = 256
PAR_PREP_REGISTERS = 128
PAR_PREP_SMEM = 25856
PAR_PASS_THREADS = 128
PAR_PASS_REGISTERS = 156
PAR_PASS_SMEM = 32768
PAR_PASS_EFFICIENCY_PER_WARP = 0.0354
# the 16-bit pair (NVIDIA: mma.sync m16n8k16, ldmatrix, a shared-memory opt-in)
PAIR16_PREP_THREADS = 256
PAIR16_PREP_REGISTERS = 128
PAIR16_PREP_SMEM = 91648
PAIR16_PASS_THREADS = 256
PAIR16_PASS_REGISTERS = 145
PAIR16_PASS_SMEM = 148480
PAIR16_PREP_ROUND_S = 25.3e-6
PAIR16_PASS_STEP_S = 3.15e-6

PROVENANCE = {
    "FALLBACK_LAUNCHES_PER_CHUNK": "measured: ~19 aten launches per 64-token chunk, dispatch "
    "counter over transformers' torch_chunk_gated_delta_rule loop",
    "FALLBACK_HOST_OP_S": "measured: fitted to the H100 fallback prefill, 83 ms at 32K and "
    "380 ms at 128K (one parameter, two points: +/-8 %)",
    "FALLBACK_PREP_BYTES_PER_TOKEN": "measured: transient 5.8 GB at 32K / 23 GB at 128K (H100), "
    "touched twice (assumed)",
    "FALLBACK_PREP_LAUNCHES": "assumed: 63 solve steps x ~6 ops",
    "FALLBACK_STATE_PASSES": "assumed: read/write passes over the fp32 state per chunk",
    "FALLBACK_DECODE_LAUNCHES": "assumed: ~34 launches counted from reading "
    "torch_recurrent_gated_delta_rule (l2 norms, casts, one token's step)",
    "TORCH_SEGMENT_LAUNCHES": "measured: 44 float ops a segment beside one a chunk, dispatch "
    "counter over attn-core's torch path (26- and 40-slot segments, 4 and 8 of them; 54 "
    "before the inputs moved to head-major fp32 in one copy each and the scale was applied once)",
    "TORCH_DECODE_LAUNCHES": "measured: 48 device kernels a step (torch.profiler, H200, "
    "bench/linear_attn_bench.py, batch 1), one of them a copy of the gathered states since "
    "dropped (docs/benchmarks.md#gated-deltanet)",
    "TORCH_BMM_EFFICIENCY": "measured: fitted to attn-core's torch path on an H100 (one layer, "
    "bf16, timed in 40-slot segments, docs/benchmarks.md#gated-deltanet): 25.0 ms at 32K and "
    "110.5 at 128K, one parameter over two points (+5 / -5 %); the host-bound path moved by "
    "up to a quarter between two H100 machines the same day (32K: 25.0 and 31.6 ms)",
    "NATIVE_CHUNK": "source: gated_delta.cu kChunk = 16 (64 does not fit 32 KiB)",
    "NATIVE_PREFILL_SMEM": "measured: the driver's facts of chunked_prefill<128>, nvcc 13 sm_90 "
    "(its static arrays: 32192 B of the BI-V100's 32 KiB)",
    "NATIVE_DECODE_SMEM": "source: gated_delta.cu decode_step's static arrays at K = 128",
    "NATIVE_DECODE_REGISTERS": "measured: the driver's facts of decode_step<128>, nvcc 13 sm_90 "
    "(docs/benchmarks.md#gated-deltanet); CoreX's are not recorded yet",
    "NATIVE_PREFILL_REGISTERS": "measured: the driver's facts of chunked_prefill<128>, nvcc 13 "
    "sm_90 (docs/benchmarks.md#gated-deltanet); CoreX's are not recorded yet",
    "PAR_PREP_EFFICIENCY": "measured: fitted to chunk_prep on an H100 (torch.profiler, 32K "
    "tokens, bf16, docs/benchmarks.md#gated-deltanet): 6.66 ms for 64 rounds of two 4.28 MFLOP "
    "blocks an SM (8-slot segments, one wave each) is 0.162 of an SM's fp32 rate (it then "
    "priced the 13-slot segments' 79 rounds at 8.2 ms, measured 7.94); scaled by the blocked "
    "solve's 6.30 against 6.64 ms (bench/linear_pair_tune.py, one H100, three interleaved "
    "rounds) to 0.171",
    "PAR_PREP_REGISTERS": "measured: ptxas for chunk_prep<128>, nvcc 13 sm_90 (no spill)",
    "PAR_PREP_SMEM": "measured: ptxas for chunk_prep<128>, nvcc 13 sm_90 (its static arrays)",
    "PAR_PASS_REGISTERS": "measured: ptxas for chunk_pass<128>, nvcc 13 sm_90, one block an SM "
    "minimum (no spill)",
    "PAR_PASS_SMEM": "source: chunk_pass's static arrays (two 8 KiB tiles, the 8 KiB state "
    "slice, V' and Qg S) at K = 128",
    "PAR_PASS_EFFICIENCY_PER_WARP": "measured: fitted to the pair on an H100 (32K tokens, "
    "13.89 ms with 8-slot segments, chunk_prep priced as above): two blocks (8 warps) an SM "
    "at 3.54 % of an SM's fp32 rate a warp; it then prices 8K / 128K / 256K within 3 % "
    "(3.48 / 55.5 / 111.1 ms against 3.57 / 55.46 / 110.37) and 8 x 16K 12 % low (49.0 "
    "against 55.9: one-chunk-deep segments, chunk_pass's partial waves not modelled)",
    "PAIR16_PREP_REGISTERS": "measured: the driver's facts of chunk_prep16<128>, nvcc 13 sm_90",
    "PAIR16_PREP_SMEM": "measured: the driver's facts of chunk_prep16<128> (dynamic)",
    "PAIR16_PASS_REGISTERS": "measured: the driver's facts of chunk_pass16<128>, nvcc 13 sm_90",
    "PAIR16_PASS_SMEM": "measured: the driver's facts of chunk_pass16<128> (dynamic: two "
    "stages of a 16-bit record, the state's and V''s 16-bit copies)",
    "PAIR16_PREP_ROUND_S": "measured: chunk_prep16 on an H100 (torch.profiler, 32K tokens, bf16, "
    "docs/benchmarks.md#gated-deltanet): 1.617 ms over 64 rounds of a wave (21 segments of 24 "
    "slots in three rounds, one of 8 in one). Its time is the fp32 solve and the latency between "
    "its barriers, not matrix FLOPs (ncu), so it is priced a round, not a rate; other profiles "
    "than the H100's get the same seconds (assumed)",
    "PAIR16_PASS_STEP_S": "measured: chunk_pass16 on an H100 (same run): 1.682 ms for 512 chunk "
    "steps of one wave (128 blocks on 132 SMs) in 22 segments, each starting with one step "
    "more (states loaded, the first record copied alone): 534 steps, 3.15 us a step, bound by "
    "the ~66 KiB of record each block reads from L2 a step (ncu: L2 at 61 %). The segment's "
    "extra step held at 128K, 8 x 16K and 32 x 2K one sequence at a time (6.53 / 6.55 / 3.34 "
    "ms measured, 6.72 / 6.73 / 3.43 priced) and 8 x 16K with all 8 side by side (8.85 "
    "measured, 86 segments of 8 waves 3 chunks deep, 8.67 priced; 6.79 without the extra "
    "step); the same seconds on other profiles (assumed)",
    "NATIVE_CHUNK_FIXED_S": "assumed: a chunk's eight barriers and its load round trip, 1 us",
    "NATIVE_FMA_EFFICIENCY_PER_WARP": "measured: fitted to the chunked kernel on an H100 (one "
    "layer, bf16, docs/benchmarks.md#gated-deltanet): 22.7 ms at 32K is 11.1 us a 16-token "
    "chunk with one block (4 warps) an SM, 2.75 % of an SM's fp32 rate a warp; the same "
    "latency held at 128K (10.9 us); with two blocks an SM (2 x 16K) a chunk took 13.8 us, "
    "which the model prices at 11.1 (contention not modelled). Capped at 80 %",
}


@dataclass(frozen=True)
class LinearShape:
    """One linear-attention layer: ``num_heads`` key heads, ``num_value_heads`` value heads
    (a multiple), head dims ``head_k`` / ``head_v``, conv ``conv_width``, input ``itemsize``."""

    num_heads: int = 16
    num_value_heads: int = 32
    head_k: int = 128
    head_v: int = 128
    conv_width: int = 4
    itemsize: int = 2

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"LinearShape.{f.name} must be an int >= 1, got {value!r}")
        if self.num_value_heads % self.num_heads:
            raise ValueError(
                f"num_value_heads must be a multiple of num_heads ({self.num_heads}), got "
                f"{self.num_value_heads}"
            )

    @property
    def state_bytes(self) -> int:
        """One sequence's fp32 recurrent state ``[HV, K, V]``."""
        return self.num_value_heads * self.head_k * self.head_v * FP32

    @property
    def token_bytes(self) -> int:
        """Inputs (q, k, v, g, beta) and output of one token."""
        h, hv = self.num_heads, self.num_value_heads
        qkv = (2 * h * self.head_k + hv * self.head_v) * self.itemsize
        return qkv + 2 * hv * FP32 + hv * self.head_v * self.itemsize

    @property
    def conv_dim(self) -> int:
        return 2 * self.num_heads * self.head_k + self.num_value_heads * self.head_v

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> LinearShape:
        """The ``linear_*`` keys of a model config (or of its ``text_config``)."""
        cfg = config.get("text_config", config)
        d = cls()
        return cls(
            num_heads=cfg.get("linear_num_key_heads", d.num_heads),
            num_value_heads=cfg.get("linear_num_value_heads", d.num_value_heads),
            head_k=cfg.get("linear_key_head_dim", d.head_k),
            head_v=cfg.get("linear_value_head_dim", d.head_v),
            conv_width=cfg.get("linear_conv_kernel_dim", d.conv_width),
        )


@dataclass(frozen=True)
class LinearCost:
    """One call of one layer: ``seconds`` (eager: host issue pipelined with the device),
    ``launches``, ``bytes`` and ``flops`` the device moves and does, ``chunks`` of the
    sequential pass and its per-chunk latency (native only), ``waves`` and resident
    ``blocks_per_sm`` of the native kernel (0 for the torch paths)."""

    path: str
    seconds: float
    launches: float
    bytes: float
    flops: float
    chunks: int = 0
    chunk_latency_s: float = 0.0
    waves: int = 0
    blocks_per_sm: int = 0


def _eager(spec: DeviceSpec, launches: float, host_op_s: float, device_s: float) -> float:
    return max(launches * host_op_s, device_s + launches * spec.launch_gap_s)


def _chunk_flops(s: LinearShape, c: int) -> float:
    """FLOPs of one c-token chunk in the WY/UT form, every value head (Gram and scores at key
    heads, the solve's right-hand side, S^T k, S^T q, the state update and the intra output)."""
    h, hv, dk, dv = s.num_heads, s.num_value_heads, s.head_k, s.head_v
    return 2.0 * (2 * h * c * c * dk + hv * (c * c * (dk + dv) / 2 + 3 * c * dk * dv + c * c * dv))


def fallback_prefill(spec: DeviceSpec, s: LinearShape, tokens: int) -> LinearCost:
    chunks = math.ceil(tokens / FALLBACK_CHUNK)
    launches = chunks * FALLBACK_LAUNCHES_PER_CHUNK + FALLBACK_PREP_LAUNCHES
    prep = FALLBACK_PREP_PASSES * FALLBACK_PREP_BYTES_PER_TOKEN * tokens
    nbytes = prep + chunks * FALLBACK_STATE_PASSES * s.state_bytes + tokens * s.token_bytes
    flops = chunks * _chunk_flops(s, FALLBACK_CHUNK)
    device = max(nbytes / spec.hbm_bandwidth, flops / (spec.fp32_flops * TORCH_BMM_EFFICIENCY))
    seconds = _eager(spec, launches, FALLBACK_HOST_OP_S, device)
    return LinearCost("fallback", seconds, launches, nbytes, flops, chunks)


def torch_prefill(spec: DeviceSpec, s: LinearShape, tokens: int) -> LinearCost:
    plan = plan_gated_delta(s.num_heads, s.num_value_heads, s.head_k, s.head_v, s.itemsize)
    chunks = math.ceil(tokens / TORCH_CHUNK)
    launches = chunks * (1 + TORCH_SEGMENT_LAUNCHES / plan.segment_chunks)
    # Each slot's intermediates written and read once, the state read and written each chunk.
    slot = chunk_slot_intermediate_bytes(s.num_heads, s.num_value_heads, s.head_k, s.head_v,
                                         s.itemsize, TORCH_CHUNK)  # fmt: skip
    nbytes = chunks * (2 * slot + 2 * s.state_bytes) + tokens * s.token_bytes
    flops = chunks * _chunk_flops(s, TORCH_CHUNK)
    device = max(nbytes / spec.hbm_bandwidth, flops / (spec.fp32_flops * TORCH_BMM_EFFICIENCY))
    seconds = _eager(spec, launches, spec.launch_overhead_s, device)
    return LinearCost("torch", seconds, launches, nbytes, flops, chunks)


def native_occupancy(spec: DeviceSpec, registers: int, smem: int) -> int:
    """Resident blocks per SM of a 128-thread native block (0: it cannot launch)."""
    return min(occupancy_limits(spec, NATIVE_THREADS, registers, smem).values())


def has_pair16(spec: DeviceSpec, s: LinearShape) -> bool:
    """Whether the library runs the 16-bit pair for ``s`` on ``spec``: 16-bit inputs at K = 128
    and V a multiple of 32 up to 128, on an NVIDIA device (32-lane warps: the pair's
    mma.sync / ldmatrix; CoreX's 64-lane warps have neither) whose opt-in shared memory holds
    chunk_pass16's stages."""
    return (
        s.itemsize == 2
        and s.head_k == 128
        and s.head_v % CHUNK_PASS16_COLUMNS == 0
        and s.head_v <= 128
        and spec.warp_size == 32
        and spec.shared_mem_per_block_optin >= PAIR16_PASS_SMEM
    )


def native_prefill(spec: DeviceSpec, s: LinearShape, tokens: int, num_seqs: int = 1) -> LinearCost:
    """``num_seqs`` sequences of ``tokens`` on the kernel the library picks for them."""
    pair16 = has_pair16(spec, s)
    kernel = native_prefill_kernel(num_seqs, s.num_value_heads, s.head_v, spec.sm_count, pair16)
    if pair16:
        return pair16_prefill(spec, s, tokens, num_seqs)
    if kernel == "chunk_parallel":
        return chunk_parallel_prefill(spec, s, tokens, num_seqs)
    return fused_prefill(spec, s, tokens, num_seqs)


def pair16_prefill(spec: DeviceSpec, s: LinearShape, tokens: int, num_seqs: int = 1) -> LinearCost:
    """The 16-bit pair over the library's segments (16-bit records: twice the slots of the
    fp32 pair's, rounded to whole waves of ``chunk_prep16``): per segment ``chunk_prep16`` in
    rounds of a wave at a measured time a round, then ``chunk_pass16`` at a measured time a
    chunk step a wave of its blocks (one an SM), plus one step a wave for the segment's start
    (its states loaded, its first record copied with nothing to overlap)."""
    c, hv, dk, dv = PAR_CHUNK, s.num_value_heads, s.head_k, s.head_v
    record = chunk_record_bytes(dk, dv, operands16=True)
    # both kernels opt in to more shared memory than a launch gets by default
    optin = spec.with_overrides(shared_mem_per_block=spec.shared_mem_per_block_optin)
    prep_per_sm = _resident(optin, "chunk_prep16", PAIR16_PREP_THREADS, PAIR16_PREP_REGISTERS,
                            PAIR16_PREP_SMEM)  # fmt: skip
    prep_wave = spec.sm_count * prep_per_sm
    slots = chunk_slots(hv, dk, dv, NATIVE_WORKSPACE_BYTES, prep_wave_blocks=prep_wave,
                        operands16=True)  # fmt: skip
    chunks = math.ceil(tokens / c)
    pass_per_sm = _resident(optin, "chunk_pass16", PAIR16_PASS_THREADS, PAIR16_PASS_REGISTERS,
                            PAIR16_PASS_SMEM)  # fmt: skip
    side_by_side = pass_wave_seqs(spec.sm_count * pass_per_sm, hv, dv, operands16=True)
    _, segments = chunk_segments([chunks] * num_seqs, slots, side_by_side)
    prep_s = pass_s = 0.0
    waves = 0
    for _, width, _, depth in segments:
        prep_s += math.ceil(width * depth * hv / prep_wave) * PAIR16_PREP_ROUND_S
        blocks = (dv // CHUNK_PASS16_COLUMNS) * hv * width
        seg_waves = math.ceil(blocks / (spec.sm_count * pass_per_sm))
        pass_s += seg_waves * (depth + 1) * PAIR16_PASS_STEP_S
        waves = max(waves, seg_waves)
    # matrix FLOPs: the Gram and score products, W and U, then [W; Qg] S, P V' and Kd^T V'
    per_record = 2.0 * (2 * c * c * dk + c * c * (dk + dv) + 3 * c * dk * dv + c * c * dv)
    return _pair_cost(spec, s, tokens, num_seqs, len(segments), prep_s + pass_s, record,
                      chunks * num_seqs * hv * per_record, PAIR16_PASS_STEP_S, waves,
                      pass_per_sm)  # fmt: skip


def _resident(spec: DeviceSpec, kernel: str, threads: int, registers: int, smem: int) -> int:
    """Blocks of ``kernel`` an SM of ``spec`` holds at once (ValueError naming the kernel and
    the budget when none fits)."""
    per_sm = min(occupancy_limits(spec, threads, registers, smem).values())
    if per_sm == 0:
        raise ValueError(
            f"{kernel} needs {smem} bytes of shared memory and {registers} registers a thread "
            f"({threads} threads); the profile {spec.name} allows "
            f"{spec.shared_mem_per_block} bytes a block"
        )
    return per_sm


def chunk_parallel_prefill(
    spec: DeviceSpec, s: LinearShape, tokens: int, num_seqs: int = 1
) -> LinearCost:
    """The chunk-parallel pair over the library's segments (their slots rounded to whole waves
    of ``chunk_prep``, as the library rounds them): per segment ``chunk_prep`` in rounds of a
    wave at a fitted share of the fp32 rate, then ``chunk_pass``, which walks the
    segment's chunk positions one after another (its blocks beyond one wave wait for a whole
    earlier wave), the final state carried in the caller's buffer."""
    c, hv, dk, dv = PAR_CHUNK, s.num_value_heads, s.head_k, s.head_v
    record = chunk_record_bytes(dk, dv)
    prep_per_sm = _resident(spec, "chunk_prep", PAR_PREP_THREADS, PAR_PREP_REGISTERS, PAR_PREP_SMEM)
    prep_wave = spec.sm_count * prep_per_sm
    slots = chunk_slots(hv, dk, dv, NATIVE_WORKSPACE_BYTES, prep_wave_blocks=prep_wave)
    chunks = math.ceil(tokens / c)
    per_sm = _resident(spec, "chunk_pass", PAR_PASS_THREADS, PAR_PASS_REGISTERS, PAR_PASS_SMEM)
    side_by_side = pass_wave_seqs(spec.sm_count * per_sm, hv, dv, operands16=False)
    _, segments = chunk_segments([chunks] * num_seqs, slots, side_by_side)
    prep_flops = 2.0 * (2 * c * c * dk + c * c * (dk + dv)) + c**3 / 3
    pass_flops = 2.0 * (
        2 * c * dk * CHUNK_PASS_COLUMNS + c * c * CHUNK_PASS_COLUMNS + dk * c * CHUNK_PASS_COLUMNS
    )
    sm_rate = spec.fp32_flops / spec.sm_count
    prep_s = pass_s = 0.0
    latency = 0.0
    waves = 0
    for _, width, _, depth in segments:
        records = width * depth * hv
        # whole rounds: a wave's blocks finish together, however full the last wave is
        rounds = math.ceil(records / prep_wave)
        prep_s += max(
            rounds * prep_per_sm * prep_flops / (sm_rate * PAR_PREP_EFFICIENCY),
            2 * records * record / spec.hbm_bandwidth,
        )
        blocks = (dv // CHUNK_PASS_COLUMNS) * hv * width
        resident = min(per_sm, math.ceil(blocks / spec.sm_count))
        seg_waves = math.ceil(blocks / (spec.sm_count * per_sm))
        warps = resident * math.ceil(PAR_PASS_THREADS / spec.warp_size)
        eff = min(NATIVE_FMA_EFFICIENCY_MAX, PAR_PASS_EFFICIENCY_PER_WARP * warps)
        latency = resident * pass_flops / (sm_rate * eff)
        pass_s += seg_waves * depth * latency
        waves = max(waves, seg_waves)
    flops = chunks * num_seqs * hv * (prep_flops + (dv // CHUNK_PASS_COLUMNS) * pass_flops)
    return _pair_cost(spec, s, tokens, num_seqs, len(segments), prep_s + pass_s, record, flops,
                      latency, waves, per_sm)  # fmt: skip


def _pair_cost(
    spec: DeviceSpec,
    s: LinearShape,
    tokens: int,
    num_seqs: int,
    segments: int,
    kernels_s: float,
    record: int,
    flops: float,
    chunk_latency_s: float,
    waves: int,
    blocks_per_sm: int,
) -> LinearCost:
    """A chunk-parallel pair's call: its two kernels a segment (``kernels_s`` in all), each
    record written once and read once, the inputs, outputs and states, and the convolutions'
    kernels beside it."""
    chunks = math.ceil(tokens / PAR_CHUNK)
    conv_bytes = 2 * tokens * num_seqs * s.conv_dim * s.itemsize
    launches = 2 * segments + NATIVE_CONV_LAUNCHES_PREFILL
    seconds = kernels_s + conv_bytes / spec.hbm_bandwidth + launches * spec.launch_gap_s
    records_all = chunks * num_seqs * s.num_value_heads
    nbytes = 2 * records_all * record + num_seqs * (tokens * s.token_bytes + 2 * s.state_bytes)
    return LinearCost(
        "native", seconds, launches, nbytes + conv_bytes, flops, chunks, chunk_latency_s, waves,
        blocks_per_sm,
    )  # fmt: skip


def fused_prefill(spec: DeviceSpec, s: LinearShape, tokens: int, num_seqs: int = 1) -> LinearCost:
    """The fused chunked kernel: every block walks ``tokens`` in 16-token chunks; blocks beyond
    one wave wait for a whole earlier block to finish its sequence."""
    blocks = (s.head_v // NATIVE_COLUMNS) * s.num_value_heads * num_seqs
    per_sm = native_occupancy(spec, NATIVE_PREFILL_REGISTERS, NATIVE_PREFILL_SMEM)
    if per_sm == 0:
        raise ValueError(
            f"native chunked prefill needs {NATIVE_PREFILL_SMEM} bytes of shared memory, the "
            f"profile {spec.name} allows {spec.shared_mem_per_block}"
        )
    resident = min(per_sm, math.ceil(blocks / spec.sm_count))
    waves = math.ceil(blocks / (spec.sm_count * per_sm))
    chunks = math.ceil(tokens / NATIVE_CHUNK)
    c, cols = NATIVE_CHUNK, NATIVE_COLUMNS
    # Per block and chunk: S^T k, S^T q and the state update on its K x 32 slice, and the Gram
    # and score matrices each block recomputes for itself, the solve and intra output.
    block_flops = 2.0 * (3 * c * s.head_k * cols + 2 * c * c * s.head_k + 1.5 * c * c * cols)
    warps = resident * math.ceil(NATIVE_THREADS / spec.warp_size)
    eff = min(NATIVE_FMA_EFFICIENCY_MAX, NATIVE_FMA_EFFICIENCY_PER_WARP * warps)
    sm_rate = spec.fp32_flops / spec.sm_count * eff
    latency = resident * block_flops / sm_rate + NATIVE_CHUNK_FIXED_S
    nbytes = num_seqs * (tokens * s.token_bytes + 2 * s.state_bytes)
    pass_s = max(waves * chunks * latency, nbytes / spec.hbm_bandwidth)
    conv_bytes = 2 * tokens * num_seqs * s.conv_dim * s.itemsize
    launches = 1 + NATIVE_CONV_LAUNCHES_PREFILL
    seconds = pass_s + conv_bytes / spec.hbm_bandwidth + launches * spec.launch_gap_s
    flops = chunks * block_flops * blocks
    return LinearCost(
        "native", seconds, launches, nbytes + conv_bytes, flops, chunks, latency, waves, per_sm
    )


def prefill(
    spec: DeviceSpec, s: LinearShape, path: str, tokens: int, chunk: Optional[int] = None
) -> float:
    """Seconds for one layer to prefill ``tokens`` in calls of ``chunk`` tokens (None: one
    call). The state carries between calls, so the calls add up."""
    price = {"fallback": fallback_prefill, "torch": torch_prefill, "native": native_prefill}
    if path not in price:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    step = chunk or tokens
    full, rest = divmod(tokens, step)
    total = full * price[path](spec, s, step).seconds
    return total + (price[path](spec, s, rest).seconds if rest else 0.0)


def decode(spec: DeviceSpec, s: LinearShape, path: str, num_seqs: int = 1) -> LinearCost:
    """One decode token per sequence: the torch paths eager (host issue pipelined with the
    device), the native kernels as a CUDA-graph replay (device time alone)."""
    nbytes = num_seqs * (2 * s.state_bytes + s.token_bytes)
    flops = num_seqs * s.num_value_heads * 6.0 * s.head_k * s.head_v
    memory_s = nbytes / spec.hbm_bandwidth
    if path == "fallback":
        # The step is ~10 elementwise passes over the state, not one.
        dev = 5 * memory_s
        t = _eager(spec, FALLBACK_DECODE_LAUNCHES, FALLBACK_HOST_OP_S, dev)
        return LinearCost(path, t, FALLBACK_DECODE_LAUNCHES, 5 * nbytes, flops)
    if path == "torch":
        launches = TORCH_DECODE_LAUNCHES
        t = _eager(spec, launches, spec.launch_overhead_s, 2 * memory_s)
        return LinearCost(path, t, launches, 2 * nbytes, flops)
    if path != "native":
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    per_sm = native_occupancy(spec, NATIVE_DECODE_REGISTERS, NATIVE_DECODE_SMEM)
    slices = s.head_v // NATIVE_COLUMNS
    group = s.num_value_heads // s.num_heads
    hpb = 1
    for cand in range(1, group + 1):
        if (
            group % cand == 0
            and num_seqs * (s.num_value_heads // cand) * slices >= 4 * spec.sm_count
        ):
            hpb = cand
    blocks = slices * (s.num_value_heads // hpb) * num_seqs
    waves = math.ceil(blocks / (spec.sm_count * per_sm))
    # Fewer than ~4 resident blocks an SM leave bandwidth unused (the kernel's own comment).
    share = min(1.0, blocks / (4 * spec.sm_count))
    launches = 1 + NATIVE_CONV_LAUNCHES_DECODE
    # Capturable (no host sync, no allocation): priced as a CUDA-graph replay, device time.
    t = memory_s / share + launches * spec.launch_gap_s
    return LinearCost(path, t, launches, nbytes, flops, 0, 0.0, waves, per_sm)
