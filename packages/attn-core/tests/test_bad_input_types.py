"""Types at the API boundary (issue 18, class 7): every entry point and planner answers a
wrong-typed or degenerate argument with a ValueError / TypeError that names the argument,
what it expected and what it got; never AttributeError, ZeroDivisionError or a raw torch error.

One table of spoils per class: wrong Python types (None where a tensor is needed, float or
bool for an int, a plan / backend / device_spec / workspace of the wrong kind), degenerate
sizes (zero KV heads, zero query heads, zero blocks, negative or zero lengths) and ``out=``
tensors that cannot be written element by element (expanded, overlapping).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from bad_input_helpers import decode_args, prefill_args, write_args

from attn_core import (
    AttentionShape,
    Capabilities,
    DecodeLengths,
    DecodeOverrides,
    PrefillLengths,
    PrefillOverrides,
    decode_plan_for,
    get_device_spec,
    paged_decode,
    paged_prefix_prefill,
    plan_decode,
    plan_prefill,
    prefill_plan_for,
    profile_capabilities,
    write_to_paged_cache,
)

SHAPE = AttentionShape(8, 2, 64, 16, torch.float16)
SPEC = get_device_spec("h200")


def _caps() -> Capabilities:
    return profile_capabilities(SPEC, torch.float16)


def _decode_plan() -> Any:
    return plan_decode(SHAPE, DecodeLengths(2, 40, 5), SPEC, _caps())


def _prefill_plan() -> Any:
    return plan_prefill(SHAPE, PrefillLengths(5, 20), SPEC, _caps())


def _zero_kv_heads(args: dict) -> dict:
    kc, vc = args["key_cache"], args["value_cache"]
    args["key_cache"], args["value_cache"] = kc[:, :0], vc[:, :0]
    for name in ("key", "value"):
        if name in args:
            args[name] = args[name][:, :0]
    return args


def _zero_heads(args: dict) -> dict:
    args["query"] = args["query"][:, :0]
    args["out"] = args["out"][:, :0] if args.get("out") is not None else None
    return args


def _zero_blocks(args: dict) -> dict:
    args["key_cache"], args["value_cache"] = args["key_cache"][:0], args["value_cache"][:0]
    return args


def _expanded_out(args: dict) -> dict:
    out = args["out"]
    args["out"] = out[:1].expand(out.shape)  # stride 0 along the batch: every row aliased
    return args


def _overlapping_out(args: dict) -> dict:
    out = args["out"]
    n, h, d = out.shape
    # rows overlap by half a head: a legal view, but writes land on each other
    args["out"] = torch.empty(n * h * d, dtype=out.dtype).as_strided((n, h, d), (h * d // 2, d, 1))
    return args


def _setter(name: str, value: Any) -> Callable[[dict], dict]:
    def spoil(args: dict) -> dict:
        args[name] = value() if callable(value) and not isinstance(value, type) else value
        return args

    return spoil


ENTRIES = {
    "paged_decode": (paged_decode, decode_args),
    "paged_prefix_prefill": (paged_prefix_prefill, prefill_args),
    "write_to_paged_cache": (write_to_paged_cache, write_args),
}

# (entry point, the argument the error must name, spoil)
CALL_SPOILS = [
    ("paged_prefix_prefill", "plan", _setter("plan", "torch")),
    ("paged_prefix_prefill", "plan", _setter("plan", 3)),
    ("paged_prefix_prefill", "plan", _setter("plan", _decode_plan)),
    ("paged_decode", "plan", _setter("plan", _prefill_plan)),
    ("paged_decode", "plan", _setter("plan", {"tier": "one_pass"})),
    ("paged_decode", "backend", _setter("backend", 1)),
    ("paged_decode", "backend", _setter("backend", True)),
    ("paged_decode", "backend", _setter("backend", ["torch"])),
    ("paged_prefix_prefill", "backend", _setter("backend", b"torch")),
    ("paged_prefix_prefill", "backend", _setter("backend", 0)),
    ("paged_decode", "device_spec", _setter("device_spec", "h200")),
    ("paged_decode", "device_spec", _setter("device_spec", 1)),
    ("paged_decode", "workspace", _setter("workspace", "scratch")),
    ("paged_prefix_prefill", "workspace", _setter("workspace", 1)),
    ("paged_decode", "kv_cache_dtype", _setter("kv_cache_dtype", None)),
    ("paged_prefix_prefill", "kv_cache_dtype", _setter("kv_cache_dtype", 8)),
    ("write_to_paged_cache", "kv_cache_dtype", _setter("kv_cache_dtype", ["auto"])),
    ("paged_decode", "max_seq_len", _setter("max_seq_len", 40.0)),
    ("paged_decode", "max_seq_len", _setter("max_seq_len", True)),
    ("paged_prefix_prefill", "max_query_len", _setter("max_query_len", 5.0)),
    ("paged_prefix_prefill", "max_query_len", _setter("max_query_len", False)),
    ("paged_prefix_prefill", "sliding_window", _setter("sliding_window", 4.0)),
    ("paged_decode", "query", _setter("query", None)),
    ("paged_prefix_prefill", "key", _setter("key", None)),
    ("write_to_paged_cache", "slot_mapping", _setter("slot_mapping", None)),
    ("paged_decode", "alibi_slopes", _setter("alibi_slopes", 0.5)),
    ("paged_decode", "key_cache", _zero_kv_heads),
    ("paged_prefix_prefill", "key_cache", _zero_kv_heads),
    ("write_to_paged_cache", "key_cache", _zero_kv_heads),
    ("paged_decode", "query", _zero_heads),
    ("paged_prefix_prefill", "query", _zero_heads),
    ("paged_decode", "key_cache", _zero_blocks),
    ("paged_prefix_prefill", "key_cache", _zero_blocks),
    ("paged_decode", "out", _expanded_out),
    ("paged_prefix_prefill", "out", _expanded_out),
    ("paged_decode", "out", _overlapping_out),
    ("paged_prefix_prefill", "out", _overlapping_out),
]


def _assert_names(exc: BaseException, name: str) -> None:
    message = str(exc)
    assert isinstance(exc, (ValueError, TypeError)), f"{type(exc).__name__}: {message}"
    assert name in message, f"{message!r} does not name {name}"
    assert "got" in message, f"{message!r} does not say what it got"


@pytest.mark.parametrize(
    ("entry", "name", "spoil"),
    CALL_SPOILS,
    ids=[f"{e}-{n}-{i}" for i, (e, n, _) in enumerate(CALL_SPOILS)],
)
def test_entry_point_bad_argument_names_it(entry: str, name: str, spoil) -> None:
    fn, make = ENTRIES[entry]
    args = spoil(make())
    with pytest.raises(Exception) as info:
        fn(**args)
    _assert_names(info.value, name)


def _plan_decode(**kw: Any) -> Any:
    args = dict(shape=SHAPE, lengths=DecodeLengths(2, 40, 5), spec=SPEC, caps=_caps())
    args.update(kw)
    return plan_decode(**args)


def _plan_prefill(**kw: Any) -> Any:
    args = dict(shape=SHAPE, lengths=PrefillLengths(5, 20), spec=SPEC, caps=_caps())
    args.update(kw)
    return plan_prefill(**args)


def _decode_plan_for(**kw: Any) -> Any:
    args = dict(shape=SHAPE, lengths=DecodeLengths(2, 40, 5), device=torch.device("cpu"))
    args.update(kw)
    return decode_plan_for(**args)


def _prefill_plan_for(**kw: Any) -> Any:
    args = dict(shape=SHAPE, lengths=PrefillLengths(5, 20), device=torch.device("cpu"))
    args.update(kw)
    return prefill_plan_for(**args)


# (planner, the argument the error must name, keyword arguments that spoil it)
PLAN_SPOILS = [
    (_plan_decode, "shape", {"shape": None}),
    (_plan_decode, "shape", {"shape": (8, 2, 64, 16)}),
    (_plan_decode, "lengths", {"lengths": (2, 40)}),
    (_plan_decode, "lengths", {"lengths": PrefillLengths(5, 20)}),
    (_plan_decode, "spec", {"spec": "h200"}),
    (_plan_decode, "caps", {"caps": None}),
    (_plan_decode, "overrides", {"overrides": {"tier": "one_pass"}}),
    (_plan_decode, "overrides", {"overrides": PrefillOverrides()}),
    (_plan_prefill, "shape", {"shape": "qwen"}),
    (_plan_prefill, "lengths", {"lengths": 5}),
    (_plan_prefill, "lengths", {"lengths": DecodeLengths(2, 40)}),
    (_plan_prefill, "spec", {"spec": None}),
    (_plan_prefill, "caps", {"caps": "cuda"}),
    (_plan_prefill, "overrides", {"overrides": DecodeOverrides()}),
    (_plan_prefill, "alibi", {"alibi": "yes"}),
    (_plan_prefill, "sliding_window", {"sliding_window": 2.5}),
    (_plan_prefill, "sliding_window", {"sliding_window": True}),
    (_plan_prefill, "large_scale", {"large_scale": 1}),
    (_decode_plan_for, "shape", {"shape": None}),
    (_decode_plan_for, "lengths", {"lengths": None}),
    (_decode_plan_for, "device", {"device": 1.5}),
    (_decode_plan_for, "device", {"device": None}),
    (_decode_plan_for, "device", {"device": "gpu7"}),
    (_decode_plan_for, "device_spec", {"device_spec": "h200"}),
    (_decode_plan_for, "overrides", {"overrides": {"backend": "torch"}}),
    (_decode_plan_for, "backend", {"backend": 2}),
    (_prefill_plan_for, "shape", {"shape": 24}),
    (_prefill_plan_for, "lengths", {"lengths": (5, 20)}),
    (_prefill_plan_for, "device", {"device": None}),
    (_prefill_plan_for, "device", {"device": ["cpu"]}),
    (_prefill_plan_for, "device_spec", {"device_spec": 3}),
    (_prefill_plan_for, "overrides", {"overrides": DecodeOverrides()}),
    (_prefill_plan_for, "backend", {"backend": True}),
    (_prefill_plan_for, "sliding_window", {"sliding_window": "4"}),
    (_prefill_plan_for, "large_scale", {"large_scale": "yes"}),
]


@pytest.mark.parametrize(
    ("planner", "name", "kw"),
    PLAN_SPOILS,
    ids=[f"{p.__name__.strip('_')}-{n}-{i}" for i, (p, n, _) in enumerate(PLAN_SPOILS)],
)
def test_planner_bad_argument_names_it(planner, name: str, kw: dict) -> None:
    with pytest.raises(Exception) as info:
        planner(**kw)
    _assert_names(info.value, name)


LENGTH_SPOILS = [
    (DecodeLengths, "num_seqs", (0, 40)),
    (DecodeLengths, "num_seqs", (2.0, 40)),
    (DecodeLengths, "max_seq_len", (2, True)),
    (DecodeLengths, "max_seq_len", (2, -5)),
    (DecodeLengths, "max_blocks_per_seq", (2, 40, 0)),
    (DecodeLengths, "max_blocks_per_seq", (2, 40, 2.5)),
    (PrefillLengths, "max_query_len", (0, 1)),
    (PrefillLengths, "max_query_len", (None, 1)),
    (PrefillLengths, "max_context_len", (1, -1)),
    (PrefillLengths, "max_context_len", (1, 1.0)),
    (AttentionShape, "num_kv_heads", (8, 0)),
    (AttentionShape, "num_heads", (0, 2)),
    (AttentionShape, "num_heads", (8.0, 2)),
    (AttentionShape, "dtype", (8, 2, 64, 16, "float16")),
    (AttentionShape, "kv_cache_dtype", (8, 2, 64, 16, torch.float16, None)),
    (DecodeOverrides, "gather_bytes", (None, None, None, None, None, None, None, 8.0)),
    (DecodeOverrides, "partition_size", (None, None, True)),
    (PrefillOverrides, "stream", (None, None, 1)),
    (PrefillOverrides, "query_tile", (None, None, None, 16.0)),
]


@pytest.mark.parametrize(("cls", "name", "args"), LENGTH_SPOILS)
def test_plan_inputs_bad_field_names_it(cls, name: str, args: tuple) -> None:
    with pytest.raises(Exception) as info:
        cls(*args)
    _assert_names(info.value, name)
