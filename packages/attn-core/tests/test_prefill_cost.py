"""The prefill price (attn_core.prefill.cost): monotone in the work, ordered by the rates it
reads, every efficiency with a provenance."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_core import AttentionShape, get_device_spec
from attn_core.device.spec import DEVICE_SPECS
from attn_core.prefill.cost import EFFICIENCY, prefill_work, price

QWEN = AttentionShape(24, 4, 256, 16)
BACKENDS = sorted(EFFICIENCY)


def cost(backend: str, profile: str, q: int, ctx: int, seqs: int = 1) -> float:
    return price(backend, prefill_work(QWEN, seqs, q, ctx), get_device_spec(profile)).seconds


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_efficiency_has_a_provenance(backend: str) -> None:
    eff = EFFICIENCY[backend]
    assert eff.provenance.split(":")[0] in ("measured", "assumed"), eff.provenance
    assert 0 < eff.compute <= 1 and 0 < eff.memory <= 1


@settings(max_examples=60, deadline=None)
@given(
    backend=st.sampled_from(BACKENDS),
    profile=st.sampled_from(sorted(DEVICE_SPECS)),
    q=st.integers(1, 16384),
    ctx=st.integers(0, 300_000),
    more=st.integers(1, 50_000),
)
def test_more_work_never_costs_less(backend, profile, q, ctx, more) -> None:
    base = cost(backend, profile, q, ctx)
    assert cost(backend, profile, q, ctx + more) >= base
    assert cost(backend, profile, q + more, ctx) >= base
    assert cost(backend, profile, q, ctx, seqs=2) >= base


def test_work_counts_the_causal_half_of_the_chunk() -> None:
    work = prefill_work(AttentionShape(2, 1, 64, 16), 1, 4, 10)
    assert work.scores == 2 * (4 * 10 + 4 * 5 / 2)
    assert work.flops == 4 * 64 * work.scores
    assert work.kv_bytes == 2 * 10 * 1 * 64 * 2


@pytest.mark.parametrize("profile", sorted(DEVICE_SPECS))
@pytest.mark.parametrize(("q", "ctx"), ((2048, 100_000), (8192, 250_000)))
def test_blas_beats_the_cuda_core_tile_on_every_profile(profile, q, ctx) -> None:
    """Item 10: where the BLAS matrix units beat a CUDA-core kernel, the torch path is priced
    below the FMA tile (so it stays the default until a matrix variant verifies)."""
    assert cost("torch", profile, q, ctx) < cost("native:fma", profile, q, ctx)
    assert cost("native:wmma", profile, q, ctx) < cost("native:fma", profile, q, ctx)


def test_h200_torch_price_is_near_the_measured_table() -> None:
    """The torch efficiency was fitted to issue 16's H200 table; the price stays within 10%
    of both rows it was read from (142 ms at 100K / 8192, 35.8 ms at 100K / 2048)."""
    assert cost("torch", "h200", 8192, 100_000) == pytest.approx(0.142, rel=0.1)
    assert cost("torch", "h200", 2048, 100_000) == pytest.approx(0.0358, rel=0.1)
    assert cost("sdpa", "h200", 8192, 100_000) == pytest.approx(0.0695, rel=0.1)


def test_unknown_backend_is_named() -> None:
    with pytest.raises(ValueError, match=r"backend must be one of .*got 'triton'"):
        price("triton", prefill_work(QWEN, 1, 1, 1), get_device_spec("h200"))
