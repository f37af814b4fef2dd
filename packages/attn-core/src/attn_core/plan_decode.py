"""Launch plan for paged decode: which tier, how many partitions, how much workspace.

The plan is the single source of truth for decode's launch decisions; :mod:`attn_core.decode`
executes it and the simulator charges its ``steps`` against a :class:`DeviceSpec`.

Tiers (``tier``):

- ``single_tile``: the whole (padded) context fits one partition whose logits fit the block's
  shared memory; direct softmax . V, no partition machinery. One step.
- ``one_pass``: the batch alone has enough softmax rows (``num_seqs x num_heads``) to fill the
  device (see :data:`ONE_PASS_MIN_SOFTMAX_FILL`); a device kernel would loop over tiles with an
  online softmax. The torch path computes the same exact whole-sequence softmax as
  ``single_tile``. One step.
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

Environment overrides (read on every plan; invalid values raise ``ValueError``):

- ``ATTN_CORE_DECODE_PARTITION_SIZE``: tokens per partition (a multiple of the block size).
- ``ATTN_CORE_DECODE_SINGLE_TILE_MAX``: longest context (tokens) the single-tile tier takes.
- ``ATTN_CORE_DECODE_STREAM_TOKENS``: turn streaming on with this many tokens per chunk.
- ``ATTN_CORE_DECODE_TIER``: force ``single_tile`` / ``one_pass`` / ``partitioned``.
- ``ATTN_CORE_DECODE_SUBSCRIPTION``: the even-share subscription factor.
- ``ATTN_CORE_DECODE_SCORES``: ``fp32`` (default) or ``compute``. Where bmm cannot write fp32
  from fp16/bf16 inputs (torch 2.1, the CPU) exact fp32 scores cost an fp32 copy of the keys;
  ``compute`` instead rounds scores to the compute dtype (vLLM's kernels do not) to save that
  copy's traffic and memory.
- ``ATTN_CORE_DECODE_GATHER_BYTES``: ``16`` (default) or ``8``: element width of the block
  gathers (``complex128`` / ``int64`` views of the raw bytes; see
  :mod:`attn_core.decode_gather`). ``bench/decode_bench.py`` times both.
- ``ATTN_CORE_DEVICE``: the device profile (see :mod:`attn_core.device_spec`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from attn_core.device_detect import detect_device_spec
from attn_core.device_spec import DeviceSpec, get_device_spec, occupancy_limits
from attn_core.plan_types import KernelStep
from attn_core.settings import current_overrides

TIERS = ("single_tile", "one_pass", "partitioned")
GATHER_BYTES = (8, 16)

# Even-share oversubscription: 2 waves' worth of blocks lets the tail wave of uneven partitions
# overlap the next (CUB uses a subscription factor for the same reason). Assumed, not yet swept.
SUBSCRIPTION = 2
# Below 256 tokens a partition's fixed cost (its q load, stats, merge row) dominates its K/V
# read; vLLM's V2 kernel uses 512. Assumed pending the H200 sweep in bench/decode_bench.py.
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
class DecodePlan:
    """What one decode step will do.

    Attributes:
        tier: one of :data:`TIERS`.
        num_seqs, num_heads, num_kv_heads, head_size, block_size: problem sizes.
        group: query heads per KV head (``num_heads // num_kv_heads``).
        context_tokens: tokens the step covers, ``min(max_seq_len, table capacity)``.
        partition_size: tokens per partition (a multiple of ``block_size``).
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
        scores_in_compute_dtype: opt-in (``ATTN_CORE_DECODE_SCORES=compute``): the score bmm
            writes the compute dtype, converted to fp32 after (no key upcast, rounded scores).
        workspace_bytes: bytes of scratch one step needs (reused across calls).
        steps: launches as a device would run them; grids are
            ``(num_seqs, num_kv_heads, num_partitions)``.
        torch_ops: kernel-launching torch ops the torch executor issues per step (default
            scale, no ALiBi, ``v_scale`` 1); streaming counts every chunk.
        device_spec: the profile the plan was made for.
    """

    tier: str
    num_seqs: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    block_size: int
    group: int
    context_tokens: int
    partition_size: int
    num_partitions: int
    chunk_tokens: int
    num_chunks: int
    streaming: bool
    gather_bytes: int
    matmul_dtype: torch.dtype
    score_input_dtype: torch.dtype
    compute_dtype: torch.dtype
    cache_element_size: int
    scores_fp32_from_bmm: bool
    scores_in_compute_dtype: bool
    workspace_bytes: int
    steps: tuple[KernelStep, ...]
    torch_ops: int
    device_spec: DeviceSpec

    @property
    def padded_tokens(self) -> int:
        """Token slots one chunk gathers: ``chunk_tokens``."""
        return self.chunk_tokens

    @property
    def kv_bytes(self) -> int:
        """K+V bytes the real context occupies in the cache (what a step must read)."""
        return (
            2
            * self.num_seqs
            * self.num_kv_heads
            * self.context_tokens
            * self.head_size
            * (self.cache_element_size)
        )


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


def plan_decode(
    num_seqs: int,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    max_seq_len: int,
    max_blocks_per_seq: Optional[int] = None,
    dtype: torch.dtype = torch.float16,
    *,
    cache_element_size: Optional[int] = None,
    device_spec: Optional[DeviceSpec] = None,
    device: Optional[torch.device] = None,
    partition_size: Optional[int] = None,
    single_tile_max: Optional[int] = None,
    stream_tokens: Optional[int] = None,
    tier: Optional[str] = None,
    gather_bytes: Optional[int] = None,
    scores_fp32_from_bmm: bool = False,
    bmm_in_compute_dtype: bool = True,
    scores: Optional[str] = None,
) -> DecodePlan:
    """Plan one decode step. Arguments override the environment, which overrides the profile.

    Args:
        max_seq_len: upper bound on ``seq_lens`` (may exceed all of them).
        max_blocks_per_seq: width of ``block_tables``; caps the context at its capacity.
        cache_element_size: bytes per cache element (1 for fp8); defaults to ``dtype``'s.
        scores_fp32_from_bmm: the device's bmm writes fp32 from ``dtype`` inputs.
        bmm_in_compute_dtype: the device's bmm runs in ``dtype`` at all (else fp32 matmuls).
        device_spec: the profile; default ``ATTN_CORE_DEVICE`` or the one matching ``device``.
    """
    for name, value in (
        ("num_seqs", num_seqs),
        ("num_heads", num_heads),
        ("num_kv_heads", num_kv_heads),
        ("head_size", head_size),
        ("block_size", block_size),
        ("max_seq_len", max_seq_len),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if num_heads % num_kv_heads:
        raise ValueError(
            f"num_heads must be divisible by num_kv_heads ({num_kv_heads}), got {num_heads}"
        )
    if isinstance(device_spec, str):
        device_spec = get_device_spec(device_spec)
    spec = device_spec or detect_device_spec(device)
    elem = torch.empty((), dtype=dtype).element_size()
    cache_elem = cache_element_size or elem
    group = num_heads // num_kv_heads

    context = max_seq_len
    if max_blocks_per_seq is not None:
        context = min(context, max_blocks_per_seq * block_size)

    env = current_overrides().decode
    tier = tier or env.tier
    if tier is not None and tier not in TIERS:
        raise ValueError(f"tier must be one of {TIERS}, got {tier!r}")
    forced_ps = partition_size or env.partition_size
    if forced_ps is not None and forced_ps % block_size:
        raise ValueError(
            f"partition_size must be a multiple of block_size ({block_size}), got {forced_ps}"
        )
    tile_max = single_tile_max or env.single_tile_max
    largest = _largest_partition(spec, group, head_size, elem, block_size)
    if tile_max is None:
        tile_max = largest
    stream = stream_tokens or env.stream_tokens
    subscription = env.subscription or SUBSCRIPTION

    threads = _threads(spec)
    # Every sequence's row keeps block_size - 1 slots past its last token (max_seq_len at
    # most): decode zeroes those value slots with one fixed-size index_put (see decode.py).
    padded = _round_up(context + block_size - 1, block_size)
    streaming = stream is not None
    # tokens one launch covers: the context, or one streamed chunk of it
    span = min(padded, max(block_size, stream // block_size * block_size)) if stream else padded
    rows = num_seqs * num_kv_heads
    ps, _ = _even_share(
        spec, span, rows, group, head_size, elem, block_size, largest, subscription, threads
    )
    if forced_ps is not None:
        ps = forced_ps

    if tier is None:
        if span <= tile_max:
            tier = "single_tile"
        elif span <= ps or (forced_ps is None and one_pass_fills_device(spec, num_seqs, num_heads)):
            tier = "one_pass"  # the batch's softmax rows alone fill the device
        else:
            tier = "partitioned"

    if tier == "partitioned":
        chunk = _round_up(span, ps)
        num_partitions = chunk // ps
    else:
        chunk = span
        ps = chunk
        num_partitions = 1
    num_chunks = -(-padded // chunk)
    gather_bytes = gather_bytes or env.gather_bytes or 16
    if gather_bytes not in GATHER_BYTES:
        raise ValueError(f"gather_bytes must be one of {GATHER_BYTES}, got {gather_bytes!r}")
    scores = scores or env.scores or "fp32"
    if scores not in ("fp32", "compute"):
        raise ValueError(f"scores must be 'fp32' or 'compute', got {scores!r}")
    matmul_dtype = dtype if bmm_in_compute_dtype else torch.float32
    in_compute = (
        scores == "compute" and elem != 4 and not scores_fp32_from_bmm and bmm_in_compute_dtype
    )
    exact_fp32 = scores_fp32_from_bmm and bmm_in_compute_dtype
    score_input = dtype if (in_compute or exact_fp32) else torch.float32
    ops = _torch_ops(
        tier,
        streaming,
        num_chunks,
        dtype,
        matmul_dtype,
        score_input,
        in_compute,
        cache_elem != elem,
        head_size,
        chunk * num_chunks > (max_blocks_per_seq or 1 << 62) * block_size,
    )

    steps = _steps(
        spec,
        tier,
        num_seqs,
        num_kv_heads,
        group,
        head_size,
        elem,
        ps,
        num_partitions,
        num_chunks,
        threads,
    )
    workspace = _workspace_bytes(
        num_seqs,
        num_kv_heads,
        group,
        head_size,
        elem,
        cache_elem,
        chunk,
        num_partitions,
        tier,
        score_input != torch.float32 or elem == 4,
        streaming,
        matmul_dtype,
        in_compute,
    )
    return DecodePlan(
        tier=tier,
        num_seqs=num_seqs,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_size=head_size,
        block_size=block_size,
        group=group,
        context_tokens=context,
        partition_size=ps,
        num_partitions=num_partitions,
        chunk_tokens=chunk,
        num_chunks=num_chunks,
        streaming=streaming,
        gather_bytes=gather_bytes,
        matmul_dtype=matmul_dtype,
        score_input_dtype=score_input,
        compute_dtype=dtype,
        cache_element_size=cache_elem,
        scores_fp32_from_bmm=scores_fp32_from_bmm,
        scores_in_compute_dtype=in_compute,
        workspace_bytes=workspace,
        steps=steps,
        torch_ops=ops,
        device_spec=spec,
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


def _torch_ops(
    tier: str,
    streaming: bool,
    num_chunks: int,
    dtype: torch.dtype,
    matmul_dtype: torch.dtype,
    score_input: torch.dtype,
    in_compute: bool,
    fp8: bool,
    head_size: int,
    past_table: bool,
) -> int:
    """Kernel-launching torch ops of one step, as ``attn_core.decode`` issues them.

    Counted by ``tests/test_decode_structure.py`` (a dispatch-mode recorder) for every
    combination below; the sim charges them as launches.
    """
    # mask, block ids, K and V gathers, tail zeroing (2), score bmm, masked_fill
    per_chunk = 8
    if fp8:
        per_chunk += 2  # K and V dequantised (into the score / bmm dtypes)
    else:
        per_chunk += 1 if score_input == torch.float32 and dtype != torch.float32 else 0  # K up
        per_chunk += 1 if matmul_dtype != dtype else 0  # V upcast (torch 2.1's CPU)
    per_chunk += 1 if in_compute else 0  # rounded scores copied to fp32
    if streaming:
        per_chunk += 4  # clamp, read back, keep mask, where
    if tier != "partitioned" and not streaming:
        # softmax, cast to the bmm dtype, P.V, first-block P.V
        per_chunk += 4 if matmul_dtype != torch.float32 else 3
    else:
        # max, sub, exp, sum, normalise+cast, P.V, log, add, softmax, mul, sum, first block
        per_chunk += 12
        per_chunk += 1 if streaming else 0  # the chunk's logsumexp
    total = per_chunk * num_chunks
    # each later chunk: its relative end (seq_lens - start), and the merge of chunks (2
    # stacks, softmax, mul, sum, logsumexp)
    total += 7 * (num_chunks - 1)
    total += 1  # grouped query (scaled) copy
    scale = head_size**-0.5
    total += 0 if dtype == torch.float32 or math.frexp(scale)[0] == 0.5 else 1
    total += 1 if past_table else 0
    # output: short-sequence mask + where, plus a copy when the result is not out's dtype
    total += 2
    if tier == "partitioned" or streaming:
        total += 1 if dtype != torch.float32 else 0  # the fp32 merge's result
    else:
        total += 1 if matmul_dtype != dtype else 0  # P.V's result in fp32 (torch 2.1's CPU)
    total += 1 if matmul_dtype != dtype else 0  # the first-block output likewise
    return total


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
    """Scratch bytes of one chunk, matching the buffers :mod:`attn_core.decode` takes."""
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
