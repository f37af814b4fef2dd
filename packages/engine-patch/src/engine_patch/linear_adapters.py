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
- ``causal_conv1d_fn`` / ``causal_conv1d_update`` / ``gated_delta_decode``: attn-core's own
  parameters (vLLM's names).
- ``torch_chunk_gated_delta_rule`` / ``torch_recurrent_gated_delta_rule``: transformers'
  Qwen3-Next torch fallbacks: ``query, key, value`` in FLA's layout, the scale always
  ``K ** -0.5``, ``chunk_size`` a tiling detail (attn-core tiles its own way, same result).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

import torch

import attn_core


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


def _own(name: str) -> dict[str, Optional[str]]:
    params = inspect.signature(getattr(attn_core, name)).parameters
    return {p: p for p in params if p not in ("backend", "plan")}


CONVENTIONS: dict[str, Convention] = {
    "chunk_gated_delta_rule": Convention(
        "chunk_gated_delta_rule",
        _FLA_HEAD_FIRST,
        ("q", "k", "v", "g", "beta"),
        head_first=True,
        neutral=_FLA_NEUTRAL,
    ),
    "fused_recurrent_gated_delta_rule": Convention(
        "fused_recurrent_gated_delta_rule",
        _FLA_HEAD_FIRST,
        ("q", "k", "v"),
        head_first=True,
        neutral=_FLA_NEUTRAL,
    ),
    "causal_conv1d_fn": Convention("causal_conv1d_fn", _own("causal_conv1d_fn"), ("x", "weight")),
    "causal_conv1d_update": Convention(
        "causal_conv1d_update", _own("causal_conv1d_update"), ("x", "conv_state", "weight")
    ),
    "gated_delta_decode": Convention(
        "gated_delta_decode",
        _own("gated_delta_decode"),
        ("q", "k", "v", "g", "beta", "state_pool", "state_indices"),
    ),
    "torch_chunk_gated_delta_rule": Convention(
        "chunk_gated_delta_rule", dict(_HF, chunk_size=None), ("q", "k", "v", "g", "beta")
    ),
    "torch_recurrent_gated_delta_rule": Convention(
        "fused_recurrent_gated_delta_rule", _HF, ("q", "k", "v", "g", "beta")
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


def _transpose_tokens(x: Any) -> Any:
    return x.transpose(1, 2) if isinstance(x, torch.Tensor) else x


def _neutral(value: Any) -> bool:
    return value is None or (isinstance(value, (bool, int)) and not value)


def make_adapter(
    original: Callable, convention: Convention, fallback: Optional[Callable] = None
) -> Callable:
    """``original``'s signature, attn-core's ``convention.attn_core_name`` behind it (call
    :func:`match` first). A call setting a :attr:`Convention.neutral` parameter goes to
    ``fallback`` (the original, or a refusal on Iluvatar)."""
    signature = inspect.signature(original)
    target = getattr(attn_core, convention.attn_core_name)
    extra = [n for n, p in signature.parameters.items() if p.kind == p.VAR_KEYWORD]
    is_hf = "query" in convention.params

    @functools.wraps(original)
    def adapter(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        unserved = extra and bound.arguments.pop(extra[0], None)  # **kwargs: no meaning known
        if unserved or any(not _neutral(bound.arguments.get(n)) for n in convention.neutral):
            return (fallback or original)(*args, **kwargs)
        call: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            keyword = convention.params[name]
            if keyword is not None:
                call[keyword] = value
        head_first = bool(bound.arguments.get("head_first", False))
        if head_first:  # [B, H, T, ...] -> attn-core's [B, T, H, ...]
            for name in ("q", "k", "v", "g", "beta"):
                call[name] = _transpose_tokens(call.get(name))
        state = call.get("initial_state")
        if is_hf and isinstance(state, torch.Tensor) and state.dtype != torch.float32:
            call["initial_state"] = state.float()  # transformers keeps it in the model's dtype
        result = target(**call)
        if head_first:
            out, final = result
            return out.transpose(1, 2), final
        return result

    adapter.__signature__ = signature  # type: ignore[attr-defined]
    return adapter
