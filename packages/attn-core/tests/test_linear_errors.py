"""Every linear-attention entry point refuses bad input with an error that names the argument,
the expected and the actual value, and writes nothing (states included) when it does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from attn_core import (
    causal_conv1d_fn,
    causal_conv1d_update,
    chunk_gated_delta_rule,
    fused_recurrent_gated_delta_rule,
    gated_delta_decode,
)
from attn_core.linear.inputs import start_gate_check


def prefill_args() -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    return dict(
        q=torch.randn(1, 10, 2, 16, generator=g), k=torch.randn(1, 10, 2, 16, generator=g),
        v=torch.randn(1, 10, 4, 8, generator=g), g=-torch.rand(1, 10, 4, generator=g),
        beta=torch.rand(1, 10, 4, generator=g), initial_state=torch.zeros(2, 4, 16, 8),
        cu_seqlens=torch.tensor([0, 4, 10]),
    )  # fmt: skip


def decode_args() -> dict[str, Any]:
    g = torch.Generator().manual_seed(1)
    return dict(
        q=torch.randn(2, 2, 16, generator=g), k=torch.randn(2, 2, 16, generator=g),
        v=torch.randn(2, 4, 8, generator=g), g=-torch.rand(2, 4, generator=g),
        beta=torch.rand(2, 4, generator=g), state_pool=torch.zeros(3, 4, 16, 8),
        state_indices=torch.tensor([2, 0]), out=torch.empty(2, 4, 8),
    )  # fmt: skip


def conv_args() -> dict[str, Any]:
    return dict(
        x=torch.randn(6, 9), weight=torch.randn(6, 4), bias=torch.randn(6),
        conv_states=torch.zeros(3, 6, 3), query_start_loc=torch.tensor([0, 4, 9]),
        cache_indices=torch.tensor([2, 0]), has_initial_state=torch.tensor([True, False]),
        activation="silu",
    )  # fmt: skip


def update_args() -> dict[str, Any]:
    return dict(
        x=torch.randn(2, 6), conv_state=torch.zeros(3, 6, 3), weight=torch.randn(6, 4),
        bias=torch.randn(6), activation=None, conv_state_indices=torch.tensor([1, 2]),
    )  # fmt: skip


PREFILL_BAD = [
    ("q", lambda a: a["q"].double(), "q must be torch.float16 or torch.bfloat16 or torch.float32"),
    ("q", lambda a: a["q"][0], "q must have 4 dimensions"),
    ("k", lambda a: a["k"][..., :8], "k must have shape [1, 10, 2, 16]"),
    ("k", lambda a: a["k"].half(), "k must be torch.float32, got torch.float16"),
    ("v", lambda a: a["v"][:, :, :3], "must be a multiple of q's key heads, got HV = 3 and H = 2"),
    ("v", lambda a: a["v"][:, :9], "v must have shape [1, 10, *, *]"),
    ("g", lambda a: a["g"][..., :2], "g must have shape [1, 10, 4]"),
    ("g", lambda a: a["g"].abs(), "g must be <= 0 (a log decay), got a maximum of"),
    ("g", lambda a: a["g"].index_fill(1, torch.tensor([3]), float("nan")), "g must be finite"),
    ("g", lambda a: a["g"].index_fill(1, torch.tensor([3]), -float("inf")), "g must be finite"),
    (
        "beta",
        lambda a: a["beta"].index_fill(1, torch.tensor([3]), float("inf")),
        "beta must be finite",
    ),
    ("beta", lambda a: a["beta"].long(), "beta must be torch.float16"),
    ("cu_seqlens", lambda a: torch.tensor([1, 4, 10]), "cu_seqlens must start at 0, got 1"),
    ("cu_seqlens", lambda a: torch.tensor([0, 6, 4, 10]), "cu_seqlens must not decrease"),
    (
        "cu_seqlens",
        lambda a: torch.tensor([0, 4, 9]),
        "cu_seqlens must end at the token count 10, got 9",
    ),  # noqa: E501
    (
        "cu_seqlens",
        lambda a: torch.tensor([0.0, 10.0]),
        "cu_seqlens must be torch.int32 or torch.int64",
    ),  # noqa: E501
    ("cu_seqlens", lambda a: torch.tensor([0]), "cu_seqlens must have N + 1 >= 2 entries"),
    (
        "initial_state",
        lambda a: torch.zeros(3, 4, 16, 8),
        "initial_state must have shape [2, 4, 16, 8]",
    ),  # noqa: E501
    (
        "initial_state",
        lambda a: torch.zeros(2, 4, 16, 8).double(),
        "initial_state must be torch.float32, got torch.float64",
    ),  # noqa: E501
    ("initial_state", lambda a: torch.zeros(2, 4, 8, 16), "initial_state must have shape"),
    ("scale", lambda a: -1.0, "scale must be a positive float"),
    ("scale", lambda a: float("nan"), "scale must be a positive float"),
    ("use_qk_l2norm_in_kernel", lambda a: 1, "use_qk_l2norm_in_kernel must be a bool, got int"),
    ("output_final_state", lambda a: "yes", "output_final_state must be a bool, got str"),
]


@pytest.mark.parametrize("fn", [chunk_gated_delta_rule, fused_recurrent_gated_delta_rule])
@pytest.mark.parametrize(("name", "spoil", "message"), PREFILL_BAD)
def test_prefill_refuses(fn: Callable, name: str, spoil: Callable, message: str) -> None:
    args = prefill_args()
    args[name] = spoil(args)
    state_before = args["initial_state"].clone() if name != "initial_state" else None
    with pytest.raises((ValueError, TypeError)) as err:
        fn(**args)
    assert message in str(err.value)
    if state_before is not None:
        assert torch.equal(args["initial_state"], state_before)


def test_prefill_refuses_a_batch_with_cu_seqlens() -> None:
    args = prefill_args()
    for n in ("q", "k", "v", "g", "beta"):
        args[n] = torch.cat([args[n], args[n]])
    with pytest.raises(ValueError, match="q must have batch size 1 with cu_seqlens, got B = 2"):
        chunk_gated_delta_rule(**args)


def test_prefill_refuses_a_foreign_plan() -> None:
    with pytest.raises(TypeError, match="plan must be None or a GatedDeltaPlan, got dict"):
        chunk_gated_delta_rule(**prefill_args(), plan={})


DECODE_BAD = [
    ("q", lambda a: a["q"][None], "q must have 3 dimensions"),
    ("k", lambda a: a["k"][:1], "k must have shape [2, 2, 16]"),
    ("v", lambda a: a["v"][:, :3], "must be a multiple of q's key heads"),
    ("v", lambda a: a["v"].half(), "v must be torch.float32, got torch.float16"),
    ("g", lambda a: a["g"][:, :1], "g must have shape [2, 4]"),
    ("beta", lambda a: a["beta"][None], "beta must have 2 dimensions"),
    ("state_pool", lambda a: a["state_pool"].half(), "state_pool must be torch.float32"),
    ("state_pool", lambda a: torch.zeros(3, 4, 8, 16), "state_pool must have shape [*, 4, 16, 8]"),
    (
        "state_indices",
        lambda a: a["state_indices"].float(),
        "state_indices must be torch.int32 or torch.int64",
    ),  # noqa: E501
    ("state_indices", lambda a: a["state_indices"][:1], "state_indices must have shape [2]"),
    ("out", lambda a: torch.empty(2, 4, 8).half(), "out must be torch.float32"),
    (
        "out",
        lambda a: torch.empty(1, 8).expand(8, 8).view(2, 4, 8),
        "out must not have overlapping",
    ),  # noqa: E501
    ("scale", lambda a: 0.0, "scale must be a positive float"),
    ("use_qk_l2norm_in_kernel", lambda a: None, "use_qk_l2norm_in_kernel must be a bool"),
]

DECODE_VALUE_BAD = [
    ("state_indices", lambda a: torch.tensor([2, 3]), "state_indices must be in [0, 3), got 3"),
    ("state_indices", lambda a: torch.tensor([1, 1]), "state_indices must not repeat a slot"),
    ("g", lambda a: a["g"].abs(), "g must be <= 0"),
]


@pytest.mark.parametrize(("name", "spoil", "message"), DECODE_BAD)
def test_decode_refuses(name: str, spoil: Callable, message: str) -> None:
    _refuses(gated_delta_decode, decode_args(), "state_pool", name, spoil, message)


@pytest.mark.parametrize(("name", "spoil", "message"), DECODE_VALUE_BAD)
def test_decode_value_checks_with_checks_on(settings_env, name, spoil, message) -> None:
    settings_env.set("ATTN_CORE_CHECKS", "1")
    _refuses(gated_delta_decode, decode_args(), "state_pool", name, spoil, message)


def test_decode_reads_no_values_with_checks_off(settings_env) -> None:
    settings_env.set("ATTN_CORE_CHECKS", "0")
    args = decode_args()
    args["state_indices"] = torch.tensor([1, 1])  # unchecked: one of the two writes stays
    gated_delta_decode(**args)
    assert torch.equal(args["state_pool"][[0, 2]], torch.zeros(2, 4, 16, 8))


CONV_BAD = [
    ("x", lambda a: a["x"][None, None], "x must have 2 dimensions [dim, total_tokens] or 3"),
    ("x", lambda a: a["x"].long(), "x must be torch.float16"),
    ("weight", lambda a: a["weight"][:5], "weight must have shape [6, *]"),
    ("weight", lambda a: a["weight"][:, :1], "weight's width (dimension 1) must be >= 2, got 1"),
    ("bias", lambda a: a["bias"][:5], "bias must have shape [6]"),
    (
        "conv_states",
        lambda a: torch.zeros(3, 6, 2),
        "conv_states must hold at least width - 1 = 3 inputs",
    ),  # noqa: E501
    ("conv_states", lambda a: torch.zeros(3, 5, 3), "conv_states must have shape [*, 6, *]"),
    (
        "query_start_loc",
        lambda a: None,
        "query_start_loc must be given for x of shape [dim, total_tokens]",
    ),  # noqa: E501
    (
        "query_start_loc",
        lambda a: torch.tensor([0, 4, 8]),
        "query_start_loc must end at the token count 9, got 8",
    ),  # noqa: E501
    ("query_start_loc", lambda a: torch.tensor([0, 5, 4]), "query_start_loc must not decrease"),  # noqa: E501
    ("query_start_loc", lambda a: torch.tensor([2, 4, 9]), "query_start_loc must start at 0"),
    ("cache_indices", lambda a: torch.tensor([3, 0]), "cache_indices must be in [0, 3), got 3"),
    ("cache_indices", lambda a: torch.tensor([1, 1]), "cache_indices must not repeat a slot"),
    ("cache_indices", lambda a: torch.tensor([1]), "cache_indices must have shape [2]"),
    ("has_initial_state", lambda a: torch.tensor([1, 0]), "has_initial_state must be torch.bool"),
    ("activation", lambda a: "relu", "'swish', True or False, got 'relu'"),
    ("pad_slot_id", lambda a: 1.5, "pad_slot_id must be an int or None, got 1.5"),
]


@pytest.mark.parametrize(("name", "spoil", "message"), CONV_BAD)
def test_conv_prefill_refuses(name: str, spoil: Callable, message: str) -> None:
    _refuses(causal_conv1d_fn, conv_args(), "conv_states", name, spoil, message)


def test_conv_prefill_needs_states_for_slots() -> None:
    args = conv_args()
    args["conv_states"] = None
    with pytest.raises(ValueError, match="cache_indices needs conv_states"):
        causal_conv1d_fn(**args)


UPDATE_BAD = [
    ("x", lambda a: a["x"][0], "x must have 2 dimensions [N, dim] or 3 [N, dim, L]"),
    ("conv_state", lambda a: torch.zeros(3, 6, 2), "conv_state must hold at least width - 1 = 3"),
    ("conv_state", lambda a: torch.zeros(3, 6, 3).long(), "conv_state must be torch.float16"),
    (
        "conv_state_indices",
        lambda a: torch.tensor([1, 2, 0]),
        "conv_state_indices must have shape [2]",
    ),  # noqa: E501
    ("weight", lambda a: a["weight"].T, "weight must have shape [6, *]"),
    ("pad_slot_id", lambda a: "-1", "pad_slot_id must be an int or None, got '-1'"),
]


@pytest.mark.parametrize(("name", "spoil", "message"), UPDATE_BAD)
def test_conv_update_refuses(name: str, spoil: Callable, message: str) -> None:
    _refuses(causal_conv1d_update, update_args(), "conv_state", name, spoil, message)


@pytest.mark.parametrize("bad", [torch.tensor([1, 3]), torch.tensor([2, 2])])
def test_conv_update_value_checks_with_checks_on(settings_env, bad) -> None:
    settings_env.set("ATTN_CORE_CHECKS", "1")
    _refuses(causal_conv1d_update, update_args(), "conv_state", "conv_state_indices",
             lambda a: bad, "conv_state_indices must")  # fmt: skip


def test_conv_update_needs_a_slot_per_sequence() -> None:
    args = update_args()
    args["conv_state_indices"] = None
    args["conv_state"] = torch.zeros(1, 6, 3)
    with pytest.raises(ValueError, match="conv_state must have a slot per sequence"):
        causal_conv1d_update(**args)


def _refuses(fn, args, state_name, name, spoil, message) -> None:
    args[name] = spoil(args)
    state = args[state_name]
    before = state.clone() if isinstance(state, torch.Tensor) else None
    with pytest.raises((ValueError, TypeError)) as err:
        fn(**args)
    assert message in str(err.value), str(err.value)
    if before is not None and name != state_name:
        assert torch.equal(args[state_name], before), "a refused call wrote its state"


BACKEND_CALLS = [
    (chunk_gated_delta_rule, prefill_args, "initial_state"),
    (fused_recurrent_gated_delta_rule, prefill_args, "initial_state"),
    (gated_delta_decode, decode_args, "state_pool"),
    (causal_conv1d_fn, conv_args, "conv_states"),
    (causal_conv1d_update, update_args, "conv_state"),
]


@pytest.mark.parametrize(("fn", "make", "state"), BACKEND_CALLS)
@pytest.mark.parametrize("backend", ["cuda", "", 1, ["native"]])
def test_every_entry_refuses_an_unknown_backend(fn, make, state, backend) -> None:
    _refuses(fn, make(), state, "backend", lambda a: backend,
             "backend must be None or one of torch, native, got")  # fmt: skip


@pytest.mark.parametrize(("fn", "make", "state"), BACKEND_CALLS)
def test_forced_native_names_why_it_cannot_serve(fn, make, state) -> None:
    """On the CPU every native kernel needs a CUDA device; nothing is written."""
    why = "needs a CUDA device"
    args = make()
    before = args[state].clone()
    with pytest.raises(ValueError, match=f"backend='native' cannot serve {fn.__name__}.*{why}"):
        fn(**args, backend="native")
    assert torch.equal(args[state], before), "a refused call wrote its state"


@pytest.mark.parametrize(("fn", "make", "state"), BACKEND_CALLS)
def test_torch_and_default_backends_agree_on_the_cpu(fn, make, state) -> None:
    outs = []
    for backend in (None, "torch"):
        torch.manual_seed(7)  # conv_args draws from the global generator
        args = make()
        got = fn(**args, backend=backend)
        outs.append((got, args[state]))
    first, second = outs
    torch.testing.assert_close(first, second, rtol=0, atol=0)


def test_gate_check_reads_extremes_and_skips_empty_tensors() -> None:
    """The enqueued check reads g's and beta's extremes in fp32 (16-bit inputs included), and
    nothing when there are no tokens."""
    start_gate_check(torch.zeros(0, 4), torch.zeros(0, 4)).settle()
    start_gate_check(-torch.rand(5, 4), torch.rand(5, 4)).settle()
    with pytest.raises(ValueError, match="got a maximum of 0.5"):
        start_gate_check(torch.tensor([[-1.0, 0.5]]), torch.ones(1, 2)).settle()
    with pytest.raises(ValueError, match="g must be finite"):
        nan_g = torch.tensor([[-1.0, float("nan")]], dtype=torch.bfloat16)
        start_gate_check(nan_g, torch.ones(1, 2, dtype=torch.bfloat16)).settle()
    with pytest.raises(ValueError, match="beta must be finite"):
        start_gate_check(-torch.ones(1, 2), torch.tensor([[0.5, -float("inf")]])).settle()
