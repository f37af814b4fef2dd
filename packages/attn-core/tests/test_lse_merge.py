"""Property tests of the fp32 log-sum-exp merge: any split of a row into partitions (all-masked
ones included, as decode scores them), merged at once or in any grouping, equals the softmax
over the whole row."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_core.core.lse_merge import merge_lse
from attn_core.decode.torch_path import MASKED_SCORE


def partitions(scores: torch.Tensor, values: torch.Tensor, ps: int):
    """Decode's phase 1 on ``scores [T]`` (masked slots already ``MASKED_SCORE``) split into
    partitions of ``ps``: ``(out [1, P, 1, D], lse [1, 1, P])`` as decode computes them."""
    parts = scores.view(-1, ps)  # [P, ps]
    m = parts.amax(-1, keepdim=True)
    e = torch.exp(parts - m)
    sums = e.sum(-1, keepdim=True)
    out = torch.einsum("pt,ptd->pd", e / sums, values.view(-1, ps, values.shape[1]))
    lse = (m + sums.log()).squeeze(-1)
    return out[None, :, None, :], lse[None, None, :]


def whole_row(scores: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    return torch.softmax(scores, 0) @ values


problems = st.tuples(
    st.integers(1, 8),  # partitions
    st.integers(1, 9),  # partition size
    st.floats(0.1, 80.0),  # score spread
    st.integers(0, 2**31 - 1),
    st.data(),
)


def masked_row(problem, head_size: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A row of ``problem`` (partitions x partition size slots): float64 ``scores [T]`` with a
    drawn tail masked (whole partitions of it included), ``values [T, head_size]``, and the
    number of unmasked slots."""
    p, ps, spread, seed, data = problem
    t = p * ps
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(t, generator=g, dtype=torch.float64) * spread
    values = torch.randn(t, head_size, generator=g, dtype=torch.float64)
    real = data.draw(st.integers(1, t))
    scores[real:] = MASKED_SCORE
    return scores, values, real


@settings(max_examples=60, deadline=None)
@given(problems)
def test_merge_equals_whole_row_softmax(problem) -> None:
    scores, values, real = masked_row(problem, 5)
    out, lse = partitions(scores, values, ps=problem[1])
    merged, merged_lse = merge_lse(out, lse)
    torch.testing.assert_close(merged[0, 0], whole_row(scores[:real], values[:real]))
    torch.testing.assert_close(merged_lse[0, 0], torch.logsumexp(scores[:real], 0))


@settings(max_examples=40, deadline=None)
@given(problems)
def test_merging_merged_chunks_is_associative(problem) -> None:
    """Streaming merges chunk results pairwise: the same as merging every partition at once."""
    p, ps, _, _, data = problem
    scores, values, _ = masked_row(problem, 3)
    out, lse = partitions(scores, values, ps)
    cut = data.draw(st.integers(1, p))
    a = merge_lse(out[:, :cut], lse[..., :cut])
    if cut == p:
        pair = a
    else:
        b = merge_lse(out[:, cut:], lse[..., cut:])
        pair = merge_lse(torch.stack((a[0], b[0]), 1), torch.stack((a[1], b[1]), -1))
    once = merge_lse(out, lse)
    torch.testing.assert_close(pair[0], once[0])
    torch.testing.assert_close(pair[1], once[1])


def test_all_masked_partition_weighs_exactly_zero() -> None:
    """Masked slots score -1e30: a partition of them has finite statistics and weight 0."""
    scores = torch.tensor([3.0, -1.0, MASKED_SCORE, MASKED_SCORE], dtype=torch.float32)
    values = torch.tensor([[1.0], [2.0], [1e4], [-1e4]])
    out, lse = partitions(scores, values, 2)
    assert torch.isfinite(lse).all()
    weights = torch.softmax(lse, -1)
    assert weights[0, 0, 1].item() == 0.0
    merged, _ = merge_lse(out, lse, with_lse=False)
    torch.testing.assert_close(merged[0, 0], whole_row(scores[:2], values[:2]))


def test_half_partials_promote_to_fp32() -> None:
    out = torch.ones(2, 3, 4, 8, dtype=torch.float16)
    lse = torch.zeros(2, 4, 3)
    merged, merged_lse = merge_lse(out, lse, with_lse=False)
    assert merged.dtype == torch.float32 and merged_lse is None
    torch.testing.assert_close(merged, torch.ones(2, 4, 8))
