"""Launch plan for paged decode: which tier, how many partitions, how much workspace.

The plan is the single source of truth for decode's launch decisions;
:mod:`attn_core.runtime.decode`
executes it and the simulator charges its ``steps`` against a :class:`DeviceSpec`. A plan is
per backend: :class:`DecodePlan` for the torch path (this module), :class:`~attn_core.
plan_native.NativeDecodePlan` for the native kernel; :func:`plan_decode` picks one.

Tiers (``tier``, :data:`attn_core.core.settings.DECODE_TIERS`):

- ``single_tile``: the whole (padded) context fits one partition whose logits fit the block's
  shared memory; direct softmax . V, no partition machinery. One step.
- ``one_pass``: the batch alone has enough softmax rows (``num_seqs x num_heads``) to fill the
  device (see :data:`ONE_PASS_MIN_SOFTMAX_FILL`); a device kernel would loop over tiles with an
  online softmax. The torch path computes the same exact whole-sequence softmax as ``single_tile``.
  One step.
- ``partitioned``: phase 1 computes every partition's max, exp-sum and unnormalised partial
  output at once; phase 2 merges them by log-sum-exp in fp32 and divides on the output side.

The tier is chosen for the code that runs (the torch path): one_pass over partitioned once the
softmax rows fill at least :data:`ONE_PASS_MIN_SOFTMAX_FILL` of the device's resident softmax
blocks (measured on the H200, see the constant). The steps still describe the device kernel of
the chosen tier, so the simulator judges its grid, shared memory and waves.

Partition count (partitioned tier) follows CUB's even-share rule: the phase-1 grid should offer
``blocks_per_sm x sm_count x SUBSCRIPTION`` blocks, so ``num_partitions`` =
``ceil(target / (num_seqs x num_kv_heads))``, then the partition size is rounded up to a
multiple of the block size and clamped to [``MIN_PARTITION``, what shared memory holds].

``stream_tokens`` (streaming mode) caps the tokens processed per chunk: the executor then loops
over ``num_chunks`` fixed-size chunks (a Python loop over chunks, the one loop decode has) and
merges them online, so transient memory is bounded by the chunk, not the context.

Inputs are explicit (:func:`plan_decode` is a pure function): the shape
(:class:`~attn_core.core.shapes.AttentionShape`), the lengths (:class:`DecodeLengths`), the device
profile, its :class:`~attn_core.device.capabilities.Capabilities` and the
:class:`~attn_core.core.settings.DecodeOverrides` (tier, partition size, single-tile limit,
subscription, streaming, score rounding, gather width; ``ATTN_CORE_DECODE_*`` in the
environment, read by :mod:`attn_core.core.settings` only). Nothing here probes a device or loads a
kernel: :func:`attn_core.runtime.resolve.decode_plan_for` resolves the last three from a device and
the settings, for callers at the API boundary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch

from attn_core.core.checks import check_positive, check_types
from attn_core.core.plan_types import KernelStep
from attn_core.core.settings import DecodeOverrides
from attn_core.core.shapes import AttentionShape
from attn_core.decode.plan_native import (
    DecodeStep,
    NativeDecodePlan,
    choose_backend,
    plan_native_decode,
    step_sizes,
)
from attn_core.device.capabilities import Capabilities
from attn_core.device.spec import DeviceSpec, occupancy_limits

# Even-share oversubscription: 2 waves' worth of blocks lets the tail wave of uneven partitions
# overlap the next (CUB uses a subscription factor for the same reason). Swept in the simulator
# (`python -m attn_sim sweep`, bi-v100, decode 1/8 x 8K-256K and 64 x 8K, traced): 1, 2, 4 and
# 8 all land within 0.2 % of each other (geomean 0.9981 / 1 / 0.9995 / 0.9999), so the value
# is not critical; 2 stays. Not measured on a device.
SUBSCRIPTION = 2
# Below 256 tokens a partition's fixed cost (its q load, stats, merge row) dominates its K/V
# read; vLLM's V2 kernel uses 512. The same simulator sweep prices fixed partition sizes
# against even-share with this floor: 256 +2.9 %, 512 +3.4 %, 1024 +5.3 % (2048 and 4096 no
# longer fit shared memory); the H200 runs in docs/benchmarks.md#torch-path use the resulting
# 256-token partitions at 1 x 8K-100K. Not swept on a device.
MIN_PARTITION = 256
# Four warps per block: one warp per 16-byte K vector lane group, as vLLM's kernels use 128
# threads on 32-wide warps. Registers per thread assumed from vLLM's kernels (about 64-96).
WARPS_PER_BLOCK = 4
REGISTERS_PER_THREAD = 64
# Shared memory for the cross-warp reductions (max and sum): 2 floats per warp plus padding.
REDUCE_SCRATCH_BYTES = 2 * 4 * 32

# Tier rule of the torch path, from GPU run 2 (H200, torch 2.11, Qwen3.6 24/4 heads, head 256,
# fp16, CUDA-graph replay; bench/decode_bench.py). one_pass ends in torch's softmax over
# [rows, context] with rows = num_seqs x num_heads; for long rows torch's CUDA softmax runs one
# block of up to 1024 threads per row (aten/native/cuda/SoftMax.cu), so few rows leave SMs idle,
# while partitioned splits rows into partitions at the price of 9 more launches (~25 us
# replayed). Measured, ms, partitioned -> one_pass:
#   24 rows:   1x32K 0.220 -> 0.273, 1x100K 0.536 -> 0.752 (1x8K 0.113 -> 0.109: launches)
#   192 rows:  8x8K 0.377 -> 0.333, 8x32K 1.20 -> 1.13, 8x100K 3.94 -> 3.62
#   1536 rows: 64x8K 2.62 -> 2.51
# The H200 keeps 2 such blocks per SM (2048 threads), 264 in all: 24 rows (9%) lost, 192 rows
# (73%) won. The threshold sits between them at half, 132 rows (one per SM) on the H200. Other
# devices are extrapolated by their resident-block count (bi-v100: 4 per SM x 16 SMs, so 32
# rows: Qwen batch 1, 24 rows, stays partitioned; batch 2 takes one_pass), unmeasured there.
SOFTMAX_THREADS = 1024
ONE_PASS_MIN_SOFTMAX_FILL = 0.5


@dataclass(frozen=True)
class DecodePlan(DecodeStep):
    """What one decode step of the torch path will do (the fields of
    :class:`~attn_core.decode.plan_native.DecodeStep`, then its own).

    Attributes:
        tier: one of :data:`attn_core.core.settings.DECODE_TIERS`.
        num_partitions: partitions per chunk (1 unless ``tier == "partitioned"``).
        chunk_tokens: tokens processed per chunk (``num_partitions * partition_size``).
        num_chunks: chunks (1 unless streaming).
        streaming: whether the executor loops over chunks.
        gather_bytes: element width of the block gathers (16 or 8).
        matmul_dtype: dtype of K, V and probabilities in the bmms: the compute dtype, or fp32
            where this torch has no bmm for it (torch 2.1's CPU has none for fp16).
        score_input_dtype: dtype of q and K in the score bmm (fp32 unless the device's bmm
            writes fp32 from fp16/bf16, or ``scores_in_compute_dtype``).
        scores_fp32_from_bmm: the device's bmm writes fp32 scores from fp16/bf16 inputs; if not,
            keys are upcast to fp32 before the score product (exact fp32 scores either way).
        scores_in_compute_dtype: opt-in (``DecodeOverrides.scores="compute"``): the score bmm
            writes the compute dtype, converted to fp32 after (no key upcast, rounded scores).
        workspace_bytes: bytes of scratch one step needs (reused across calls).
        steps: launches as a device would run them; grids are
            ``(num_seqs, num_kv_heads, num_partitions)``.
        device_spec: the profile the plan was made for.
        backend_reason: why the torch path was chosen (an override, the native kernel not
            built or not verified here, ...).
    """

    chunk_tokens: int
    num_chunks: int
    streaming: bool
    gather_bytes: int
    matmul_dtype: torch.dtype
    score_input_dtype: torch.dtype
    compute_dtype: torch.dtype
    scores_fp32_from_bmm: bool
    scores_in_compute_dtype: bool
    workspace_bytes: int
    steps: tuple[KernelStep, ...]
    device_spec: DeviceSpec
    backend_reason: str = ""

    backend = "torch"


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _threads(spec: DeviceSpec) -> int:
    return WARPS_PER_BLOCK * spec.warp_size


def _smem_bytes(spec: DeviceSpec, group: int, head_size: int, elem: int, logits: int) -> int:
    """One block's shared memory: the group's queries, ``logits`` fp32 scores per query head."""
    raw = group * head_size * elem + group * logits * 4 + REDUCE_SCRATCH_BYTES
    return _round_up(raw, spec.shared_mem_alloc_unit)


def blocks_per_sm(spec: DeviceSpec, threads: int, smem: int, regs: int) -> int:
    """Resident blocks per SM: the shared occupancy rule (0 where the block cannot launch)."""
    return max(0, min(occupancy_limits(spec, threads, regs, smem).values()))


def softmax_row_slots(spec: DeviceSpec) -> int:
    """Softmax rows the device runs at once: resident 1024-thread blocks per SM x SMs."""
    return blocks_per_sm(spec, min(SOFTMAX_THREADS, spec.max_threads_per_block), 0, 0) * (
        spec.sm_count
    )


def one_pass_fills_device(spec: DeviceSpec, num_seqs: int, num_heads: int) -> bool:
    """Whether the torch path's one_pass beats partitioned (:data:`ONE_PASS_MIN_SOFTMAX_FILL`)."""
    return num_seqs * num_heads >= ONE_PASS_MIN_SOFTMAX_FILL * softmax_row_slots(spec)


def _largest_partition(spec: DeviceSpec, group: int, head_size: int, elem: int, bs: int) -> int:
    """Longest partition whose logits (all ``group`` heads, fp32) fit one block's shared memory."""
    free = spec.shared_mem_per_block - group * head_size * elem - REDUCE_SCRATCH_BYTES
    return max(bs, (free // (4 * group)) // bs * bs)


def _even_share(
    spec: DeviceSpec,
    span: int,
    rows: int,
    group: int,
    head_size: int,
    elem: int,
    block_size: int,
    largest: int,
    subscription: int,
    threads: int,
) -> tuple[int, int]:
    """``(partition_size, partitions wanted)`` so ``rows x partitions`` fills the device.

    Occupancy depends on the partition's shared memory, which depends on the partition size,
    so the size is settled by two rounds (the second never moves it by more than the first).
    """
    ps = _round_up(MIN_PARTITION, block_size)
    wanted = 1
    for _ in range(2):
        smem = _smem_bytes(spec, group, head_size, elem, ps)
        occupancy = max(1, blocks_per_sm(spec, threads, smem, REGISTERS_PER_THREAD))
        wanted = max(1, -(-occupancy * spec.sm_count * subscription // rows))
        ps = _round_up(-(-span // wanted), block_size)
        ps = min(max(ps, _round_up(MIN_PARTITION, block_size)), max(largest, block_size))
    return ps, wanted


AnyDecodePlan = Union["DecodePlan", NativeDecodePlan]


@dataclass(frozen=True)
class DecodeLengths:
    """The lengths one decode step is planned for.

    Attributes:
        num_seqs: sequences in the batch (one query token each).
        max_seq_len: upper bound on ``seq_lens`` (may exceed all of them).
        max_blocks_per_seq: width of ``block_tables``; caps the context at its capacity.
    """

    num_seqs: int
    max_seq_len: int
    max_blocks_per_seq: Optional[int] = None

    def __post_init__(self) -> None:
        check_positive("num_seqs", self.num_seqs)
        check_positive("max_seq_len", self.max_seq_len)
        blocks = self.max_blocks_per_seq
        if blocks is not None and (
            isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 1
        ):
            raise ValueError(f"max_blocks_per_seq must be None or a positive int, got {blocks!r}")

    def context_tokens(self, block_size: int) -> int:
        """Tokens one step covers: ``max_seq_len``, capped at the block table's capacity
        (``max_blocks_per_seq x block_size``) when its width is known. Both backends plan
        this many."""
        if self.max_blocks_per_seq is None:
            return self.max_seq_len
        return min(self.max_seq_len, self.max_blocks_per_seq * block_size)


@dataclass(frozen=True)
class _Inputs:
    """What :func:`plan_decode` resolved from its arguments before choosing anything."""

    shape: AttentionShape
    num_seqs: int
    context: int  # tokens the step covers: min(max_seq_len, table capacity)
    span: int  # tokens one launch covers: the padded context, or one streamed chunk of it
    padded: int  # the padded context (block_size - 1 masked slots after the longest sequence)
    max_blocks_per_seq: Optional[int]
    streaming: bool
    forced_tier: Optional[str]
    forced_partition: Optional[int]
    tile_max: int  # longest span the single_tile tier takes
    largest: int  # longest partition whose logits fit one block's shared memory
    subscription: int
    gather_bytes: int
    matmul_dtype: torch.dtype
    score_input: torch.dtype
    in_compute: bool  # scores rounded to the compute dtype (opt-in)
    scores_fp32_from_bmm: bool


def plan_decode(
    shape: AttentionShape,
    lengths: DecodeLengths,
    spec: DeviceSpec,
    caps: Capabilities,
    overrides: Optional[DecodeOverrides] = None,
) -> AnyDecodePlan:
    """Plan one decode step: a pure function of its arguments (no environment, no kernels).

    Args:
        shape: heads, head size, block size, compute and cache dtypes.
        lengths: batch size, ``max_seq_len`` and the block table's width.
        spec: the device profile whose grids, shared memory and occupancy the plan sizes for.
        caps: what the device can do for ``shape.dtype`` (fp32 bmm output, half bmm, whether
            the native kernel is built and verified here).
        overrides: decisions forced from outside; None fields let the plan decide.
    Returns:
        a :class:`DecodePlan` (torch path) or a
        :class:`~attn_core.decode.plan_native.NativeDecodePlan`,
        its ``backend_reason`` saying why (:func:`attn_core.decode.plan_native.choose_backend`).
    """
    check_types(
        ("shape", shape, AttentionShape), ("lengths", lengths, DecodeLengths),
        ("spec", spec, DeviceSpec), ("caps", caps, Capabilities),
        ("overrides", overrides, DecodeOverrides),
    )  # fmt: skip
    overrides = overrides or DecodeOverrides()
    backend, why = choose_backend(caps, overrides)
    if backend == "native":
        context = lengths.context_tokens(shape.block_size)
        return plan_native_decode(shape, lengths.num_seqs, context, spec, why)
    inputs = _resolve(shape, lengths, spec, caps, overrides)
    tier, ps = _choose_tier(inputs, spec)
    return _size(inputs, spec, tier, ps, why)


def _resolve(
    shape: AttentionShape,
    lengths: DecodeLengths,
    spec: DeviceSpec,
    caps: Capabilities,
    overrides: DecodeOverrides,
) -> _Inputs:
    bs, elem = shape.block_size, shape.element_size
    context = lengths.context_tokens(bs)
    forced_ps = overrides.partition_size
    if forced_ps is not None and forced_ps % bs:
        raise ValueError(f"partition_size must be a multiple of block_size ({bs}), got {forced_ps}")
    largest = _largest_partition(spec, shape.group, shape.head_size, elem, bs)
    # Every sequence's row keeps block_size - 1 slots past its last token (max_seq_len at
    # most): decode zeroes those value slots with one fixed-size index_put (see decode.py).
    padded = _round_up(context + bs - 1, bs)
    stream = overrides.stream_tokens
    span = min(padded, max(bs, stream // bs * bs)) if stream else padded
    scores = overrides.scores or "fp32"
    matmul_dtype = shape.dtype if caps.half_matmul else torch.float32
    exact_fp32 = caps.bmm_writes_fp32 and caps.half_matmul
    in_compute = scores == "compute" and elem != 4 and not exact_fp32 and caps.half_matmul
    return _Inputs(
        shape=shape,
        num_seqs=lengths.num_seqs,
        context=context,
        span=span,
        padded=padded,
        max_blocks_per_seq=lengths.max_blocks_per_seq,
        streaming=stream is not None,
        forced_tier=overrides.tier,
        forced_partition=forced_ps,
        tile_max=overrides.single_tile_max or largest,
        largest=largest,
        subscription=overrides.subscription or SUBSCRIPTION,
        gather_bytes=overrides.gather_bytes or 16,
        matmul_dtype=matmul_dtype,
        score_input=shape.dtype if (in_compute or exact_fp32) else torch.float32,
        in_compute=in_compute,
        scores_fp32_from_bmm=caps.bmm_writes_fp32,
    )


def _choose_tier(inputs: _Inputs, spec: DeviceSpec) -> tuple[str, int]:
    """``(tier, partition size)``: the forced tier, else by span, shared memory and batch."""
    s = inputs.shape
    rows = inputs.num_seqs * s.num_kv_heads
    ps, _ = _even_share(
        spec, inputs.span, rows, s.group, s.head_size, s.element_size, s.block_size,
        inputs.largest, inputs.subscription, _threads(spec),
    )  # fmt: skip
    if inputs.forced_partition is not None:
        # capped at the span: a longer partition only pads the step with masked slots (a
        # forced 2^24 for a 100-token step sized 211 MB of scratch). Capped, the
        # partitioned tier runs one partition of the span.
        ps = min(inputs.forced_partition, inputs.span)
    if inputs.forced_tier is not None:
        return inputs.forced_tier, ps
    if inputs.span <= inputs.tile_max:
        return "single_tile", ps
    fills = one_pass_fills_device(spec, inputs.num_seqs, s.num_heads)
    if inputs.span <= ps or (inputs.forced_partition is None and fills):
        return "one_pass", ps  # the batch's softmax rows alone fill the device
    return "partitioned", ps


def _size(inputs: _Inputs, spec: DeviceSpec, tier: str, ps: int, why: str) -> DecodePlan:
    """Partitions, chunks, launches and workspace of the chosen tier."""
    s = inputs.shape
    if tier == "partitioned":
        chunk = _round_up(inputs.span, ps)
        num_partitions = chunk // ps
    else:
        chunk = ps = inputs.span
        num_partitions = 1
    num_chunks = -(-inputs.padded // chunk)
    elem, cache_elem = s.element_size, s.cache_element_size
    steps = _steps(
        spec, tier, inputs.num_seqs, s.num_kv_heads, s.group, s.head_size, elem, ps,
        num_partitions, num_chunks, _threads(spec),
    )  # fmt: skip
    workspace = _workspace_bytes(
        inputs.num_seqs, s.num_kv_heads, s.group, s.head_size, elem, cache_elem, chunk,
        num_partitions, tier, inputs.score_input != torch.float32 or elem == 4,
        inputs.streaming, inputs.matmul_dtype, inputs.in_compute,
    )  # fmt: skip
    return DecodePlan(
        tier=tier,
        **step_sizes(s, inputs.num_seqs, inputs.context),
        partition_size=ps,
        num_partitions=num_partitions,
        chunk_tokens=chunk,
        num_chunks=num_chunks,
        streaming=inputs.streaming,
        gather_bytes=inputs.gather_bytes,
        matmul_dtype=inputs.matmul_dtype,
        score_input_dtype=inputs.score_input,
        compute_dtype=s.dtype,
        cache_element_size=cache_elem,
        scores_fp32_from_bmm=inputs.scores_fp32_from_bmm,
        scores_in_compute_dtype=inputs.in_compute,
        workspace_bytes=workspace,
        steps=steps,
        device_spec=spec,
        backend_reason=why,
    )


def _steps(
    spec: DeviceSpec,
    tier: str,
    num_seqs: int,
    num_kv_heads: int,
    group: int,
    head_size: int,
    elem: int,
    ps: int,
    num_partitions: int,
    num_chunks: int,
    threads: int,
) -> tuple[KernelStep, ...]:
    """Device launches of one step; each chunk of a streamed step repeats them."""
    one: tuple[KernelStep, ...]
    if tier == "single_tile":
        smem = _smem_bytes(spec, group, head_size, elem, ps)
        one = (
            KernelStep(
                "single_tile", (num_seqs, num_kv_heads, 1), threads, smem, REGISTERS_PER_THREAD
            ),
        )
    elif tier == "one_pass":
        # Tiles of MIN_PARTITION tokens with an online softmax: shared memory is one tile.
        smem = _smem_bytes(spec, group, head_size, elem, min(ps, MIN_PARTITION))
        one = (
            KernelStep(
                "one_pass", (num_seqs, num_kv_heads, 1), threads, smem, REGISTERS_PER_THREAD
            ),
        )
    else:
        smem = _smem_bytes(spec, group, head_size, elem, ps)
        # the reduce kernel walks partitions in tiles of one per thread: max and sum per head
        reduce_smem = _round_up(
            2 * 4 * group * min(num_partitions, threads) + REDUCE_SCRATCH_BYTES,
            spec.shared_mem_alloc_unit,
        )
        one = (
            KernelStep(
                "partition",
                (num_seqs, num_kv_heads, num_partitions),
                threads,
                smem,
                REGISTERS_PER_THREAD,
            ),
            KernelStep(
                "reduce", (num_seqs, num_kv_heads, 1), threads, reduce_smem, REGISTERS_PER_THREAD
            ),
        )
    if num_chunks == 1:
        return one
    merge = KernelStep(
        "stream_merge",
        (num_seqs, num_kv_heads, 1),
        threads,
        REDUCE_SCRATCH_BYTES,
        REGISTERS_PER_THREAD,
    )
    return (one + (merge,)) * num_chunks


def _workspace_bytes(
    num_seqs: int,
    num_kv_heads: int,
    group: int,
    head_size: int,
    elem: int,
    cache_elem: int,
    chunk: int,
    num_partitions: int,
    tier: str,
    scores_fp32_from_bmm: bool,
    streaming: bool,
    matmul_dtype: torch.dtype,
    in_compute: bool,
) -> int:
    """Scratch bytes of one chunk, matching the buffers :mod:`attn_core.runtime.decode` takes."""
    b = num_seqs * num_kv_heads
    kv = b * chunk * head_size
    mm = torch.empty((), dtype=matmul_dtype).element_size()
    total = 2 * kv * cache_elem  # gathered K and V in the cache's dtype
    if cache_elem != mm:
        total += kv * mm  # V in the bmm dtype (dequantised / upcast)
        if scores_fp32_from_bmm or in_compute:
            total += kv * mm  # K in the bmm dtype
    if not scores_fp32_from_bmm and not in_compute and elem != 4:
        total += kv * 4  # keys upcast for exact fp32 scores
    total += b * group * head_size * 4  # grouped, scaled queries
    total += b * group * chunk * (4 + mm)  # fp32 scores, probabilities in the bmm dtype
    total += num_seqs * chunk  # mask
    total += b * num_partitions * group * (head_size * mm + 2 * 4)  # partials, max, sum
    if streaming:
        total += 2 * b * group * (head_size + 1) * 4  # running output and log-sum-exp
    if in_compute:
        total += b * group * chunk * elem  # scores as the score bmm wrote them
    return total
