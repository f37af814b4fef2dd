"""Adapters from a serving stack's linear-attention functions to attn-core's.

A *convention* says how a foreign function's parameters map onto an attn-core entry point
(:mod:`attn_core.linear`). An adapter is built against the foreign function's own signature:
a call is bound with that signature (its defaults apply, positional or keyword alike) and
forwarded by name. A function whose signature has a parameter the convention does not know, or
lacks one attn-core needs, is not matched: :func:`match` says why, and nothing is patched -
an unknown parameter may change the semantics, and guessing would give wrong numbers silently.

Conventions (the name is what ``ENGINE_PATCH_LINEAR_OPS`` takes after ``=``):

- ``chunk_gated_delta_rule`` / ``fused_recurrent_gated_delta_rule``: flash-linear-attention's
  (and vLLM's copy of it): ``q, k [B, T, H, K]``, ``v [B, T, HV, V]``, ``g, beta [B, T, HV]``;
  ``head_first=True`` (older releases) means ``[B, H, T, ...]`` and is transposed.
- ``vllm_fused_recurrent_gated_delta_rule``: vLLM's serving form of FLA's recurrent rule, the
  states a pool (``initial_state [slots, HV, K, V]``) updated in place at ``ssm_state_indices``;
  a decode batch (one token a sequence, ``inplace_final_state``, no speculative tokens) runs
  :func:`attn_core.gated_delta_decode`, anything else the original.
- ``causal_conv1d_fn`` / ``causal_conv1d_update``: vLLM's Mamba convolutions, whose names
  attn-core's take (``pad_slot_id`` included); their prefix-caching and speculative inputs run
  the original when a call passes them.
- ``gated_delta_decode``: attn-core's own parameters.
- ``vllm_fused_gdn_gating``: vLLM's Qwen3-Next gate kernel ``fused_gdn_gating(A_log, a, b,
  dt_bias, beta, threshold)`` (older releases without ``b``), as
  :func:`attn_core.gated_delta_gates` (softplus's ``beta`` / ``threshold`` renamed).
- ``vllm_fused_sigmoid_gating_delta_rule_update``: vLLM's decode kernel that derives the gates
  from ``A_log, a, b, dt_bias`` (softplus's ``beta`` / ``threshold``) and runs the recurrent
  rule on the pool in place: a decode batch runs :func:`attn_core.gated_delta_gates` (beta kept
  in fp32, as the kernel does) and :func:`attn_core.gated_delta_decode`; anything else the
  original.
- ``torch_chunk_gated_delta_rule`` / ``torch_recurrent_gated_delta_rule``: transformers'
  Qwen3-Next torch fallbacks: ``query, key, value`` in FLA's layout, the scale always
  ``K ** -0.5``, ``chunk_size`` a tiling detail (attn-core tiles its own way, same result).

Recurrent states (:attr:`Convention.state`) are passed in the serving stack's layout
(:mod:`engine_patch.state_layout`): key-last ones go to attn-core as transposed views and come
back in the stack's layout; a call whose layout is unknown is not served.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

import torch

import attn_core
from engine_patch import settings
from engine_patch.state_layout import KEY_LAST


@dataclass(frozen=True)
class Convention:
    """``params``: foreign name -> attn-core keyword (None: accepted, not forwarded)."""

    attn_core_name: str
    params: dict[str, Optional[str]]
    required: tuple[str, ...]  # attn-core keywords a matched signature must provide
    head_first: bool = False  # the foreign function has FLA's ``head_first`` switch
    # Parameters attn-core serves only at this value (None or False): a call passing another
    # (or anything through the original's ``**kwargs``) runs the original function instead
    # (refused on Iluvatar when that one is Triton).
    neutral: tuple[str, ...] = ()
    # The foreign function is vLLM's in-place recurrent rule, served as attn-core's decode step
    # when the call is one (:func:`_decode_step_call`).
    decode_step: bool = False
    # The foreign function is vLLM's gate kernel: with ``b`` it returns ``(g, beta)`` with a
    # leading axis of 1, without it ``g`` alone (:func:`_gates_result`).
    gates: bool = False
    # The attn-core keyword that carries a recurrent state in the foreign function's layout
    # (``initial_state``, whose final state comes back the same way, or ``state_pool``).
    state: Optional[str] = None
    # The call passes the gates' inputs (A_log, a, b, dt_bias), not g and beta (a decode step
    # only: they are computed once the call is known to be served).
    fused_gates: bool = False


_FLA = {
    n: n
    for n in (
        "q",
        "k",
        "v",
        "g",
        "beta",
        "scale",
        "initial_state",
        "output_final_state",
        "cu_seqlens",
        "use_qk_l2norm_in_kernel",
    )  # fmt: skip
}
# Newer FLA releases: switches whose default is the plain rule, and ``cu_seqlens_cpu`` /
# ``chunk_indices``, host copies and tilings derived from ``cu_seqlens`` (same sequences).
_FLA_NEUTRAL = ("state_v_first", "use_beta_sigmoid_in_kernel", "allow_neg_eigval", "cp_context",
                "use_graph", "graph_mode")  # fmt: skip
_FLA_HEAD_FIRST = dict(_FLA, head_first=None, cu_seqlens_cpu=None, chunk_indices=None,
                       **dict.fromkeys(_FLA_NEUTRAL))  # fmt: skip
_HF: dict[str, Optional[str]] = {
    "query": "q",
    "key": "k",
    "value": "v",
    "g": "g",
    "beta": "beta",
    "initial_state": "initial_state",
    "output_final_state": "output_final_state",
    "use_qk_l2norm_in_kernel": "use_qk_l2norm_in_kernel",
}


# vLLM's fused_recurrent_gated_delta_rule: FLA's names, the pool and its slots, and the
# speculative-decoding inputs attn-core does not serve (neutral: a call passing them runs the
# original). cu_seqlens and inplace_final_state are read by the adapter, not forwarded.
_VLLM_RECURRENT: dict[str, Optional[str]] = {
    **{n: n for n in ("q", "k", "v", "g", "beta", "scale", "use_qk_l2norm_in_kernel")},
    "initial_state": "state_pool",
    "ssm_state_indices": "state_indices",
    "inplace_final_state": None,
    "cu_seqlens": None,
    "num_accepted_tokens": None,
    "retrieve_parent_token": None,
}


def _own(name: str) -> dict[str, Optional[str]]:
    params = inspect.signature(getattr(attn_core, name)).parameters
    return {p: p for p in params if p not in ("backend", "plan")}


# vLLM's Mamba convolutions take attn-core's names (pad_slot_id included) and, in current
# releases, inputs for prefix caching and speculative decoding that attn-core does not serve
# (neutral: a call passing one runs the original) and launch details with no meaning here
# (accepted and dropped: the Triton launch's precomputed tiling, its assertion switch, and
# sizes only those unserved inputs use).
_CONV_FN_NEUTRAL = ("block_idx_first_scheduled_token", "block_idx_last_scheduled_token",
                    "initial_state_idx", "num_computed_tokens")  # fmt: skip
_CONV_UPDATE_NEUTRAL = ("num_accepted_tokens", "query_start_loc", "block_idx_last_scheduled_token",
                        "initial_state_idx", "retrieve_parent_token")  # fmt: skip
_CONV_DROPPED = ("metadata", "validate_data", "block_size_to_align", "max_query_len")


def _vllm_conv(name: str, neutral: tuple[str, ...], required: tuple[str, ...]) -> Convention:
    params = dict(_own(name), **dict.fromkeys(neutral + _CONV_DROPPED))
    return Convention(name, params, required, neutral=neutral)


# vLLM's fused_gdn_gating: the layer's parameters by their names, softplus's by vLLM's.
_VLLM_GATES: dict[str, Optional[str]] = {
    "A_log": "A_log",
    "a": "a",
    "b": "b",
    "dt_bias": "dt_bias",
    "beta": "softplus_beta",
    "threshold": "softplus_threshold",
}

# vLLM's fused_sigmoid_gating_delta_rule_update: the gate kernel's inputs (softplus's by vLLM's
# names) and the in-place recurrent rule's; ``is_kda`` (per-key gates) and speculative tokens are
# not served.
_VLLM_SIGMOID: dict[str, Optional[str]] = {
    **_VLLM_GATES,
    **{n: n for n in ("q", "k", "v", "scale", "use_qk_l2norm_in_kernel")},
    "initial_state": "state_pool",
    "ssm_state_indices": "state_indices",
    "inplace_final_state": None,
    "cu_seqlens": None,
    "num_accepted_tokens": None,
    "is_kda": None,
}
_GATE_KEYS = ("A_log", "a", "b", "dt_bias", "softplus_beta", "softplus_threshold")

CONVENTIONS: dict[str, Convention] = {
    "chunk_gated_delta_rule": Convention(
        "chunk_gated_delta_rule",
        _FLA_HEAD_FIRST,
        ("q", "k", "v", "g", "beta"),
        head_first=True,
        neutral=_FLA_NEUTRAL,
        state="initial_state",
    ),
    "fused_recurrent_gated_delta_rule": Convention(
        "fused_recurrent_gated_delta_rule",
        _FLA_HEAD_FIRST,
        ("q", "k", "v"),
        head_first=True,
        neutral=_FLA_NEUTRAL,
        state="initial_state",
    ),
    "vllm_fused_recurrent_gated_delta_rule": Convention(
        "gated_delta_decode",
        _VLLM_RECURRENT,
        ("q", "k", "v", "g", "beta", "state_pool", "state_indices"),
        neutral=("num_accepted_tokens", "retrieve_parent_token"),
        decode_step=True,
        state="state_pool",
    ),
    "vllm_fused_sigmoid_gating_delta_rule_update": Convention(
        "gated_delta_decode",
        _VLLM_SIGMOID,
        ("A_log", "a", "b", "dt_bias", "q", "k", "v", "state_pool", "state_indices"),
        neutral=("num_accepted_tokens", "is_kda"),
        decode_step=True,
        state="state_pool",
        fused_gates=True,
    ),
    "causal_conv1d_fn": _vllm_conv("causal_conv1d_fn", _CONV_FN_NEUTRAL, ("x", "weight")),
    "causal_conv1d_update": _vllm_conv(
        "causal_conv1d_update", _CONV_UPDATE_NEUTRAL, ("x", "conv_state", "weight")
    ),
    "gated_delta_decode": Convention(
        "gated_delta_decode",
        _own("gated_delta_decode"),
        ("q", "k", "v", "g", "beta", "state_pool", "state_indices"),
    ),
    "vllm_fused_gdn_gating": Convention(
        "gated_delta_gates", _VLLM_GATES, ("A_log", "a", "dt_bias"), gates=True
    ),
    "torch_chunk_gated_delta_rule": Convention(
        "chunk_gated_delta_rule",
        dict(_HF, chunk_size=None),
        ("q", "k", "v", "g", "beta"),
        state="initial_state",
    ),
    "torch_recurrent_gated_delta_rule": Convention(
        "fused_recurrent_gated_delta_rule", _HF, ("q", "k", "v", "g", "beta"), state="initial_state"
    ),
}


def match(fn: Any, convention: Convention) -> Optional[str]:
    """None when ``fn``'s signature can be served by ``convention``, else why not."""
    if not callable(fn):
        return f"not callable ({type(fn).__name__})"
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError) as exc:
        return f"its signature cannot be read: {exc}"
    variadic = [p.name for p in params.values() if p.kind == p.VAR_POSITIONAL]
    if variadic:
        return f"takes *{variadic[0]}: its arguments cannot be matched by name"
    named = [n for n, p in params.items() if p.kind != p.VAR_KEYWORD]
    unknown = [n for n in named if n not in convention.params]
    if unknown:
        return (
            f"parameters {unknown} have no counterpart in attn_core.{convention.attn_core_name} "
            f"(expected a subset of {sorted(convention.params)})"
        )
    given = {convention.params[n] for n in named}
    missing = [n for n in convention.required if n not in given]
    if missing:
        return f"lacks parameters attn-core needs: {missing}"
    return None


def _decode_step_call(
    bound: dict[str, Any], call: dict[str, Any], gates_pending: bool = False
) -> Optional[tuple]:
    """``call`` reshaped for :func:`attn_core.gated_delta_decode` and the ``[B, T]`` to give
    the output back, when vLLM's recurrent call is a decode batch; None otherwise.

    A decode batch: the final states written in place at ``ssm_state_indices`` (one slot a
    sequence), and one token a sequence, read from the shapes alone (no host sync: ``cu_seqlens``
    of ``N + 1`` offsets over ``T = N`` tokens, as vLLM's decode metadata is, or ``T = 1``).
    ``gates_pending``: ``g`` and ``beta`` come later, from the gate inputs (:func:`_with_gates`).
    """
    q, indices, cu = call.get("q"), call.get("state_indices"), bound.get("cu_seqlens")
    if not (bound.get("inplace_final_state") and isinstance(q, torch.Tensor) and q.dim() == 4):
        return None
    if not isinstance(indices, torch.Tensor) or indices.dim() != 1:
        return None
    if not isinstance(call.get("state_pool"), torch.Tensor):
        return None
    batch, tokens = q.shape[0], q.shape[1]
    one_each = (batch == 1 and cu.shape[0] - 1 == tokens) if cu is not None else tokens == 1
    gates = gates_pending or (call.get("g") is not None and call.get("beta") is not None)
    if not one_each or not gates:
        return None
    flat = dict(call)
    for name in ("q", "k", "v") if gates_pending else ("q", "k", "v", "g", "beta"):
        value = call[name]
        flat[name] = value.reshape(batch * tokens, *value.shape[2:])
    return flat, (batch, tokens)


def _gates_result(result: tuple, with_b: bool) -> Any:
    """vLLM's return of its gate kernel: ``(g, beta)`` each ``[1, tokens, HV]`` where the
    function takes ``b``; ``g`` ``[tokens, HV]`` alone where it does not (older releases)."""
    g, beta = result
    return (g.unsqueeze(0), beta.unsqueeze(0)) if with_b else g


def _transpose_tokens(x: Any) -> Any:
    return x.transpose(1, 2) if isinstance(x, torch.Tensor) else x


def _neutral(value: Any) -> bool:
    return value is None or (isinstance(value, (bool, int)) and not value)


Layout = Callable[[], tuple[Optional[str], str]]


def _layout_once(layout: Optional[Layout]) -> Layout:
    """``layout``'s first definite answer, kept (a decode step must not ask every call); an
    unknown one is asked again next call (vLLM loads its shape rule before the first step)."""
    known: list[tuple[Optional[str], str]] = []

    def resolve() -> tuple[Optional[str], str]:
        if known:
            return known[0]
        answer = layout() if layout is not None else (None, "no state layout given")
        if answer[0] is not None:
            known.append(answer)
        return answer

    return resolve


def _uses_state(convention: Convention, bound: dict[str, Any]) -> bool:
    """Whether the call reads or writes a recurrent state in the foreign layout."""
    if convention.state is None:
        return False
    if convention.decode_step:
        return True
    return bound.get("initial_state") is not None or bool(bound.get("output_final_state"))


def _with_gates(call: dict[str, Any]) -> dict[str, Any]:
    """``call`` with ``g`` and ``beta`` from the gate inputs, in v's shape less its last axis
    (``[B, T, HV]``, or ``[N, HV]`` for a flattened decode batch; beta in fp32: the fused kernel
    never rounds it to the model's dtype)."""
    gates = {n: call.pop(n) for n in _GATE_KEYS if n in call}
    b = gates.get("b")
    if isinstance(b, torch.Tensor):
        gates["b"] = b.float()
    g, beta = attn_core.gated_delta_gates(**gates)
    v = call.get("v")
    if isinstance(v, torch.Tensor) and v.dim() >= 3 and isinstance(beta, torch.Tensor):
        g, beta = g.reshape(v.shape[:-1]), beta.reshape(v.shape[:-1])
    call["g"], call["beta"] = g, beta
    return call


def make_adapter(
    original: Callable,
    convention: Convention,
    refuse: Optional[Callable[[str], Any]] = None,
    layout: Optional[Layout] = None,
) -> Callable:
    """``original``'s signature, attn-core's ``convention.attn_core_name`` behind it (call
    :func:`match` first). A call attn-core does not serve (a :attr:`Convention.neutral`
    parameter set, an unknown state layout, vLLM's recurrent rule on more than one token a
    sequence) runs ``original``, or ``refuse(why)`` where given (the Triton refusal on
    Iluvatar). ``layout`` answers :func:`engine_patch.state_layout.layout_for` for the
    function's module."""
    signature = inspect.signature(original)
    target = getattr(attn_core, convention.attn_core_name)
    extra = [n for n, p in signature.parameters.items() if p.kind == p.VAR_KEYWORD]
    is_hf = "query" in convention.params
    state_layout = _layout_once(layout)

    @functools.wraps(original)
    def adapter(*args: Any, **kwargs: Any) -> Any:
        def unserved(why: str) -> Any:
            return original(*args, **kwargs) if refuse is None else refuse(why)

        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        if extra and bound.arguments.pop(extra[0], None):  # **kwargs: no meaning known
            return unserved(f"the call passed **{extra[0]}")
        used = [n for n in convention.neutral if not _neutral(bound.arguments.get(n))]
        if used:
            return unserved(f"the call set {used}")
        call: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            keyword = convention.params[name]
            if keyword is not None:
                call[keyword] = value
        if convention.gates:
            return _gates_result(target(**call), "b" in signature.parameters)
        flip = False
        if _uses_state(convention, bound.arguments):
            layout_now, why = state_layout()
            if layout_now is None:
                return unserved(
                    f"the recurrent state's layout is unknown ({why}); "
                    f"{settings.STATE_LAYOUT_ENV}=kv or vk states it"
                )
            flip = layout_now == KEY_LAST
        if convention.decode_step:  # the gates only once the call is known to be served
            step = _decode_step_call(bound.arguments, call, convention.fused_gates)
            if step is None:
                return unserved("not a decode batch (one token a sequence, states in place)")
            flat, (batch, tokens) = step
            if convention.fused_gates:
                flat = _with_gates(flat)
            pool = flat["state_pool"]
            if flip:  # attn-core's [.., K, V] view of a [.., V, K] pool: written in place
                flat["state_pool"] = pool.transpose(-1, -2)
            out = target(**flat)
            return out.view(batch, tokens, *out.shape[1:]), pool
        head_first = bool(bound.arguments.get("head_first", False))
        if head_first:  # [B, H, T, ...] -> attn-core's [B, T, H, ...]
            for name in ("q", "k", "v", "g", "beta"):
                call[name] = _transpose_tokens(call.get(name))
        state = call.get("initial_state")
        if is_hf and isinstance(state, torch.Tensor) and state.dtype != torch.float32:
            state = call["initial_state"] = state.float()  # transformers keeps the model's dtype
        if flip and isinstance(state, torch.Tensor):
            call["initial_state"] = state.transpose(-1, -2)
        result = target(**call)
        if not (head_first or flip):
            return result
        out, final = result
        if flip and final is not None:  # back in the stack's layout, as its kernel writes it
            final = final.transpose(-1, -2).contiguous()
        return (out.transpose(1, 2) if head_first else out), final

    adapter.__signature__ = signature  # type: ignore[attr-defined]
    return adapter
