"""How each native kernel family splits its work: pure functions of the shape, the lengths, the
device profile and the kernels' recorded resource use. The planners, the launches and the
simulator all read these answers.

Decode. Grid (``csrc/paged_decode.cu``): ``(num_kv_heads * head_groups, num_partitions,
num_seqs)`` blocks of :func:`~attn_core.native.facts.partition_threads` threads (128; 256 on the
matrix-unit body at head bucket 256, eight warp streams); each block serves ``slots`` query
heads of one KV head over one partition of the context. With one partition the kernel writes
the output directly; with more, each block writes fp32 partials
(:func:`attn_core.native.abi.partials_shapes`) and a merge kernel weighs them by their
log-sum-exp: grid :func:`merge_grid`, one block per query head, sequence and
:func:`merge_dims` head dimensions.

Partition rule. A step reads every token once however it is split, so the split only has to
fill the device: ``partitions = floor(resident_blocks / rows)`` (``rows`` = blocks per
partition column, ``resident_blocks`` = blocks per SM x SMs), at least one, with partitions of
a multiple of the body's tile (:func:`partition_grain`): 128 tokens on the CUDA-core body (one
token per thread in the score phase), 16 on the matrix-unit one. The matrix-unit body refines
it (:func:`rule_partitions`): no more than ``MMA_MAX_PARTITIONS`` partitions per row unless
fewer would leave an SM without a block, none shorter than ``MMA_MIN_PARTITION_TOKENS`` (128
tokens where 256 would leave over half the SMs idle: :func:`min_partition_tokens`), and
rows that fit one wave but leave more than a tenth of its slots empty take more partitions over
several waves. Swept on the H200 (the specialised warp-stream body, two blocks per SM at head
256; fifteen shapes from 1 x 8K to 8 x 100K, the tensor-parallel head slices and fp8;
docs/benchmarks.md#decode-split): the rule picks the fastest split or one within 1.5 % of it at
every shape; plain fill-once was up to 15 % (6 / 1 heads, 1 x 100K: 256 x 400, 0.0545 ms,
against 131 x 784, 0.0475) and 12 % (1 x 8K) slower.

For the CUDA-core body (H200, ``bench/native_decode_bench.py --sweep``, Qwen3.6 fp16) the rule
picked the fastest of the swept partition sizes at 1x8K, 1x32K, 1x100K, 1x256K, 8x100K and
64x8K; filling the device twice over was 3-9 % slower (more partials to merge, no more
bandwidth). With partitions in 16-token cache blocks beside the 128-token tiles (nine rows) it
was within 0-4.5 % of the fastest candidate at every row and fastest at six: a partial tile
costs a whole one (each thread walks its key in one latency chain), so block-grain partitions
that fill every resident slot gained nothing (1x102400: 131 x 784 0.181 ms, the rule's
115 x 896 0.178).

Prefill: the second half of this module (tile configurations, :func:`prefill_split`). Gated
DeltaNet's chunked prefill: the end (which kernel, :func:`chunk_segments`, the record size).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from attn_core.core.shapes import AttentionShape
from attn_core.device.iluvatar import iluvatar_name
from attn_core.device.spec import DeviceSpec, occupancy_limits
from attn_core.native import abi
from attn_core.native.facts import (
    COREX,
    CUDA_CORE,
    MMA,
    MMA_TILE_TOKENS,
    NVCC,
    THREADS,
    KernelRecord,
    lookup,
    mma_body,
)

GROUP_MAX = 8  # query heads one block serves at most (csrc/paged_decode.cu kGroupMax)


def group_slots(group: int) -> int:
    """Head slots of the kernel serving a GQA group, as ``csrc/paged_decode.cu`` computes them:
    the group itself up to 8, else the group spread evenly over ``ceil(group / 8)`` blocks."""
    if group < 1:
        raise ValueError(f"group must be >= 1, got {group}")
    blocks = -(-group // GROUP_MAX)
    return -(-group // blocks)


TOKEN_TILE = THREADS  # the CUDA-core body's tile (one token per thread in the score phase)


def partition_grain(body: str, block_size: int) -> int:
    """Tokens a partition is a multiple of: the body's tile (a partial tile costs a whole one),
    and whole cache blocks."""
    return max(MMA_TILE_TOKENS if body == MMA else TOKEN_TILE, block_size)


# kernel_facts.json's element kinds: the query dtype's torch name; fp8 caches by format
# (AttentionShape has already refused any dtype, head size or block size the kernel lacks)
_FP8_NAMES = {"fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}


@dataclass(frozen=True)
class NativeSplit:
    """One step's grid and workspace.

    ``partition`` / ``merge`` are the kernels' recorded registers and shared memory
    (``kernel_facts.json``, ptxas for sm_90: the ``nvcc`` records on NVIDIA devices, the
    ``corex`` stand-in on Iluvatar ones, :func:`record_toolchain`; an assumption wherever the
    device's own build is not recorded); ``partition.body`` is the body the device runs
    (:func:`decode_body`).
    ``blocks_per_sm`` is what the device profile's occupancy rules allow the partition kernel.
    """

    slots: int
    head_groups: int
    rows: int  # num_seqs * num_kv_heads * head_groups: blocks per partition column
    blocks_per_sm: int
    num_partitions: int
    partition_size: int  # tokens, a multiple of partition_grain(body) and of the block size
    partition: KernelRecord
    merge: KernelRecord

    @property
    def partition_blocks(self) -> int:
        return self.rows * self.num_partitions

    @property
    def merged(self) -> bool:
        """Whether the step needs the merge kernel (more than one partition)."""
        return self.num_partitions > 1

    def partials_shapes(
        self, num_seqs: int, num_heads: int, head_size: int
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``(part_out, part_lse)`` shapes: ``[S, H, P, D]`` and ``[S, H, P]``, fp32."""
        return abi.partials_shapes(num_seqs, num_heads, self.num_partitions, head_size)

    def workspace_bytes(self, num_seqs: int, num_heads: int, head_size: int) -> int:
        """Bytes of the fp32 partials (0 with one partition)."""
        return abi.partials_bytes(num_seqs, num_heads, self.num_partitions, head_size)


# csrc/paged_decode.cu merge_dims(): head dimensions one merge block serves, 16 (eight streams
# of partitions) from 48 partitions on, else 32 (four); the measurement that chose them is there.
MERGE_NARROW_AT = 48
MERGE_NARROW_DIMS, MERGE_WIDE_DIMS = 16, 32


def merge_dims(num_partitions: int) -> int:
    """Head dimensions one merge block serves for a launch of ``num_partitions``."""
    return MERGE_NARROW_DIMS if num_partitions >= MERGE_NARROW_AT else MERGE_WIDE_DIMS


def merge_grid(
    num_seqs: int, num_heads: int, head_size: int, num_partitions: int
) -> tuple[int, int, int]:
    """The merge launch: ``(num_heads, num_seqs, ceil(head_size / merge_dims(num_partitions)))``
    blocks."""
    return (num_heads, num_seqs, -(-head_size // merge_dims(num_partitions)))


# csrc/paged_decode.cu kMergeBlocksPerSm (launch_merge): where the device has a programmatic
# dependent launch, a merge grid of at most this many blocks per SM is launched as a dependent of
# the partition kernel, its blocks waiting on the SMs for the partition grid; a larger grid after
# it (the A/B that chose two a SM is there).
MERGE_DEPENDENT_BLOCKS_PER_SM = 2


def merge_is_dependent(spec: DeviceSpec, merge_blocks: int) -> bool:
    """Whether a merge of ``merge_blocks`` blocks runs as a programmatic dependent on ``spec``
    (a device with such a launch, ``dependent_launch_gap_s > 0``, and a grid small enough)."""
    return (
        spec.dependent_launch_gap_s > 0
        and merge_blocks <= MERGE_DEPENDENT_BLOCKS_PER_SM * spec.sm_count
    )


# The matrix-unit body's refinements of fill-once (H200, the sweep of fifteen shapes,
# docs/benchmarks.md#decode-split):
# - at most this many partitions per row, unless fewer would leave SMs without a block: the
#   merge walks every partition of a (sequence, head) (ncu: 13 us for 66 partitions, 36 us for
#   256), while one block per SM already streams 16-bit pages at the DRAM rate (6 / 1 heads, 1 x
#   100K: 256 partitions 0.0545 ms, 131 partitions 0.0475; 12 / 2: 131 0.0709, 66 0.0667);
MMA_MAX_PARTITIONS = 64
# - no partition shorter than this: a warp's first tile waits two memory latencies with nothing
#   to overlap them (1 x 8K: 64 x 128 tokens 0.0246 ms, 32 x 256 0.0219; 12 / 2 heads 1 x 8K:
#   128 x 64 0.0241, 32 x 256 0.0195);
MMA_MIN_PARTITION_TOKENS = 256
# - ... unless partitions of that floor leave more than half the SMs without a block (short
#   contexts, and the tensor-parallel slices' one or two KV heads): then partitions of this
#   many tokens, twice the blocks. H200, best of three rounds
#   interleaved, ms: 256 -> 128 tokens at 24 / 4 heads 1 x 2K 0.0171 -> 0.0145, 1 x 4K 0.0178 ->
#   0.0161; 12 / 2 1 x 4K 0.0169 -> 0.0146, 1 x 8K 0.0180 -> 0.0167; 6 / 1 1 x 4K 0.0167 ->
#   0.0140, 1 x 8K 0.0171 -> 0.0151, 1 x 16K 0.0185 -> 0.0176, 2 x 8K 0.0180 -> 0.0168. Where
#   256 already gives half the SMs a block (24 / 4 1 x 8K: 128 blocks) 128 is slower (above).
MMA_SHORT_PARTITION_TOKENS = 128
# - when one partition per row fills under this share of the slots, more partitions over
#   several waves fill them better (64 x 8K at three blocks per SM, the wmma body: 256 blocks in
#   396 slots 0.729 ms, three partitions, 768 blocks in two waves, 0.663).
MMA_MIN_FILL = 0.9


def wave_fill(blocks: int, slots: int) -> float:
    """Share of the resident slots ``blocks`` keep busy over the waves they need."""
    return blocks / (-(-blocks // slots) * slots)


def min_partition_tokens(sm_count: int, rows: int, max_seq_len: int) -> int:
    """The matrix-unit body's shortest partition: ``MMA_MIN_PARTITION_TOKENS``, or
    ``MMA_SHORT_PARTITION_TOKENS`` where the longer floor leaves over half the SMs idle."""
    if rows * -(-max_seq_len // MMA_MIN_PARTITION_TOKENS) <= sm_count // 2:
        return MMA_SHORT_PARTITION_TOKENS
    return MMA_MIN_PARTITION_TOKENS


def rule_partitions(
    body: str, blocks_per_sm: int, sm_count: int, rows: int, max_seq_len: int
) -> int:
    """The partition count of the split rule (module docstring): fill the resident slots
    once; on the matrix-unit body, with the refinements above."""
    slots = blocks_per_sm * sm_count
    wanted = max(1, slots // rows)
    if body != MMA:
        return wanted
    longest = max(1, -(-max_seq_len // min_partition_tokens(sm_count, rows, max_seq_len)))
    capped = min(wanted, max(MMA_MAX_PARTITIONS, sm_count // rows), longest)
    if capped < wanted:  # slots left empty on purpose: no search for a fuller wave
        return capped
    # (a fill under 0.9 means rows > slots / 10, so wanted < 10: a short search, once per plan)
    if rows <= slots and wave_fill(rows * wanted, slots) < MMA_MIN_FILL:
        for more in range(wanted + 1, min(4 * wanted, longest) + 1):
            if wave_fill(rows * more, slots) >= MMA_MIN_FILL:
                return more
    return wanted


def decode_body(spec: DeviceSpec, query: str, cache: str) -> str:
    """The partition body a device runs: the matrix-unit one for 16-bit queries over a cache of
    their own type or an fp8 one on NVIDIA (``csrc/decode_warp.cuh``); CoreX builds only the
    CUDA-core one."""
    return MMA if mma_body(query, cache) and not iluvatar_name(spec.name) else CUDA_CORE


def record_toolchain(spec: DeviceSpec) -> str:
    """Which records in ``kernel_facts.json`` describe the kernels ``spec`` runs: CoreX's
    stand-in on an Iluvatar device, nvcc's elsewhere."""
    return COREX if iluvatar_name(spec.name) else NVCC


def native_split(
    shape: AttentionShape,
    num_seqs: int,
    max_seq_len: int,
    spec: DeviceSpec,
    num_partitions: Optional[int] = None,
    body: Optional[str] = None,
) -> NativeSplit:
    """The split of one step; ``num_partitions`` forces the partition count and ``body`` the
    partition body (tuning knobs: a portable ``-DATTN_DECODE_MMA=0`` library runs the CUDA-core
    body where the device would run the matrix-unit one, and is timed at that body's split).

    Raises:
        ValueError: a length is below 1, ``body`` is not a body, or the kernel cannot be
            resident on ``spec`` (registers or shared memory over the device's limits).
    """
    for name, value in (("num_seqs", num_seqs), ("max_seq_len", max_seq_len)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if body not in (None, CUDA_CORE, MMA):
        raise ValueError(f"body must be {CUDA_CORE!r} or {MMA!r} (or None), got {body!r}")
    group = shape.num_heads // shape.num_kv_heads
    slots = group_slots(group)
    head_groups = -(-group // slots)
    query = str(shape.dtype).replace("torch.", "")
    cache = query if shape.kv_cache_dtype == "auto" else _FP8_NAMES[shape.kv_cache_dtype]
    bucket = abi.head_bucket(shape.head_size)
    body = body or decode_body(spec, query, cache)
    toolchain = record_toolchain(spec)
    partition = lookup("partition", query, cache, bucket, slots, body, toolchain)
    merge = lookup("merge", query, query, 0, 0, toolchain=toolchain)
    if partition is None or merge is None:
        raise ValueError(
            f"native decode: no recorded kernel for {query}/{cache}/{bucket}/{slots} "
            f"({body}, {toolchain})"
        )
    limits = occupancy_limits(spec, partition.threads, partition.registers, partition.smem_bytes)
    blocks_per_sm = min(limits.values())
    if blocks_per_sm < 1:
        raise ValueError(
            f"native decode: the partition kernel ({partition.registers} registers, "
            f"{partition.smem_bytes} B shared memory per block) cannot be resident on "
            f"{spec.name}: {limits}"
        )
    rows = num_seqs * shape.num_kv_heads * head_groups
    tile = partition_grain(body, shape.block_size)
    if num_partitions is None:
        wanted = rule_partitions(body, blocks_per_sm, spec.sm_count, rows, max_seq_len)
    elif num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
    else:
        wanted = num_partitions
    per_partition = -(-max_seq_len // wanted)
    size = max(tile, -(-per_partition // tile) * tile)
    return NativeSplit(
        slots=slots,
        head_groups=head_groups,
        rows=rows,
        blocks_per_sm=blocks_per_sm,
        num_partitions=-(-max_seq_len // size),
        partition_size=size,
        partition=partition,
        merge=merge,
    )


# ==================================================================================== prefill
# How the native prefill kernel tiles and splits one call. Grid (``csrc/paged_prefill.cu``):
# ``(query_tiles, num_seqs * num_kv_heads, num_splits)``; a query tile holds ``rows // group``
# tokens of one sequence for every head of one KV head. Splits divide a tile's key range; each
# split writes fp32 partials that a merge kernel weighs by log-sum-exp, so splits cost
# workspace and a second launch and are used only where the grid leaves SMs idle (a short chunk
# over a long context).

WORKSPACE_CAP_BYTES = 64 << 20  # the transient-memory bound of one prefill call
MAX_SPLITS = 64
# Extra cost per additional split relative to the work it divides (prologue, partial writes,
# merge): an assumption until the H200 sweep measures it (bench/native_prefill_bench.py).
SPLIT_OVERHEAD = 0.02
MIN_TILES_PER_SPLIT = 4  # a split shorter than this is mostly prologue (assumption)

# Tile configurations (csrc/paged_prefill.cu): the large tile (opt-in shared memory), and the
# tile that fits BI-V100's 32 KiB per block; rows x keys per tile (LargeCfg / SmallCfg).
CONFIG_LARGE, CONFIG_32K = 0, 1
CONFIG_TILES = {CONFIG_LARGE: (128, 64), CONFIG_32K: (16, 32)}


def choose_config(smem_per_block_optin: int, large_smem_bytes: int) -> int:
    """The large tile where the device lets a block opt in to its shared memory, else the
    32 KiB tile (BI-V100's vLLM budget)."""
    return CONFIG_LARGE if smem_per_block_optin >= large_smem_bytes else CONFIG_32K


def tokens_per_tile(config: int, group: int) -> int:
    """Query tokens one block serves: ``rows // group`` (the group's heads share the tile)."""
    rows = CONFIG_TILES[config][0]
    if not 1 <= group <= rows:
        raise ValueError(
            f"num_heads // num_kv_heads (the GQA group) must be in 1..{rows} for tile config "
            f"{config}, got {group}"
        )
    return rows // group


def query_tiles(config: int, group: int, max_query_len: int) -> int:
    """Grid x: query tiles of the longest sequence."""
    return -(-max_query_len // tokens_per_tile(config, group))


def key_tiles(config: int, context_len: int, query_len: int) -> int:
    """Key tiles the last query tile of a sequence reads (context, then its own chunk)."""
    keys = CONFIG_TILES[config][1]
    return -(-context_len // keys) + -(-query_len // keys)


def prefill_split(
    sm_count: int,
    blocks_per_sm: int,
    grid_blocks: int,
    tiles: int,
    *,
    workspace_per_split: int = 0,
) -> int:
    """Splits per query tile: the count that minimises the waves each split's share takes,
    ``ceil(grid_blocks * s / slots) / s``, with a ``SPLIT_OVERHEAD`` penalty per extra split,
    at most ``tiles // MIN_TILES_PER_SPLIT`` and ``WORKSPACE_CAP_BYTES / workspace_per_split``.

    Args:
        sm_count / blocks_per_sm: the device profile and the kernel's occupancy there.
        grid_blocks: query tiles x sequences x KV heads.
        tiles: key tiles of the longest (query tile, sequence).
        workspace_per_split: partial bytes one split adds (0: unbounded).
    """
    for name, value in (
        ("sm_count", sm_count),
        ("blocks_per_sm", blocks_per_sm),
        ("grid_blocks", grid_blocks),
        ("tiles", tiles),
    ):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    slots = sm_count * blocks_per_sm
    cap = min(MAX_SPLITS, max(1, tiles // MIN_TILES_PER_SPLIT))
    if workspace_per_split > 0:
        cap = min(cap, max(1, WORKSPACE_CAP_BYTES // workspace_per_split))
    best, best_cost = 1, float("inf")
    for s in range(1, cap + 1):
        cost = -(-grid_blocks * s // slots) / s * (1.0 + SPLIT_OVERHEAD * (s - 1))
        if cost < best_cost - 1e-12:
            best, best_cost = s, cost
    return best


def workspace_bytes(num_splits: int, num_tokens: int, num_heads: int, head_size: int) -> int:
    """Bytes of the fp32 partials (0 with one split)."""
    return abi.partials_bytes(num_tokens, num_heads, num_splits, head_size)


@dataclass(frozen=True)
class PrefillLaunch:
    """One call's launch decisions: what a native prefill plan carries and the launch reads."""

    config: int
    tokens_per_tile: int
    query_tiles: int
    num_splits: int
    workspace_bytes: int


def prefill_launch(
    config: int,
    group: int,
    num_tokens: int,
    num_heads: int,
    head_size: int,
    max_query_len: int,
    num_splits: int,
) -> PrefillLaunch:
    """The launch of ``config`` split ``num_splits`` ways for these sizes."""
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    return PrefillLaunch(
        config=config,
        tokens_per_tile=tokens_per_tile(config, group),
        query_tiles=query_tiles(config, group, max_query_len),
        num_splits=num_splits,
        workspace_bytes=workspace_bytes(num_splits, num_tokens, num_heads, head_size),
    )


# ----------------------------------------------------------------- Gated DeltaNet chunked prefill
# Two kernels serve chunk_gated_delta_rule (csrc/gated_delta.cu): the fused 16-token kernel, one
# block per (32 value columns, value head, sequence) walking its sequence, and the chunk-parallel
# pair, chunk_prep over every 64-token chunk of a segment then chunk_pass walking the segment's
# chunks, through a workspace of one record per (chunk slot, value head).
# The native chunk-parallel prefill's chunk (csrc/gated_delta.cu kPar) and the floats of one
# staged tile of its records (kTile).
NATIVE_CHUNK = 64
NATIVE_TILE = 2048
# Value columns a chunk_pass block owns (csrc/gated_delta.cu kSlice), and a chunk_pass16 block
# (csrc/gated_delta_pass16.cuh kSlice16).
CHUNK_PASS_COLUMNS = 16
CHUNK_PASS16_COLUMNS = 32


def chunk_record_bytes(head_k: int, head_v: int, operands16: bool = False) -> int:
    """Workspace bytes of one (chunk, value head) record of the native chunk-parallel prefill.

    fp32 (``chunk_pass``): ``[W; e^G q]^T`` (K x 128), ``P^T`` (64 x 64) and the decayed keys
    (64 x K) in whole tiles, then ``U`` (64 x V) and the chunk's gate (padded to 16 bytes).
    16-bit (``operands16``, ``chunk_pass16``): ``[W; e^G q]`` (128 x K), ``P`` (64 x 64), the
    decayed keys transposed (K x 64) and ``U`` (64 x V) in the input's 16-bit dtype, padded to
    16 bytes, then 16 bytes holding the gate. The library's ``attn_gdn_chunk_record_floats`` /
    ``attn_gdn_chunk_record16_bytes`` own the layouts; tests hold them equal."""
    c, tile = NATIVE_CHUNK, NATIVE_TILE
    if operands16:
        elems = 3 * c * head_k + c * c + c * head_v
        return -(-2 * elems // 16) * 16 + 16
    tiles = head_k // 16 + c * c // tile + c * head_k // tile
    return 4 * (tiles * tile + c * head_v + 4)  # fp32


# The native chunk-parallel prefill's workspace bound: the brief of the family asks for <= 64 MiB
# of transient device memory at any length. At 32 value heads of 128 x 128 a record set of one
# chunk slot is 4.5 MiB, so a segment holds 13 chunk slots (832 tokens), 8 once rounded to a
# whole wave of chunk_prep on an H100 (chunk_slots).
NATIVE_WORKSPACE_BYTES = 64 << 20
# Bytes of a call's budget kept for its offsets and sequence order (two small allocations).
INDEX_RESERVE = 64 << 10
# Bytes kept for torch's caching allocator: it hands out a cached block whole when less than
# 1 MiB of it would be left over, and counts the whole block as allocated. With 14 slots the
# workspace was 63.0 MiB, a cached 64 MiB block was handed out whole, and the call held
# 64 MiB + 1 KiB (H100, test_linear_cuda's transient test, depending on what was cached).
ALLOCATOR_SLACK = 1 << 20


def chunk_slots(
    num_value_heads: int,
    head_k: int,
    head_v: int,
    workspace_bytes: int,
    carry_bytes: int = 0,
    prep_wave_blocks: int = 0,
    operands16: bool = False,
) -> int:
    """Chunk slots a segment holds when a call may allocate ``workspace_bytes`` in all, of which
    ``carry_bytes`` go to the state carried between segments (0 when the caller keeps the final
    state), :data:`INDEX_RESERVE` to the index tensors and :data:`ALLOCATOR_SLACK` to the
    allocator's rounding: at least one.

    ``prep_wave_blocks`` (SMs x resident ``chunk_prep`` blocks an SM; 0: unknown) rounds the
    slots down to whole waves of ``chunk_prep``, one block a (slot, value head), where the
    budget holds a wave or more. A round of its blocks costs the same however full it is: on
    the H100 (264 blocks a wave, 32 value heads) the budget's 13 slots were 416 blocks, two
    rounds, and 8 slots (256 blocks, one round) took the pair from 14.94 to 13.91 ms at 32K and
    59.45 to 55.35 at 128K; 12, 6 and 4 slots were slower (docs/benchmarks.md#gated-deltanet).
    ``operands16``: slots of the 16-bit pair's records (half the fp32 record's bytes).
    """
    per_slot = chunk_record_bytes(head_k, head_v, operands16) * num_value_heads
    usable = workspace_bytes - carry_bytes - INDEX_RESERVE - ALLOCATOR_SLACK
    slots = max(1, usable // per_slot)
    per_wave = prep_wave_blocks // num_value_heads
    if per_wave >= 1 and slots >= per_wave:
        slots -= slots % per_wave
    return slots


# (base, width, p0, depth): see :func:`chunk_segments`
Segment = tuple[int, int, int, int]


def chunk_segments(
    chunks: Sequence[int], slots: int, wave_seqs: Optional[int] = None
) -> tuple[list[int], list[Segment]]:
    """Cut sequences of ``chunks[i]`` chunks into segments of at most ``slots`` chunk slots.

    Returns ``(order, segments)``: ``order`` lists the sequences longest first; they advance in
    groups of consecutive ones, a group's segments before the next group's: groups of ``slots``
    (``wave_seqs`` None: the torch path's batched products want them wide), or each group the
    fewest next sequences that hold ``slots`` chunks in all and number ``wave_seqs`` or more
    (the sequences whose ``chunk_pass`` blocks fill a wave side by side), at most ``slots``.
    Narrow groups walk deep segments: 8 x 16K took the 16-bit pair 15.7 ms in groups of 24
    (8 sequences 3 chunks deep), 14.2 one sequence at a time (24 deep), 14.3 / 14.7 two / four
    at a time; 32 x 2K 9.8 against 7.1 (H100, 32 value heads of 128, bf16;
    docs/benchmarks.md#gated-deltanet): every segment reloads and stores its sequences'
    states and starts its pass blocks' copies afresh.

    A segment ``(base, width, p0, depth)`` covers ``order[base : base + width]`` at chunk
    positions ``[p0, p0 + depth)``. Segments come in execution order, each sequence's from
    position 0 (empty sequences included, at depth 1: their state still moves from the initial
    to the final one) to its last chunk; a segment's ``width * depth`` never exceeds
    ``max(slots, width)``. Longest first keeps a group's active sequences a prefix.
    """
    if slots < 1:
        raise ValueError(f"slots must be >= 1, got {slots}")
    if wave_seqs is not None and wave_seqs < 1:
        raise ValueError(f"wave_seqs must be >= 1, got {wave_seqs}")
    order = sorted(range(len(chunks)), key=lambda s: -chunks[s])
    segments: list[Segment] = []
    base = 0
    while base < len(order):
        size = min(slots, len(order) - base)
        if wave_seqs is not None:
            size = held = 0
            while base + size < len(order) and size < slots and (held < slots or size < wave_seqs):
                held += chunks[order[base + size]]
                size += 1
        members = order[base : base + size]
        longest = chunks[members[0]]
        p0 = 0
        while p0 == 0 or p0 < longest:
            width = len(members) if p0 == 0 else sum(1 for s in members if chunks[s] > p0)
            depth = max(1, min(slots // width, longest - p0))
            segments.append((base, width, p0, depth))
            p0 += depth
        base += size
    return order, segments


def pass_wave_seqs(
    pass_wave_blocks: int, num_value_heads: int, head_v: int, operands16: bool
) -> int:
    """Sequences whose ``chunk_pass`` (``chunk_pass16``) blocks, one a (value columns, value head,
    sequence), fit one wave of ``pass_wave_blocks`` side by side: at least one."""
    columns = CHUNK_PASS16_COLUMNS if operands16 else CHUNK_PASS_COLUMNS
    return max(1, pass_wave_blocks // (num_value_heads * (head_v // columns)))


# Value columns a block of the fused 16-token kernel owns (csrc/gated_delta.cu kCols).
FUSED_COLUMNS = 32


def native_prefill_kernel(
    num_seqs: int, num_value_heads: int, head_v: int, sm_count: int, pair16: bool = False
) -> str:
    """Which native kernel serves a chunked prefill: ``"chunk_parallel"`` or ``"fused"``.

    ``pair16``: the 16-bit pair on the matrix unit serves these inputs (16-bit, K = 128, an
    NVIDIA build). It is faster than the fused kernel at every count measured (H100, bf16,
    docs/benchmarks.md#gated-deltanet: 1 x 32K 3.59 against 21.0 ms, 2 x 16K 3.54 against
    12.4, 8 x 16K 16.2 against 45.3), so it always serves. Otherwise the fp32 pair competes
    with the fused kernel:

    The fused 16-token kernel is one block per (32 value columns, value head, sequence), each
    walking its whole sequence: with fewer blocks than SMs it leaves SMs idle, with more it
    fills the device without the chunk-parallel pair's workspace round trip. Measured on an
    H100 (132 SMs, 16 / 32 heads of 128, bf16; docs/benchmarks.md#gated-deltanet): one
    sequence of 32K / 128K tokens took 21.1 / 87.3 ms fused and 15.1 / 60.0 ms chunk-parallel;
    two of 16K took 14.1 fused (chunk-parallel priced at 15.2 by attn_sim, not measured);
    eight of 16K took 44.3 fused and 54.5 chunk-parallel. So the fused kernel serves once its
    grid has a block for every SM: from two sequences at the model's shape on an H100, always
    on the 16-SM BI-V100.
    """
    if pair16:
        return "chunk_parallel"
    fused_blocks = (head_v // FUSED_COLUMNS) * num_value_heads * num_seqs
    return "fused" if fused_blocks >= sm_count else "chunk_parallel"
