"""Property tests of the fp32 log-sum-exp merge: any split of a row into partitions (empty ones
included), merged in any grouping, equals the softmax over the whole row."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_core.lse_merge import merge_partitions, merge_two, normalise, safe_max


def partition_triples(scores: torch.Tensor, values: torch.Tensor, cuts: list[int]):
    """Split ``scores [T]`` / ``values [T, D]`` at ``cuts``; each part's (out, max, sum)."""
    outs, maxes, sums = [], [], []
    bounds = [0, *cuts, scores.shape[0]]
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        s, v = scores[lo:hi], values[lo:hi]
        m = s.max() if hi > lo else torch.tensor(-math.inf, dtype=scores.dtype)
        e = torch.exp(s - (m if hi > lo else 0.0))
        outs.append(e @ v if hi > lo else torch.zeros(values.shape[1], dtype=values.dtype))
        maxes.append(m)
        sums.append(e.sum())
    # shapes [N=1, P, G=1, D], [1, P, 1]
    return (
        torch.stack(outs)[None, :, None, :],
        torch.stack(maxes)[None, :, None],
        torch.stack(sums)[None, :, None],
    )


row = st.integers(min_value=1, max_value=60).flatmap(
    lambda n: st.tuples(
        st.just(n),
        st.lists(st.integers(min_value=0, max_value=n), max_size=6).map(sorted),
        st.floats(min_value=0.1, max_value=80.0),
        st.integers(min_value=0, max_value=2**31 - 1),
    )
)


@settings(max_examples=150, deadline=None)
@given(row)
def test_merge_equals_softmax_over_the_row(params) -> None:
    n, cuts, spread, seed = params
    g = torch.Generator().manual_seed(seed)
    scores = (torch.rand(n, generator=g, dtype=torch.float64) - 0.5) * spread
    values = torch.randn(n, 5, generator=g, dtype=torch.float64)
    out, m, sums = merge_partitions(*[t.float() for t in partition_triples(scores, values, cuts)])
    expected = torch.softmax(scores, 0) @ values
    torch.testing.assert_close(normalise(out, sums)[0, 0].double(), expected, atol=2e-6, rtol=2e-5)
    assert m[0, 0].item() == scores.float().max().item()


@settings(max_examples=100, deadline=None)
@given(row)
def test_merging_is_associative(params) -> None:
    """Streaming merges chunk by chunk; that must equal merging all partitions at once."""
    n, cuts, spread, seed = params
    g = torch.Generator().manual_seed(seed)
    scores = (torch.rand(n, generator=g, dtype=torch.float64) - 0.5) * spread
    values = torch.randn(n, 3, generator=g, dtype=torch.float64)
    o, m, sums = (t.float() for t in partition_triples(scores, values, cuts))
    at_once = merge_partitions(o, m, sums)
    running = (o[:, 0], m[:, 0], sums[:, 0])
    for p in range(1, o.shape[1]):
        running = merge_two(running, (o[:, p], m[:, p], sums[:, p]))
    torch.testing.assert_close(normalise(running[0], running[2]), normalise(at_once[0], at_once[2]))


@settings(max_examples=100, deadline=None)
@given(row)
def test_normalised_partials_merge_the_same(params) -> None:
    """Partials already divided by their own sums (vLLM V2's tmp_out) merge to the same row."""
    n, cuts, spread, seed = params
    g = torch.Generator().manual_seed(seed)
    scores = (torch.rand(n, generator=g, dtype=torch.float64) - 0.5) * spread
    values = torch.randn(n, 4, generator=g, dtype=torch.float64)
    o, m, sums = (t.float() for t in partition_triples(scores, values, cuts))
    hat = torch.where(sums[..., None] > 0, o / sums.clamp(min=1e-30)[..., None], 0.0)
    out, _, total = merge_partitions(hat.half(), m, sums, normalised=True)
    expected = torch.softmax(scores, 0) @ values
    torch.testing.assert_close(normalise(out, total)[0, 0].double(), expected, atol=3e-3, rtol=0)


def test_empty_partitions_contribute_nothing() -> None:
    o = torch.tensor([[[[2.0, 4.0]], [[0.0, 0.0]]]])  # [1, 2, 1, 2]: second partition empty
    m = torch.tensor([[[1.5], [-math.inf]]])
    sums = torch.tensor([[[2.0], [0.0]]])
    out, mm, ll = merge_partitions(o, m, sums)
    assert torch.equal(normalise(out, ll), torch.tensor([[[1.0, 2.0]]]))
    assert mm.item() == 1.5 and ll.item() == 2.0


def test_safe_max_turns_only_minus_inf_into_zero() -> None:
    m = torch.tensor([-math.inf, -3.0, math.inf, 0.5])
    assert safe_max(m).tolist() == [0.0, -3.0, math.inf, 0.5]
