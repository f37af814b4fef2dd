"""The chunked gated delta rule (prefill) against the float64 per-token reference: random
configurations, the chunk edges (1, 63, 64, 65 tokens), segments of every size, and its
agreement with the token-by-token path."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from linear_helpers import assert_linear_close, make_linear_case
from torch.utils._python_dispatch import TorchDispatchMode

from attn_core import (
    chunk_gated_delta_rule,
    fused_recurrent_gated_delta_rule,
    plan_gated_delta,
)
from attn_core.linear.plan import DEFAULT_BUDGET_BYTES, GatedDeltaPlan
from attn_core.native.split import (
    ALLOCATOR_SLACK,
    INDEX_RESERVE,
    NATIVE_WORKSPACE_BYTES,
    chunk_record_bytes,
    chunk_segments,
    chunk_slots,
)
from attn_core.reference import reference_gated_delta

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
lengths = st.lists(
    st.one_of(st.sampled_from((1, 63, 64, 65)), st.integers(1, 150)), min_size=1, max_size=4
)


def _check(case, dtype, plan=None) -> None:
    want_o, want_s = reference_gated_delta(**case.reference_kwargs())
    o, s = chunk_gated_delta_rule(**case.kwargs(), output_final_state=True, plan=plan)
    assert o.dtype == dtype and o.shape == case.v.shape
    assert s.dtype == torch.float32
    assert_linear_close(o, want_o, dtype)
    assert_linear_close(s, want_s, torch.float32 if dtype == torch.float32 else torch.float16)


@settings(max_examples=20, deadline=None)
@given(
    lens=lengths,
    heads=st.sampled_from(((1, 1), (2, 2), (2, 4), (1, 4))),
    dims=st.sampled_from(((16, 16), (16, 32), (32, 16))),
    dtype=st.sampled_from(DTYPES),
    initial=st.booleans(),
    l2norm=st.booleans(),
    scale=st.one_of(st.none(), st.floats(0.05, 2.0)),
    slots=st.one_of(st.none(), st.integers(1, 5)),
    seed=st.integers(0, 2**16),
)
def test_random_varlen_matches_reference(
    lens, heads, dims, dtype, initial, l2norm, scale, slots, seed
) -> None:
    h, hv = heads
    case = make_linear_case(lens, h, hv, *dims, dtype, initial=initial, l2norm=l2norm,
                            scale=scale, seed=seed)  # fmt: skip
    plan = None
    if slots is not None:  # segments of 1..5 chunk slots: every way of cutting the sequences
        per = plan_gated_delta(h, hv, *dims, case.q.element_size()).bytes_per_chunk
        plan = GatedDeltaPlan(64, slots, per, slots * per)
    _check(case, dtype, plan)


def test_batched_rows_without_cu_seqlens() -> None:
    case = make_linear_case([130, 130, 130], 2, 4, 16, 16, varlen=False, seed=3)
    _check(case, torch.float32)


def test_head_dims_of_the_model() -> None:
    case = make_linear_case([65, 70], 1, 2, 128, 128, torch.bfloat16, l2norm=True, seed=4)
    _check(case, torch.bfloat16)


def test_empty_sequence_keeps_its_initial_state() -> None:
    case = make_linear_case([5, 1], 1, 2, 16, 16, seed=5)
    case.cu_seqlens = torch.tensor([0, 5, 5, 6], dtype=torch.int64)
    case.initial_state = torch.randn(3, 2, 16, 16)
    o, s = chunk_gated_delta_rule(**case.kwargs(), output_final_state=True)
    assert torch.equal(s[1], case.initial_state[1])
    want_o, want_s = reference_gated_delta(**case.reference_kwargs())
    assert_linear_close(o, want_o, torch.float32)
    assert_linear_close(s, want_s, torch.float32)


def test_no_final_state_unless_asked() -> None:
    case = make_linear_case([3], 1, 1, 16, 16)
    assert chunk_gated_delta_rule(**case.kwargs())[1] is None


def test_chunked_and_recurrent_agree() -> None:
    case = make_linear_case([200, 65], 2, 4, 32, 32, l2norm=True, seed=6)
    o1, s1 = chunk_gated_delta_rule(**case.kwargs(), output_final_state=True)
    o2, s2 = fused_recurrent_gated_delta_rule(**case.kwargs(), output_final_state=True)
    torch.testing.assert_close(o1, o2, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(s1, s2, atol=2e-5, rtol=2e-5)


def test_inputs_are_not_written() -> None:
    case = make_linear_case([70], 1, 2, 16, 16, seed=7)
    before = {k: v.clone() for k, v in case.kwargs().items() if isinstance(v, torch.Tensor)}
    chunk_gated_delta_rule(**case.kwargs(), output_final_state=True)
    for name, t in before.items():
        assert torch.equal(case.kwargs()[name], t), name


def test_segment_fits_the_budget_at_the_model_shape() -> None:
    plan = plan_gated_delta(16, 32, 128, 128, 2)
    assert plan.chunk == 64
    assert plan.segment_chunks * plan.bytes_per_chunk <= DEFAULT_BUDGET_BYTES
    assert plan.segment_chunks >= 16  # enough chunks per segment to amortise its launches
    assert plan_gated_delta(16, 32, 128, 128, 2, budget_bytes=1).segment_chunks == 1


class _FloatOps(TorchDispatchMode):
    """Counts the ops that compute floats (kernel launches on a GPU); views, allocations and
    the host's integer index arithmetic are not launches."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        first = out[0] if isinstance(out, (tuple, list)) else out
        name = func.overloadpacket.__name__
        view = any(r.alias_info is not None and not r.alias_info.is_write
                   for r in func._schema.returns)  # fmt: skip
        skip = view or name in ("empty", "empty_strided", "_unsafe_view")
        if not skip and isinstance(first, torch.Tensor) and first.is_floating_point():
            self.count += 1
        return out


def test_launches_per_chunk() -> None:
    """About 2.2 float ops per 64-token chunk with the model's segment (38 slots): one
    ``baddbmm_`` per chunk and 44 per segment; transformers' fallback issues ~19 per chunk
    counted the same way (its loop body plus the matmuls' copies)."""
    chunks = 38 * 8
    case = make_linear_case([64 * chunks], 2, 4, 16, 16, torch.bfloat16, l2norm=True)
    plan = plan_gated_delta(16, 32, 128, 128, 2)
    with _FloatOps() as ops:
        chunk_gated_delta_rule(**case.kwargs(), output_final_state=True, plan=plan)
    assert ops.count / chunks < 2.5


@settings(max_examples=80, deadline=None)
@given(
    chunks=st.lists(st.integers(0, 9), min_size=1, max_size=9),
    slots=st.integers(1, 12),
    wave_seqs=st.none() | st.integers(1, 10),
)
def test_chunk_segments_cover_each_sequence_once_in_order(chunks, slots, wave_seqs) -> None:
    """The native chunk-parallel prefill's segments: every sequence from chunk 0 (empty ones
    at depth 1) to its last chunk, in order, each position once, a group's sequences done
    before the next group starts; a segment fits ``slots`` unless one chunk position of its
    sequences alone is wider; groups of ``slots`` without ``wave_seqs``, else each the fewest
    sequences holding ``slots`` chunks and ``wave_seqs`` sequences (but the last)."""
    order, segments = chunk_segments(chunks, slots, wave_seqs)
    assert sorted(order) == list(range(len(chunks)))
    groups = sorted({base for base, *_ in segments})
    assert [base for base, *_ in segments] == sorted(base for base, *_ in segments)
    sizes = [b - a for a, b in zip(groups, groups[1:] + [len(chunks)], strict=True)]
    for start, size in zip(groups, sizes, strict=True):
        assert 1 <= size <= slots
        held = [chunks[s] for s in order[start : start + size]]
        if wave_seqs is None:
            assert size == min(slots, len(chunks) - start)
        elif start + size < len(chunks) and size < slots:  # not the last group, not capped
            assert sum(held) >= slots and size >= wave_seqs  # enough ...
            assert sum(held[:-1]) < slots or size - 1 < wave_seqs  # ... and no more
    seen = {s: [] for s in range(len(chunks))}
    for base, width, p0, depth in segments:
        assert width >= 1 and depth >= 1 and base + width <= len(chunks)
        assert width * depth <= max(slots, width)
        assert width <= sizes[groups.index(base)]
        for z in range(width):
            seq = order[base + z]
            seen[seq] += [p for p in range(p0, p0 + depth) if p < max(chunks[seq], 1)]
    for seq, positions in seen.items():
        assert positions == list(range(max(chunks[seq], 1))), (seq, positions)


@pytest.mark.parametrize(
    ("chunks", "wave_seqs", "widths"),
    [([256] * 8, 1, [1] * 88),  # 8 x 16K on the H100 at the model's shape: one at a time
     ([32] * 3, 1, [1, 1] * 3),  # 2K sequences: 24 chunks deep, then 8
     ([1] * 30, 1, [24, 6]),  # one-chunk sequences: 24 side by side
     ([256] * 2, 4, [2] * 22)],  # a small shape: the wave wants 4, two are all there are
)  # fmt: skip
def test_chunk_segments_group_narrowly_for_the_native_pair(chunks, wave_seqs, widths) -> None:
    _, segments = chunk_segments(chunks, 24, wave_seqs)
    assert [width for _, width, _, _ in segments] == widths


@pytest.mark.parametrize("carry", [0, 32 * 128 * 128 * 4])
def test_chunk_slots_leave_room_for_the_indices_and_the_allocator(carry) -> None:
    """At the model's shape the workspace, the index tensors, a cached block handed out whole
    (less than 1 MiB over) and the carried state fit 64 MiB; one slot more would not."""
    per_slot = chunk_record_bytes(128, 128) * 32
    slots = chunk_slots(32, 128, 128, NATIVE_WORKSPACE_BYTES, carry)
    held = slots * per_slot + INDEX_RESERVE + ALLOCATOR_SLACK + carry
    assert held <= NATIVE_WORKSPACE_BYTES < held + per_slot
    assert slots == 13
    assert chunk_slots(32, 128, 128, 1, carry) == 1  # at least one, whatever the budget


@pytest.mark.parametrize(
    ("wave_blocks", "budget_slots", "slots"),
    [(0, 13, 13),  # unknown device: the budget's slots
     (264, 13, 8),  # H100, two chunk_prep blocks an SM: 8 slots x 32 heads fill one wave
     (264, 5, 5),  # less than a wave: every slot the budget holds
     (528, 20, 16),  # two waves of 8.25 slots: 16
     (32, 13, 13)],  # BI-V100-sized wave, below one slot's 32 blocks: no rounding
)  # fmt: skip
def test_chunk_slots_round_down_to_whole_waves_of_chunk_prep(wave_blocks, budget_slots, slots):
    per_slot = chunk_record_bytes(128, 128) * 32
    budget = budget_slots * per_slot + INDEX_RESERVE + ALLOCATOR_SLACK
    assert chunk_slots(32, 128, 128, budget) == budget_slots
    assert chunk_slots(32, 128, 128, budget, prep_wave_blocks=wave_blocks) == slots
