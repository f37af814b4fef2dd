"""How the chunked gated delta rule cuts a prefill: chunk length and segment size.

A *segment* is a batch of 64-token chunk slots processed at once: every intra-chunk product of
the segment's chunks is one batched op, and only the pass of the state from chunk to chunk is a
loop (one ``baddbmm_`` per chunk). The segment is as large as a byte budget allows, so the
transient memory of a prefill is bounded whatever its length: at 256K tokens with 32 value
heads of 128 x 128 the whole-sequence intermediates would be tens of GiB.

:func:`plan_gated_delta` is a pure function of the shapes and the budget; the executor reads
every launch decision from the plan it returns.
"""

from __future__ import annotations

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
    bytes_per_chunk: the peak transient bytes of one chunk slot (:func:`chunk_slot_bytes`).
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
    """Peak transient bytes of one chunk slot in :mod:`attn_core.linear.chunked`: the largest of
    the live sets of a segment's three phases, each counted per slot, fp32 unless said.

    - solve: the gathered inputs in their dtype and in fp32 (a segment that is not one run of
      tokens gathers them), head-major q and k, the decay, the Gram matrix and the solve's
      workspace and result (C x C per value head), its right-hand side and solution
      ``[beta v | -beta e^G k]``;
    - state pass: q, k, the decay, the solution, the decayed keys, the chunk's state map ``M``
      (K x K) and its states;
    - output: q, k, the decay, the states, the new values, the decayed queries, the scores, the
      output and the product before it.

    States are counted three times a slot, the worst case: a segment of one-chunk sequences
    side by side holds each sequence's running state, its state before and its state after.
    Measured at the model's shape (16 / 32 heads, 128 x 128, bf16; H100, one long sequence,
    so one state a slot): 11.6 MiB a slot while two views outlived their tensors, 8.6 once the
    executor freed what each phase leaves behind (345 MiB at 40 slots); the intermediates'
    sum, what this counted before, is 19.6 MiB.
    """
    c, h, hv, dk, dv = chunk, num_heads, num_value_heads, head_k, head_v
    qk = 2 * c * h * dk * FP32
    square = hv * c * c * FP32
    solution = hv * c * (dv + dk) * FP32
    key_rows, value_rows = hv * c * dk * FP32, hv * c * dv * FP32
    states = 3 * hv * dk * dv * FP32
    gathered = c * (2 * h * dk + hv * dv) * (itemsize + FP32)
    solve = gathered + qk + 4 * square + 2 * solution
    state_pass = qk + square + solution + key_rows + hv * dk * dk * FP32 + states
    output = qk + square + states + 3 * value_rows + key_rows + square
    small = 8 * hv * c * FP32  # g, beta, cumulated g, masks
    return max(solve, state_pass, output) + small


def chunk_slot_intermediate_bytes(
    num_heads: int, num_value_heads: int, head_k: int, head_v: int, itemsize: int, chunk: int
) -> int:
    """Bytes of every intermediate one chunk slot writes (each written once and read about
    once: the simulator's traffic of the torch path), fp32 unless said: the gathered inputs in
    their dtype and in fp32, head-major q/k, the decay, Gram and solve matrices, the solve's
    right-hand side and solution, the decayed keys and queries, the state map and state, the
    new values and the output before and after its move to token-major order."""
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
    least one) once a sixteenth of it is kept back for what no slot accounts for: the
    allocator's rounding and one-time allocations that can land in a call's peak (the
    process's first matmul allocates cuBLAS's workspace, 32 MiB on the H100; measured inside a
    call, the worst case at 40 slots read 533 MiB of 512). At 16 key / 32 value heads,
    128 x 128, bf16 and 512 MiB: 38 slots (2432 tokens).
    """
    per = chunk_slot_bytes(num_heads, num_value_heads, head_k, head_v, itemsize, chunk)
    usable = budget_bytes - budget_bytes // 16
    return GatedDeltaPlan(chunk, max(1, usable // per), per, budget_bytes)
