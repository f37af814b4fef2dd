"""The short causal convolution: prefill (varlen and batched) and decode against the float64
tap-by-tap reference, prefill-then-update agreement, and conv states written only in their
named slots and first ``W - 1`` positions."""

from __future__ import annotations

import pytest
import torch
from linear_helpers import assert_linear_close

from attn_core import causal_conv1d_fn, causal_conv1d_update
from attn_core.reference import reference_causal_conv1d

DIM, WIDTH = 12, 4


def _weights(gen, dtype=torch.float32):
    w = torch.randn(DIM, WIDTH, generator=gen).to(dtype)
    return w, torch.randn(DIM, generator=gen).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("activation", [None, "silu"])
def test_varlen_prefill_matches_reference(dtype, activation) -> None:
    gen = torch.Generator().manual_seed(0)
    lens = [1, 2, 5, 0, 9]
    x = torch.randn(DIM, sum(lens), generator=gen).to(dtype)
    w, b = _weights(gen, dtype)
    states = torch.randn(7, DIM, WIDTH + 1, generator=gen).to(dtype)  # longer than W - 1
    before = states.clone()
    slots = torch.tensor([6, 0, 3, 2, 5], dtype=torch.int32)
    has = torch.tensor([True, False, True, True, False])
    qsl = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    out = causal_conv1d_fn(x, w, b, conv_states=states, query_start_loc=qsl, cache_indices=slots,
                           has_initial_state=has, activation=activation)  # fmt: skip
    assert out.dtype == dtype and out.shape == x.shape
    for i, n in enumerate(lens):
        a = int(qsl[i])
        window = before[slots[i], :, : WIDTH - 1] if has[i] else None
        want, new = reference_causal_conv1d(x[:, a : a + n], w, b, window, activation)
        assert_linear_close(out[:, a : a + n], want, dtype)
        torch.testing.assert_close(
            states[slots[i], :, : WIDTH - 1].double(), new.to(dtype).double()
        )
    assert torch.equal(states[:, :, WIDTH - 1 :], before[:, :, WIDTH - 1 :])
    assert torch.equal(states[[1, 4]], before[[1, 4]])


def test_batched_prefill_without_states() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, DIM, 7, generator=gen)
    w, b = _weights(gen)
    out = causal_conv1d_fn(x, w, b, activation="swish")
    for i in range(3):
        want, _ = reference_causal_conv1d(x[i], w, b, None, "silu")
        assert_linear_close(out[i], want, torch.float32)


def test_batched_prefill_writes_rows_in_order() -> None:
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, DIM, 6, generator=gen)
    w, _ = _weights(gen)
    states = torch.zeros(2, DIM, WIDTH - 1)
    causal_conv1d_fn(x, w, conv_states=states)
    torch.testing.assert_close(states, x[:, :, -(WIDTH - 1) :])


@pytest.mark.parametrize("step_tokens", [1, 3])
def test_prefill_then_update_equals_one_prefill(step_tokens) -> None:
    gen = torch.Generator().manual_seed(3)
    n, prefix, rest = 3, 5, 6
    x = torch.randn(n, DIM, prefix + rest, generator=gen)
    w, b = _weights(gen)
    whole = causal_conv1d_fn(x, w, b, activation="silu")
    states = torch.full((n + 2, DIM, WIDTH - 1), float("nan"))
    slots = torch.tensor([4, 0, 2])
    flat = x[:, :, :prefix].permute(1, 0, 2).reshape(DIM, n * prefix)
    qsl = torch.arange(n + 1, dtype=torch.int32) * prefix
    pre = causal_conv1d_fn(flat, w, b, states, qsl, slots, torch.zeros(n, dtype=torch.bool), "silu")
    torch.testing.assert_close(pre.view(DIM, n, prefix).permute(1, 0, 2), whole[:, :, :prefix])
    for t in range(prefix, prefix + rest, step_tokens):
        xt = x[:, :, t : t + step_tokens]
        got = causal_conv1d_update(xt if step_tokens > 1 else xt[:, :, 0], states, w, b, "silu",
                                   slots)  # fmt: skip
        got = got if step_tokens > 1 else got[:, :, None]
        torch.testing.assert_close(got, whole[:, :, t : t + step_tokens])
    assert torch.isnan(states[[1, 3]]).all()


def test_update_without_indices_uses_the_first_rows() -> None:
    gen = torch.Generator().manual_seed(4)
    w, b = _weights(gen, torch.float16)
    state = torch.randn(3, DIM, WIDTH - 1, generator=gen).half()
    before = state.clone()
    x = torch.randn(2, DIM, generator=gen).half()
    out = causal_conv1d_update(x, state, w, b)
    for i in range(2):
        want, new = reference_causal_conv1d(x[i, :, None], w, b, before[i], None)
        assert_linear_close(out[i], want[:, 0], torch.float16)
        assert torch.equal(state[i], new.half())
    assert torch.equal(state[2], before[2])


def test_update_padding_slots_are_not_touched() -> None:
    """A negative conv-state slot (vLLM's PAD_SLOT_ID) reads and writes no state; zeros out."""
    gen = torch.Generator().manual_seed(5)
    w, b = _weights(gen, torch.float32)
    state = torch.randn(3, DIM, WIDTH - 1, generator=gen)
    before = state.clone()
    x = torch.randn(3, DIM, generator=gen)
    out = causal_conv1d_update(x, state, w, b, conv_state_indices=torch.tensor([-1, 2, -1]),
                               backend="torch")  # fmt: skip
    want, new = reference_causal_conv1d(x[1, :, None], w, b, before[2], None)
    assert_linear_close(out[1], want[:, 0], torch.float32)
    assert torch.equal(state[2], new.float())
    assert torch.equal(state[:2], before[:2])
    assert torch.equal(out[[0, 2]], torch.zeros(2, DIM))


@pytest.mark.parametrize("pad", [-1, 7])
def test_prefill_padding_slots_are_not_touched(pad) -> None:
    """A varlen prefill entry whose slot is ``pad_slot_id`` (vLLM's PAD_SLOT_ID, or any value
    the caller names) reads and writes no state, even where it has an initial state, and its
    outputs are zeros though its inputs are NaN; padding entries may repeat."""
    gen = torch.Generator().manual_seed(6)
    lens = [3, 5, 2, 4]
    x = torch.randn(DIM, sum(lens), generator=gen)
    qsl = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    x[:, int(qsl[1]) : int(qsl[2])] = float("nan")  # the first padded sequence's tokens
    w, b = _weights(gen)
    states = torch.randn(7 if pad < 0 else 8, DIM, WIDTH - 1, generator=gen)
    before = states.clone()
    slots = torch.tensor([4, pad, 1, pad])
    has = torch.tensor([True, True, True, False])
    out = causal_conv1d_fn(x, w, b, conv_states=states, query_start_loc=qsl, cache_indices=slots,
                           has_initial_state=has, activation="silu", pad_slot_id=pad,
                           backend="torch")  # fmt: skip
    for i in (0, 2):
        a, n = int(qsl[i]), lens[i]
        want, new = reference_causal_conv1d(x[:, a : a + n], w, b, before[slots[i]], "silu")
        assert_linear_close(out[:, a : a + n], want, torch.float32)
        assert torch.equal(states[slots[i]], new.float())
    for i in (1, 3):
        a, n = int(qsl[i]), lens[i]
        assert torch.equal(out[:, a : a + n], torch.zeros(DIM, n))
    untouched = [s for s in range(states.shape[0]) if s not in (4, 1)]
    assert torch.equal(states[untouched], before[untouched])


def test_update_names_its_padding_slot() -> None:
    """``pad_slot_id`` in range marks padding as -1 does: no state touched, zeros out."""
    gen = torch.Generator().manual_seed(7)
    w, b = _weights(gen)
    state = torch.randn(4, DIM, WIDTH - 1, generator=gen)
    before = state.clone()
    x = torch.randn(2, DIM, generator=gen)
    out = causal_conv1d_update(x, state, w, b, True, torch.tensor([3, 1]), pad_slot_id=3,
                               backend="torch")  # fmt: skip
    want, new = reference_causal_conv1d(x[1, :, None], w, b, before[1], "silu")
    assert_linear_close(out[1], want[:, 0], torch.float32)
    assert torch.equal(out[0], torch.zeros(DIM))
    assert torch.equal(state[1], new.float())
    assert torch.equal(state[[0, 2, 3]], before[[0, 2, 3]])


def test_update_checks_pad_slot_id_without_indices() -> None:
    """A wrong ``pad_slot_id`` is named even where no index would use it."""
    gen = torch.Generator().manual_seed(8)
    w, b = _weights(gen)
    state = torch.randn(2, DIM, WIDTH - 1, generator=gen)
    with pytest.raises(ValueError, match="pad_slot_id must be an int or None, got 1.5"):
        causal_conv1d_update(torch.randn(2, DIM, generator=gen), state, w, b, pad_slot_id=1.5)
