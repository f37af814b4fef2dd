"""Meta-tensor inputs for attn-core's entry points, and tracing them on a profile.

Decode inputs (vLLM 0.6.3 layout, every sequence ``context`` tokens long)::

    query        [num_seqs, num_heads, head_size]                           meta
    key_cache    [num_blocks, num_kv_heads, head_size // x, block_size, x]  meta
    value_cache  [num_blocks, num_kv_heads, head_size, block_size]          meta
    block_tables [num_seqs, ceil(context / block_size)] int32               meta
    seq_lens     [num_seqs] int32                            meta, CPU shadow

Prefill adds ``key``/``value`` ``[num_tokens, num_kv_heads, head_size]`` for the new tokens and
``query_start_loc`` ``[num_seqs + 1]`` / ``context_lens`` ``[num_seqs]`` (shadowed, so code that
reads offsets on the host still traces). The traced code plans for the profile through
``ATTN_CORE_DEVICE`` (set for the duration of the call).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from attn_core.device_spec import DeviceSpec
from attn_sim.designs import Shape
from attn_sim.tracer import Trace, trace

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclass(frozen=True)
class Case:
    """One step to simulate: ``num_seqs`` sequences of ``context`` cached tokens each.

    ``query_len`` is 1 for decode; for prefill it is the new tokens per sequence (the cached
    prefix is ``context - query_len``).
    """

    path: str  # "decode" | "prefill"
    num_seqs: int
    context: int
    shape: Shape = Shape()
    dtype: str = "float16"
    query_len: int = 1

    def label(self) -> str:
        return f"{self.path} b{self.num_seqs} ctx{self.context}"


def _meta(*size: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(size, dtype=dtype, device="meta")


def _caches(case: Case) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    s, dt = case.shape, DTYPES[case.dtype]
    x = 16 // torch.empty((), dtype=dt).element_size()
    blocks_per_seq = -(-case.context // s.block_size)
    num_blocks = case.num_seqs * blocks_per_seq + 1
    key_cache = _meta(num_blocks, s.num_kv_heads, s.head_size // x, s.block_size, x, dtype=dt)
    value_cache = _meta(num_blocks, s.num_kv_heads, s.head_size, s.block_size, dtype=dt)
    tables = _meta(case.num_seqs, blocks_per_seq, dtype=torch.int32)
    return key_cache, value_cache, tables, blocks_per_seq


def decode_inputs(case: Case) -> tuple[tuple, dict, dict[torch.Tensor, torch.Tensor]]:
    """``(args, kwargs, shadows)`` for ``attn_core.paged_decode``."""
    s, dt = case.shape, DTYPES[case.dtype]
    key_cache, value_cache, tables, _ = _caches(case)
    query = _meta(case.num_seqs, s.num_heads, s.head_size, dtype=dt)
    seq_lens = _meta(case.num_seqs, dtype=torch.int32)
    shadows = {seq_lens: torch.full((case.num_seqs,), case.context, dtype=torch.int32)}
    args = (query, key_cache, value_cache, tables, seq_lens, case.context)
    return args, {}, shadows


def prefill_inputs(case: Case) -> tuple[tuple, dict, dict[torch.Tensor, torch.Tensor]]:
    """``(args, kwargs, shadows)`` for ``attn_core.paged_prefix_prefill``."""
    s, dt = case.shape, DTYPES[case.dtype]
    key_cache, value_cache, tables, _ = _caches(case)
    n, q = case.num_seqs, case.query_len
    query = _meta(n * q, s.num_heads, s.head_size, dtype=dt)
    key = _meta(n * q, s.num_kv_heads, s.head_size, dtype=dt)
    value = _meta(n * q, s.num_kv_heads, s.head_size, dtype=dt)
    starts = _meta(n + 1, dtype=torch.int32)
    seq_lens = _meta(n, dtype=torch.int32)
    ctx_lens = _meta(n, dtype=torch.int32)
    shadows = {
        starts: torch.arange(0, (n + 1) * q, q, dtype=torch.int32),
        seq_lens: torch.full((n,), case.context, dtype=torch.int32),
        ctx_lens: torch.full((n,), case.context - q, dtype=torch.int32),
    }
    args = (query, key, value, key_cache, value_cache, tables, starts, seq_lens, ctx_lens, q)
    return args, {}, shadows


@contextlib.contextmanager
def profile_env(spec: DeviceSpec) -> Iterator[None]:
    """Make attn-core plan for ``spec`` (by its base profile name) while tracing."""
    name = spec.name.split("+")[0]
    old = os.environ.get("ATTN_CORE_DEVICE")
    os.environ["ATTN_CORE_DEVICE"] = name
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("ATTN_CORE_DEVICE", None)
        else:
            os.environ["ATTN_CORE_DEVICE"] = old


def trace_case(spec: DeviceSpec, case: Case) -> Trace:
    """Trace one call of attn-core for ``case`` after a warm-up call (workspaces exist)."""
    import attn_core

    if case.path == "decode":
        fn, build = attn_core.paged_decode, decode_inputs
    elif case.path == "prefill":
        fn, build = attn_core.paged_prefix_prefill, prefill_inputs
    else:
        raise ValueError(f"case.path must be 'decode' or 'prefill', got {case.path!r}")
    with profile_env(spec):
        args, kwargs, shadows = build(case)
        trace(fn, *args, shadows=shadows, **kwargs)  # warm-up: reusable workspaces get made
        args, kwargs, shadows = build(case)
        record, _ = trace(fn, *args, shadows=shadows, **kwargs)
    return record


def plan_for(spec: DeviceSpec, case: Case):
    """attn-core's plan object for ``case`` on ``spec``."""
    import attn_core

    s = case.shape
    blocks = -(-case.context // s.block_size)
    with profile_env(spec):
        if case.path == "decode":
            return attn_core.plan_decode(
                case.num_seqs,
                s.num_heads,
                s.num_kv_heads,
                s.head_size,
                s.block_size,
                case.context,
                blocks,
                DTYPES[case.dtype],
                device_spec=spec,
            )
        return _plan_prefill(spec, case)


def _plan_prefill(spec: DeviceSpec, case: Case):
    import attn_core

    s = case.shape
    return attn_core.plan_prefill(
        s.num_heads,
        s.num_kv_heads,
        s.head_size,
        DTYPES[case.dtype],
        case.query_len,
        max_context_len=case.context - case.query_len,
        device=torch.device("meta"),
        device_spec=spec,
    )
