"""How the chunked gated delta rule cuts a prefill: chunk length, segment size, segments.

A *segment* is a batch of 64-token chunk slots processed at once: every intra-chunk product of
the segment's chunks is one batched op, and only the pass of the state from chunk to chunk is a
loop (one ``baddbmm_`` per chunk). The segment is as large as a byte budget allows, so the
transient memory of a prefill is bounded whatever its length: at 256K tokens with 32 value
heads of 128 x 128 the whole-sequence intermediates would be tens of GiB.

:func:`plan_gated_delta` is a pure function of the shapes and the budget; the executor reads
every launch decision from the plan it returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

CHUNK = 64
# The transient budget of one prefill call: the brief of this path asks for <= 512 MiB at 256K
# tokens with 32 value heads x 128 x 128; segments are sized to stay inside it.
DEFAULT_BUDGET_BYTES = 512 << 20
FP32 = 4


@dataclass(frozen=True)
class GatedDeltaPlan:
    """Attributes:
    chunk: tokens per chunk (64: the intra-chunk products are 64 x 64 per value head).
    segment_chunks: chunk slots per segment (>= 1); a segment holds ``segment_chunks`` chunks
        of one sequence or the same chunk positions of several sequences side by side.
    bytes_per_chunk: the transient bytes one chunk slot costs (:func:`chunk_slot_bytes`).
    budget_bytes: the budget the segment was sized for.
    """

    chunk: int
    segment_chunks: int
    bytes_per_chunk: int
    budget_bytes: int

    def __post_init__(self) -> None:
        if self.chunk < 1 or self.segment_chunks < 1:
            raise ValueError(
                f"chunk and segment_chunks must be >= 1, got {self.chunk} and {self.segment_chunks}"
            )

    @property
    def segment_tokens(self) -> int:
        return self.chunk * self.segment_chunks


def chunk_slot_bytes(
    num_heads: int, num_value_heads: int, head_k: int, head_v: int, itemsize: int, chunk: int
) -> int:
    """Transient bytes of one chunk slot in :mod:`attn_core.linear.chunked`, counted as if every
    intermediate of the segment were alive at once (the executor frees some early, so the
    measured peak stays below it).

    Per slot, fp32 unless said: the gathered inputs in their dtype and in fp32 (q, k at key
    heads, v at value heads), head-major q/k, the decay, Gram and solve matrices (C x C per
    head), the solve's right-hand side and solution ``[beta v | beta e^G k]``, the decayed keys
    and queries, the chunk's state map ``M`` (K x K) and state (K x V), the new values and the
    output before and after its move to token-major order.
    """
    c, h, hv, dk, dv = chunk, num_heads, num_value_heads, head_k, head_v
    inputs = c * (2 * h * dk + hv * dv) * (itemsize + FP32) + 2 * c * h * dk * FP32
    square = (3 * hv + 2 * h) * c * c * FP32  # decay, A, its inverse per value head; kk, qk per key
    solve = 2 * hv * c * (dv + dk) * FP32
    decayed = 2 * hv * c * dk * FP32
    states = hv * (dk * dk + dk * dv) * FP32
    values = 3 * hv * c * dv * FP32 + hv * c * dv * itemsize
    small = 8 * hv * c * FP32  # g, beta, cumulated g, masks
    return inputs + square + solve + decayed + states + values + small


def plan_gated_delta(
    num_heads: int,
    num_value_heads: int,
    head_k: int,
    head_v: int,
    itemsize: int,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
    chunk: int = CHUNK,
) -> GatedDeltaPlan:
    """The segment size for these shapes: as many chunk slots as ``budget_bytes`` holds (at
    least one). At 16 key / 32 value heads, 128 x 128, bf16 and 512 MiB: 26 slots (1664 tokens).
    """
    per = chunk_slot_bytes(num_heads, num_value_heads, head_k, head_v, itemsize, chunk)
    return GatedDeltaPlan(chunk, max(1, budget_bytes // per), per, budget_bytes)


# The native chunk-parallel prefill's chunk (csrc/gated_delta.cu kPar) and the floats of one
# staged tile of its records (kTile).
NATIVE_CHUNK = 64
NATIVE_TILE = 2048


def chunk_record_bytes(head_k: int, head_v: int) -> int:
    """Workspace bytes of one (chunk, value head) record of the native chunk-parallel prefill:
    ``[W; e^G q]^T`` (K x 128), ``P^T`` (64 x 64) and the decayed keys (64 x K) in whole tiles,
    then ``U`` (64 x V) and the chunk's gate (padded to 16 bytes), fp32. The library's
    ``attn_gdn_chunk_record_floats`` is the layout's owner; tests hold the two equal."""
    c, tile = NATIVE_CHUNK, NATIVE_TILE
    tiles = head_k // 16 + c * c // tile + c * head_k // tile
    return FP32 * (tiles * tile + c * head_v + 4)


# The native chunk-parallel prefill's workspace bound: the brief of the family asks for <= 64 MiB
# of transient device memory at any length. At 32 value heads of 128 x 128 a record set of one
# chunk slot is 4.5 MiB, so a segment holds 14 chunk slots (896 tokens).
NATIVE_WORKSPACE_BYTES = 64 << 20


# (base, width, p0, depth): see :func:`chunk_segments`
Segment = tuple[int, int, int, int]


def chunk_segments(chunks: Sequence[int], slots: int) -> tuple[list[int], list[Segment]]:
    """Cut sequences of ``chunks[i]`` chunks into segments of at most ``slots`` chunk slots.

    Returns ``(order, segments)``: ``order`` lists the sequences longest first; a segment
    ``(base, width, p0, depth)`` covers ``order[base : base + width]`` at chunk positions
    ``[p0, p0 + depth)``. Segments come in execution order, each sequence's from position 0
    (empty sequences included, at depth 1: their state still moves from the initial to the
    final one) to its last chunk; a segment's ``width * depth`` never exceeds ``max(slots,
    width)``. Longest first keeps a group's active sequences a prefix, as the torch path does.
    """
    if slots < 1:
        raise ValueError(f"slots must be >= 1, got {slots}")
    order = sorted(range(len(chunks)), key=lambda s: -chunks[s])
    segments: list[Segment] = []
    for base in range(0, len(order), slots):
        group = order[base : base + slots]
        longest = chunks[group[0]]
        p0 = 0
        while p0 == 0 or p0 < longest:
            width = len(group) if p0 == 0 else sum(1 for s in group if chunks[s] > p0)
            depth = max(1, min(slots // width, longest - p0))
            segments.append((base, width, p0, depth))
            p0 += depth
    return order, segments


# Value columns a block of the fused 16-token kernel owns (csrc/gated_delta.cu kCols).
FUSED_COLUMNS = 32


def native_prefill_kernel(num_seqs: int, num_value_heads: int, head_v: int, sm_count: int) -> str:
    """Which native kernel serves a chunked prefill: ``"chunk_parallel"`` or ``"fused"``.

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
    fused_blocks = (head_v // FUSED_COLUMNS) * num_value_heads * num_seqs
    return "fused" if fused_blocks >= sm_count else "chunk_parallel"
