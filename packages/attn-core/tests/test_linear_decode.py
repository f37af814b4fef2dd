"""The serving step (:func:`gated_delta_decode`) and the token-by-token path against the
float64 reference: decode after a chunked prefill for many steps, in-place pool updates that
touch only the named slots, NaN-poisoned outputs."""

from __future__ import annotations

import pytest
import torch
from conftest import poisoned_like
from linear_helpers import assert_linear_close, make_linear_case

from attn_core import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule, gated_delta_decode
from attn_core.reference import reference_gated_delta

CPU_DECODE_STEPS = 200  # the device suite runs 1,000 (tests/test_linear_cuda.py)


def decode_after_prefill(
    prefill: int, steps: int, heads: tuple[int, int], dims: tuple[int, int], dtype, *,
    device: str = "cpu", l2norm: bool = True, seed: int = 0,
) -> None:  # fmt: skip
    """Two sequences: a chunked prefill of ``prefill`` tokens with its final states put in a
    pool, then ``steps`` decode steps; every output against the reference of the whole run."""
    h, hv = heads
    lens = [prefill + steps] * 2
    case = make_linear_case(lens, h, hv, *dims, dtype, varlen=False, l2norm=l2norm,
                            scale=0.2, seed=seed, device=device)  # fmt: skip
    want_o, want_s = reference_gated_delta(**case.reference_kwargs())
    pre = {n: t[:, :prefill] for n, t in dict(q=case.q, k=case.k, v=case.v, g=case.g,
                                                 beta=case.beta).items()}  # fmt: skip
    o, s = chunk_gated_delta_rule(
        **pre, scale=0.2, initial_state=case.initial_state, output_final_state=True,
        use_qk_l2norm_in_kernel=l2norm,
    )  # fmt: skip
    assert_linear_close(o, want_o[:, :prefill], dtype)
    pool = torch.full((5, hv, *dims), float("nan"), device=device)
    slots = torch.tensor([3, 1], dtype=torch.int32, device=device)
    pool[slots.long()] = s
    out = torch.empty(2, hv, dims[1], dtype=dtype, device=device)
    got = torch.empty(2, steps, hv, dims[1], dtype=torch.float64)
    for t in range(prefill, prefill + steps):
        out.fill_(float("nan"))
        gated_delta_decode(case.q[:, t], case.k[:, t], case.v[:, t], case.g[:, t],
                           case.beta[:, t], pool, slots, scale=0.2,
                           use_qk_l2norm_in_kernel=l2norm, out=out)  # fmt: skip
        got[:, t - prefill] = out.double().cpu()
    assert_linear_close(got, want_o[:, prefill:], dtype)
    assert_linear_close(
        pool[slots.long()], want_s, torch.float32 if dtype == torch.float32 else torch.float16
    )  # noqa: E501
    assert torch.isnan(pool[[0, 2, 4]]).all()  # the other slots: untouched


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_steps_after_prefill(dtype) -> None:
    decode_after_prefill(70, CPU_DECODE_STEPS, (2, 4), (16, 16), dtype)


def test_decode_without_l2norm_and_plain_heads() -> None:
    decode_after_prefill(5, 20, (2, 2), (32, 16), torch.float16, l2norm=False, seed=1)


def test_decode_writes_only_named_slots_bitwise() -> None:
    case = make_linear_case([1, 1, 1], 1, 2, 16, 16, varlen=False, seed=2)
    pool = torch.randn(6, 2, 16, 16)
    before = pool.clone()
    idx = torch.tensor([4, 0, 2])
    out = gated_delta_decode(case.q[:, 0], case.k[:, 0], case.v[:, 0], case.g[:, 0],
                             case.beta[:, 0], pool, idx)  # fmt: skip
    assert torch.equal(pool[[1, 3, 5]], before[[1, 3, 5]])
    assert not torch.equal(pool[idx], before[idx])
    want_o, want_s = reference_gated_delta(
        case.q, case.k, case.v, case.g, case.beta, initial_state=before[idx]
    )
    assert_linear_close(out, want_o[:, 0], torch.float32)
    assert_linear_close(pool[idx], want_s, torch.float32)


def test_decode_of_no_sequences() -> None:
    pool = torch.randn(2, 2, 16, 16)
    z = torch.empty(0, 1, 16)
    out = gated_delta_decode(z, z, torch.empty(0, 2, 16), torch.empty(0, 2), torch.empty(0, 2),
                             pool, torch.empty(0, dtype=torch.int64))  # fmt: skip
    assert out.shape == (0, 2, 16)


def test_fused_recurrent_matches_reference() -> None:
    case = make_linear_case([1, 64, 65, 30], 2, 4, 16, 32, torch.float16, seed=3)
    want_o, want_s = reference_gated_delta(**case.reference_kwargs())
    o, s = fused_recurrent_gated_delta_rule(**case.kwargs(), output_final_state=True)
    assert_linear_close(o, want_o, torch.float16)
    assert_linear_close(s, want_s, torch.float16)


def test_fused_recurrent_defaults_no_decay_and_unit_beta() -> None:
    case = make_linear_case([9, 9], 1, 1, 16, 16, varlen=False, initial=False, seed=4)
    o, _ = fused_recurrent_gated_delta_rule(case.q, case.k, case.v)
    ones, zeros = torch.ones_like(case.g), torch.zeros_like(case.g)
    want_o, _ = reference_gated_delta(case.q, case.k, case.v, zeros, ones)
    assert_linear_close(o, want_o, torch.float32)


def test_poisoned_out_is_fully_written() -> None:
    case = make_linear_case([1, 1], 1, 2, 16, 16, torch.bfloat16, varlen=False, seed=5)
    pool = torch.zeros(2, 2, 16, 16)
    out = poisoned_like(torch.empty(2, 2, 16, dtype=torch.bfloat16))
    got = gated_delta_decode(case.q[:, 0], case.k[:, 0], case.v[:, 0], case.g[:, 0],
                             case.beta[:, 0], pool, torch.tensor([1, 0]), out=out)  # fmt: skip
    assert got is out and torch.isfinite(out).all()


@pytest.mark.parametrize("checks", [False, True])
@pytest.mark.parametrize("slots", [[-1, 3, -1, 0], [-1, -1], [2, -1, -7]])
def test_padding_slots_leave_the_pool_alone(monkeypatch, checks, slots) -> None:
    """A negative slot (vLLM's padding, PAD_SLOT_ID = -1, in a CUDA-graph batch) leaves the pool
    untouched and gives zeros; the named slots are served as without the padding."""
    if checks:
        monkeypatch.setenv("ATTN_CORE_CHECKS", "1")
    from attn_core.core.settings import reload

    reload()
    try:
        n = len(slots)
        case = make_linear_case([1] * n, 1, 2, 16, 16, varlen=False, seed=3)
        pool = torch.randn(5, 2, 16, 16)
        before = pool.clone()
        idx = torch.tensor(slots)
        out = gated_delta_decode(case.q[:, 0], case.k[:, 0], case.v[:, 0], case.g[:, 0],
                                 case.beta[:, 0], pool, idx, backend="torch")  # fmt: skip
        real = [i for i, s in enumerate(slots) if s >= 0]
        untouched = [s for s in range(5) if s not in slots]
        assert torch.equal(pool[untouched], before[untouched])
        assert torch.equal(
            out[[i for i in range(n) if i not in real]], torch.zeros(n - len(real), 2, 16)
        )
        if real:
            want_o, want_s = reference_gated_delta(
                case.q[real], case.k[real], case.v[real], case.g[real], case.beta[real],
                initial_state=before[idx[real]],
            )  # fmt: skip
            assert_linear_close(out[real], want_o[:, 0], torch.float32)
            assert_linear_close(pool[idx[real]], want_s, torch.float32)
    finally:
        monkeypatch.delenv("ATTN_CORE_CHECKS", raising=False)
        reload()


def test_checks_refuse_a_slot_past_the_pool(monkeypatch) -> None:
    monkeypatch.setenv("ATTN_CORE_CHECKS", "1")
    from attn_core.core.settings import reload

    reload()
    try:
        case = make_linear_case([1, 1], 1, 2, 16, 16, varlen=False, seed=4)
        pool = torch.randn(3, 2, 16, 16)
        with pytest.raises(ValueError, match=r"state_indices must be in \[0, 3\).*got 3"):
            gated_delta_decode(case.q[:, 0], case.k[:, 0], case.v[:, 0], case.g[:, 0],
                               case.beta[:, 0], pool, torch.tensor([-1, 3]))  # fmt: skip
    finally:
        monkeypatch.delenv("ATTN_CORE_CHECKS", raising=False)
        reload()
