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
import inspect
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Optional

import torch

from attn_core.device_spec import DeviceSpec
from attn_sim.designs import Shape
from attn_sim.tracer import Trace, trace

TIER_ENV = "ATTN_CORE_DECODE_TIER"  # attn-core's override of the plan's tier
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
    tier: Optional[str] = None  # decode: force this plan tier (what a measurement ran)

    def label(self) -> str:
        """Baseline key: path, batch, context (and the chunk for prefill)."""
        chunk = f" q{self.query_len}" if self.path == "prefill" else ""
        return f"{self.path} b{self.num_seqs} ctx{self.context}{chunk}"


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


# The torch each profile runs under decides some of attn-core's choices: the vendor ships torch
# 2.1 for the BI-V100, whose bmm has no ``out_dtype`` (keys are upcast for fp32 scores); the
# NVIDIA profiles run current torch, whose CUDA bmm writes fp32 scores from fp16/bf16 inputs.
BMM_OUT_DTYPE = {"bi-v100": False, "bi-v100-smem48k": False, "h200": True, "a100": True}


@contextlib.contextmanager
def profile_env(spec: DeviceSpec) -> Iterator[None]:
    """Make attn-core plan (and pick torch features) for ``spec`` while tracing.

    Sets ``ATTN_CORE_DEVICE`` to the profile's base name and answers attn-core's "does bmm write
    fp32 scores" probe as that profile's torch would (the probe itself only sees ``meta``).
    """
    name = base_name(spec)
    old = os.environ.get("ATTN_CORE_DEVICE")
    os.environ["ATTN_CORE_DEVICE"] = name
    patched = _patch_bmm_probe(BMM_OUT_DTYPE.get(name, False))
    try:
        yield
    finally:
        patched()
        if old is None:
            os.environ.pop("ATTN_CORE_DEVICE", None)
        else:
            os.environ["ATTN_CORE_DEVICE"] = old


@contextlib.contextmanager
def env_var(name: str, value: Optional[object]) -> Iterator[None]:
    """Set (or with ``None`` unset) one environment variable for the duration."""
    old = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = str(value)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def base_name(spec: DeviceSpec) -> str:
    """The built-in profile a (possibly calibrated, ``name+calibrated``) profile derives from."""
    return spec.name.split("+")[0]


def _patch_bmm_probe(answer: bool):
    try:
        from attn_core import decode
    except ImportError:
        return lambda: None
    original = getattr(decode, "bmm_writes_fp32", None)
    if original is None:
        return lambda: None

    def probe(device_type: str, dtype: torch.dtype) -> bool:
        return (
            dtype == torch.float32
            or (device_type == "meta" and answer)
            or (device_type != "meta" and original(device_type, dtype))
        )

    decode.bmm_writes_fp32 = probe

    def restore() -> None:
        decode.bmm_writes_fp32 = original

    return restore


def trace_case(spec: DeviceSpec, case: Case) -> tuple[Trace, int]:
    """Trace one call of attn-core for ``case`` after a warm-up call.

    Returns ``(trace, workspace_bytes)``: the steady-state call's trace and the bytes of reusable
    scratch the warm-up left behind (a fresh workspace per case when the entry point takes one,
    so an earlier, larger case cannot hide this one's needs).
    """
    import attn_core

    if case.path == "decode":
        fn, build = attn_core.paged_decode, decode_inputs
    elif case.path == "prefill":
        fn, build = attn_core.paged_prefix_prefill, prefill_inputs
    else:
        raise ValueError(f"case.path must be 'decode' or 'prefill', got {case.path!r}")
    workspace = _fresh_workspace(fn)
    forced = env_var(TIER_ENV, case.tier) if case.tier else contextlib.nullcontext()
    with profile_env(spec), forced:
        args, kwargs, shadows = build(case)
        if workspace is not None:
            kwargs["workspace"] = workspace
        warm, _ = trace(fn, *args, shadows=shadows, **kwargs)
        args, _, shadows = build(case)
        record, _ = trace(fn, *args, shadows=shadows, **kwargs)
    held = workspace.nbytes if workspace is not None else warm.retained_bytes
    return record, held


def _fresh_workspace(fn):
    if "workspace" not in inspect.signature(fn).parameters:
        return None
    from attn_core.workspace import Workspace

    return Workspace()


def plan_for(spec: DeviceSpec, case: Case, tier: Optional[str] = None):
    """attn-core's plan object for ``case`` on ``spec`` (decode: ``tier`` forces a tier)."""
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
                tier=tier,
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
