"""Numeric self-test: what vLLM would run here, against attn-core's float64 reference.

Runs on the device ``status`` is asked about, through vLLM's own (patched) entry points when
the patch is active - ``PagedAttention.write_to_paged_cache``, ``forward_decode``,
``forward_prefix`` - and through attn-core directly otherwise. Decode covers a one-token
sequence, odd lengths, and one sequence past native V1's reach (so both routes run where the
platform has V1); prefix covers an empty context and odd chunk / context lengths over permuted
block tables with GQA.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Optional

import torch

import attn_core
from attn_core.core.shapes import AttentionShape
from attn_core.reference import (
    PagedCase,
    make_paged_case,
    reference_decode,
    reference_prefix_prefill,
    tokens_from_cache,
)
from engine_patch import routing
from engine_patch.hooks import DECODE_PARAMS, PREFIX_PARAMS
from engine_patch.ops import head_mapping
from engine_patch.registration import is_active
from engine_patch.tolerances import DECODE_TOL, PREFIX_TOL, excess

# The self-test's caches hold the model dtype as is: no fp8, unit scales.
_UNSCALED_CACHE = {"kv_cache_dtype": "auto", "k_scale": 1.0, "v_scale": 1.0}


@dataclass
class Check:
    """One self-test case's outcome: ``max_error`` is the largest |got - reference|,
    ``tolerance`` the absolute part of the bound (``atol + rtol * |reference|``)."""

    name: str
    path: str
    device: str
    dtype: str
    max_error: float
    tolerance: float
    passed: bool
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _paged_attention() -> Optional[Any]:
    if not is_active():
        return None
    return sys.modules["vllm.attention.ops.paged_attn"].PagedAttention


def _call_by_name(fn: Callable, params: dict, values: dict[str, Any]) -> Any:
    """Call ``fn`` (vLLM's or the fork's convention) with canonical values by parameter name."""
    names = inspect.signature(fn).parameters
    kwargs = {}
    for canonical, value in values.items():
        for name in params[canonical]:
            if name in names:
                kwargs[name] = value(name) if callable(value) else value
                break
    return fn(**kwargs)


def _compare(
    name: str, path: str, got: torch.Tensor, want: torch.Tensor, tol: tuple[float, float]
) -> Check:
    """Elementwise ``|got - want| <= atol + rtol * |want|``, as ``torch.testing``."""
    atol, rtol = tol
    finite = bool(torch.isfinite(got).all())
    err, over = excess(got, want, rtol)
    ok = finite and over <= atol
    detail = "" if finite else "non-finite values in the output"
    return Check(name, path, str(got.device), str(got.dtype), err, atol, ok, detail)


def _guard(name: str, path: str, device: torch.device, dtype: torch.dtype, run: Callable) -> Check:
    try:
        return run()
    except Exception as exc:  # a crash is a failed self-test, reported, not a traceback
        detail = f"{type(exc).__name__}: {exc}"
        return Check(name, path, str(device), str(dtype), float("nan"), 0.0, False, detail)


def _paged_case(
    shape: AttentionShape, device: torch.device, seq_lens: list[int], seed: int
) -> PagedCase:
    """Random caches of ``shape`` on ``device`` holding ``seq_lens`` tokens per sequence."""
    return make_paged_case(
        seq_lens,
        shape.num_heads,
        shape.num_kv_heads,
        shape.head_size,
        shape.block_size,
        shape.dtype,
        device,
        seed=seed,
    )


def _decode(shape: AttentionShape, device: torch.device, seq_lens: list[int]) -> Check:
    dtype = shape.dtype
    case = _paged_case(shape, device, seq_lens, seed=1)
    scale = shape.head_size**-0.5
    max_len = max(seq_lens)
    paged = _paged_attention()
    if paged is not None:
        path = "vllm PagedAttention.forward_decode"
        num_kv = shape.num_kv_heads
        mapping = head_mapping(shape.num_heads, num_kv, device)
        values = {
            "query": case.query,
            "key_cache": case.key_cache,
            "value_cache": case.value_cache,
            "block_tables": case.block_tables,
            "seq_lens": case.seq_lens,
            "max_seq_len": max_len,
            "kv_heads": lambda name: mapping if name == "head_mapping" else num_kv,
            "scale": scale,
            "alibi_slopes": None,
            **_UNSCALED_CACHE,
        }
        got = _call_by_name(paged.forward_decode, DECODE_PARAMS, values)
    else:
        path = "attn_core.paged_decode"
        got = torch.full_like(case.query, float("nan"))
        attn_core.paged_decode(
            case.query,
            case.key_cache,
            case.value_cache,
            case.block_tables,
            case.seq_lens,
            max_len,
            scale,
            out=got,
        )
    impl, _, _ = routing.choose(max_len, shape.block_size, shape.head_size, dtype, device)
    want = reference_decode(
        case.query, case.key_cache, case.value_cache, case.block_tables, case.seq_lens, scale
    )
    name = f"decode seq_lens={seq_lens} ({impl})"
    return _compare(name, path, got, want, DECODE_TOL[dtype])


def _prefix(shape: AttentionShape, device: torch.device) -> list[Check]:
    """Write a chunk's K/V into the cache, then prefix attention over context + chunk."""
    dtype = shape.dtype
    # Context 0 is plain causal prefill; 45 and 300 span partial and many blocks.
    context_lens, query_lens = [0, 45, 300], [5, 17, 33]
    total = [c + q for c, q in zip(context_lens, query_lens, strict=True)]
    case = _paged_case(shape, device, total, seed=2)
    g = torch.Generator().manual_seed(3)
    tokens = sum(query_lens)
    query = torch.randn(tokens, shape.num_heads, shape.head_size, generator=g).to(device, dtype)
    key = torch.randn(tokens, shape.num_kv_heads, shape.head_size, generator=g).to(device, dtype)
    value = torch.randn(tokens, shape.num_kv_heads, shape.head_size, generator=g).to(device, dtype)
    slots = []
    for s, (c, q) in enumerate(zip(context_lens, query_lens, strict=True)):
        pos = torch.arange(c, c + q)
        blocks = case.block_tables[s].cpu().long()[pos // shape.block_size]
        slots.append(blocks * shape.block_size + pos % shape.block_size)
    slot_mapping = torch.cat(slots).to(device)
    starts = torch.tensor([0] + query_lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    query_start_loc = starts.to(device)
    seq_lens = torch.tensor(total, dtype=torch.int32, device=device)
    ctx = torch.tensor(context_lens, dtype=torch.int32, device=device)
    paged = _paged_attention()
    kc, vc, bt = case.key_cache, case.value_cache, case.block_tables
    chunk = {"key": key, "value": value, "key_cache": kc, "value_cache": vc}  # by vLLM's names

    def write() -> Check:
        if paged is not None:
            path = "vllm PagedAttention.write_to_paged_cache"
            values = {**chunk, "slot_mapping": slot_mapping, **_UNSCALED_CACHE}
            _call_by_name(paged.write_to_paged_cache, {k: (k,) for k in values}, values)
        else:
            path = "attn_core.write_to_paged_cache"
            attn_core.write_to_paged_cache(key, value, kc, vc, slot_mapping)
        errs = []
        for s, (c, q) in enumerate(zip(context_lens, query_lens, strict=True)):
            k, v = tokens_from_cache(kc, vc, bt[s], c + q)
            q0 = int(starts[s])
            errs.append((k[c:] - key[q0 : q0 + q].cpu().double()).abs().max())
            errs.append((v[c:] - value[q0 : q0 + q].cpu().double()).abs().max())
        err = float(max(errs))
        return Check(
            "cache write (chunk into permuted blocks)",
            path,
            str(device),
            str(dtype),
            err,
            0.0,
            err == 0.0,
        )

    def prefix() -> Check:
        if paged is not None:
            path = "vllm PagedAttention.forward_prefix"
            values = {
                "query": query,
                **chunk,
                "block_tables": bt,
                "query_start_loc": query_start_loc,
                "seq_lens": seq_lens,
                "context_lens": ctx,
                "max_query_len": max(query_lens),
                "alibi_slopes": None,
                "sliding_window": None,
                **_UNSCALED_CACHE,
            }
            got = _call_by_name(paged.forward_prefix, PREFIX_PARAMS, values)
        else:
            path = "attn_core.paged_prefix_prefill"
            got = torch.full_like(query, float("nan"))
            attn_core.paged_prefix_prefill(
                query,
                key,
                value,
                kc,
                vc,
                bt,
                query_start_loc,
                seq_lens,
                ctx,
                max(query_lens),
                out=got,
            )
        want = reference_prefix_prefill(query, key, value, kc, vc, bt, query_start_loc, ctx)
        name = f"prefix context_lens={context_lens} query_lens={query_lens}"
        return _compare(name, path, got, want, PREFIX_TOL[dtype])

    return [
        _guard("cache write", "write_to_paged_cache", device, dtype, write),
        _guard("prefix", "forward_prefix", device, dtype, prefix),
    ]


def run_self_test(shape: AttentionShape, device: torch.device) -> list[Check]:
    """All checks; each failure is reported with its error, none raises."""
    dtype = shape.dtype
    _, _, limit = routing.choose(1, shape.block_size, shape.head_size, dtype, device)
    decode_cases = [[1], [1, 37, 300]]
    if limit > 0:
        decode_cases.append([limit + shape.block_size + 5, 3])  # past V1's reach: attn-core
    checks = [
        _guard(
            f"decode seq_lens={lens}",
            "forward_decode",
            device,
            dtype,
            lambda lens=lens: _decode(shape, device, lens),
        )
        for lens in decode_cases
    ]
    return checks + _prefix(shape, device)
