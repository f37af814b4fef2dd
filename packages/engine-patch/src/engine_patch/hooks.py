"""Replacements for vLLM's ``PagedAttention.forward_decode`` / ``forward_prefix`` and the
native-op safety net.

The replacements read their arguments by name through the replaced function's own signature
(:class:`ArgReader`), so they accept exactly what vLLM's callers pass, positional or keyword,
upstream or fork names. A parameter engine-patch needs and cannot find is refused when the patch
is built, not on the first forward pass.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any

import torch

import attn_core
from engine_patch import native_v2, routing
from engine_patch.native import NativeOp
from engine_patch.ops import check_head_mapping, decode_into, head_mapping
from engine_patch.signatures import VENDOR, UnknownSignatureError
from engine_patch.state import STATE

logger = logging.getLogger("engine_patch")

_DEFAULTS: dict[str, Any] = {
    "alibi_slopes": None,
    "kv_cache_dtype": "auto",
    "k_scale": 1.0,
    "v_scale": 1.0,
    "tp_rank": 0,
    "blocksparse_local_blocks": 0,
    "blocksparse_vert_stride": 0,
    "blocksparse_block_size": 64,
    "blocksparse_head_sliding_step": 0,
    "sliding_window": None,
}

DECODE_PARAMS = {
    "query": ("query",),
    "key_cache": ("key_cache",),
    "value_cache": ("value_cache",),
    "block_tables": ("block_tables",),
    "seq_lens": ("seq_lens", "context_lens"),
    "max_seq_len": ("max_seq_len", "max_context_len"),
    "kv_heads": ("num_kv_heads", "head_mapping"),
    "scale": ("scale",),
    "alibi_slopes": ("alibi_slopes",),
    "kv_cache_dtype": ("kv_cache_dtype",),
    "k_scale": ("k_scale",),
    "v_scale": ("v_scale",),
    "tp_rank": ("tp_rank",),
    "blocksparse_local_blocks": ("blocksparse_local_blocks",),
    "blocksparse_vert_stride": ("blocksparse_vert_stride",),
    "blocksparse_block_size": ("blocksparse_block_size",),
    "blocksparse_head_sliding_step": ("blocksparse_head_sliding_step",),
}

PREFIX_PARAMS = {
    "query": ("query",),
    "key": ("key",),
    "value": ("value",),
    "kv_cache_dtype": ("kv_cache_dtype",),
    "key_cache": ("key_cache",),
    "value_cache": ("value_cache",),
    "block_tables": ("block_tables",),
    "query_start_loc": ("query_start_loc",),
    "seq_lens": ("seq_lens_tensor", "seq_lens"),
    "context_lens": ("context_lens",),
    "max_query_len": ("max_query_len",),
    "alibi_slopes": ("alibi_slopes",),
    "sliding_window": ("sliding_window",),
    "k_scale": ("k_scale",),
    "v_scale": ("v_scale",),
}


class ArgReader:
    """Maps a call of ``fn`` to canonical argument names (``params``: canonical -> accepted)."""

    def __init__(self, fn: Callable, params: dict[str, tuple[str, ...]], where: str) -> None:
        self.signature = inspect.signature(fn)
        names = tuple(self.signature.parameters)
        self.names: dict[str, str] = {}
        for canonical, accepted in params.items():
            found = [n for n in accepted if n in names]
            if found:
                self.names[canonical] = found[0]
            elif canonical not in _DEFAULTS:
                raise UnknownSignatureError(
                    f"{where} must have a parameter named {' or '.join(accepted)}, "
                    f"got ({', '.join(names)})"
                )

    def __call__(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = dict(_DEFAULTS)
        for canonical, name in self.names.items():
            values[canonical] = bound.arguments[name]
        return values


def _call_native_v1(out: torch.Tensor, a: dict[str, Any]) -> bool:
    """Run the platform's V1 into ``out``; False when it cannot (then attn-core runs)."""
    native = STATE.natives["paged_attention_v1"]
    fn = native.fn
    if fn is None:
        return False
    query, key_cache, value_cache = a["query"], a["key_cache"], a["value_cache"]
    num_kv_heads = key_cache.shape[1]
    block_size = value_cache.shape[3]
    common = (a["scale"], a["block_tables"], a["seq_lens"], block_size, a["max_seq_len"])
    tail = (a["alibi_slopes"], a["kv_cache_dtype"])
    if native.flavour == VENDOR:
        if a["k_scale"] != 1.0 or a["v_scale"] != 1.0:
            return False  # the fork's V1 takes no fp8 scales
        heads = a["kv_heads"]
        if not isinstance(heads, torch.Tensor):
            heads = head_mapping(query.shape[1], num_kv_heads, query.device)
        args: tuple = (out, query, key_cache, value_cache, heads) + common + tail
    else:
        args = (out, query, key_cache, value_cache, num_kv_heads) + common + tail
        args += (a["k_scale"], a["v_scale"], a["tp_rank"])
        args += (
            a["blocksparse_local_blocks"],
            a["blocksparse_vert_stride"],
            a["blocksparse_block_size"],
            a["blocksparse_head_sliding_step"],
        )
    try:
        fn(*args)
    except NotImplementedError as exc:
        native.failure = f"raised NotImplementedError: {exc}"
        logger.warning("engine-patch: native paged_attention_v1 failed, attn-core serves: %s", exc)
        return False
    return True


# decode_into's parameters after ``out``: DECODE_PARAMS gives them the same canonical names.
_DECODE_INTO = tuple(inspect.signature(decode_into).parameters)[1:]


def _decode_values(a: dict[str, Any]) -> dict[str, Any]:
    """The canonical values ``decode_into`` (and, with ``kv_heads``, native V2) takes."""
    return {name: a[name] for name in _DECODE_INTO}


def _call_native_v2(out: torch.Tensor, a: dict[str, Any]) -> bool:
    native = STATE.natives["paged_attention_v2"]
    return native_v2.call(native, out, kv_heads=a["kv_heads"], **_decode_values(a))


def make_forward_decode(original: Callable) -> Callable:
    """``PagedAttention.forward_decode`` routed by :func:`engine_patch.routing.choose`."""
    read = ArgReader(original, DECODE_PARAMS, "PagedAttention.forward_decode")

    def forward_decode(*args: Any, **kwargs: Any) -> torch.Tensor:
        a = read(args, kwargs)
        if a["blocksparse_vert_stride"] is not None and a["blocksparse_vert_stride"] > 1:
            return original(*args, **kwargs)  # block-sparse decode exists only natively
        query, key_cache, value_cache = a["query"], a["key_cache"], a["value_cache"]
        impl, _, _ = routing.choose(
            a["max_seq_len"], value_cache.shape[-1], query.shape[-1], query.dtype, query.device
        )
        out = torch.empty_like(query)
        if impl == routing.NATIVE_V1 and _call_native_v1(out, a):
            return out
        if impl == routing.NATIVE_V2 and _call_native_v2(out, a):
            return out
        heads = a["kv_heads"]
        if isinstance(heads, torch.Tensor):
            check_head_mapping(heads, query, key_cache)
        elif heads != key_cache.shape[1]:
            raise ValueError(
                f"num_kv_heads must equal key_cache.shape[1] ({key_cache.shape[1]}), got {heads}"
            )
        decode_into(out, **_decode_values(a))
        return out

    forward_decode.__signature__ = read.signature  # type: ignore[attr-defined]
    forward_decode.__doc__ = "engine-patch: native V1 within its reach, attn-core's plan beyond."
    return forward_decode


def make_forward_prefix(original: Callable) -> Callable:
    """``PagedAttention.forward_prefix`` on attn-core (never Triton)."""
    read = ArgReader(original, PREFIX_PARAMS, "PagedAttention.forward_prefix")

    def forward_prefix(*args: Any, **kwargs: Any) -> torch.Tensor:
        a = read(args, kwargs)
        # vLLM 0.6.3's prefix path has no scale argument: its kernel uses 1/sqrt(head_size).
        return attn_core.paged_prefix_prefill(
            a["query"],
            a["key"],
            a["value"],
            a["key_cache"],
            a["value_cache"],
            a["block_tables"],
            a["query_start_loc"],
            a["seq_lens"],
            a["context_lens"],
            a["max_query_len"],
            None,
            alibi_slopes=a["alibi_slopes"],
            sliding_window=a["sliding_window"],
            kv_cache_dtype=a["kv_cache_dtype"],
            k_scale=a["k_scale"],
            v_scale=a["v_scale"],
        )

    forward_prefix.__signature__ = read.signature  # type: ignore[attr-defined]
    forward_prefix.__doc__ = "engine-patch: attn-core's chunked prefill over the paged prefix."
    return forward_prefix


def native_with_fallback(native: NativeOp, replacement: Callable) -> Callable:
    """Keep a present native op; if it raises ``NotImplementedError``, attn-core from then on."""
    fn = native.fn

    @functools.wraps(fn)  # type: ignore[arg-type]
    def op(*args: Any, **kwargs: Any) -> Any:
        if native.failure is None:
            try:
                return fn(*args, **kwargs)  # type: ignore[misc]
            except NotImplementedError as exc:
                native.failure = f"raised NotImplementedError: {exc}"
                logger.warning(
                    "engine-patch: native %s failed, attn-core takes over: %s", native.name, exc
                )
        return replacement(*args, **kwargs)

    return op
