"""Meta-tensor inputs for attn-core's entry points, and tracing them on a profile.

Decode inputs (vLLM 0.6.3 layout, every sequence ``context`` tokens long)::

    query        [num_seqs, num_heads, head_size]                           meta
    key_cache    [num_blocks, num_kv_heads, head_size // x, block_size, x]  meta
    value_cache  [num_blocks, num_kv_heads, head_size, block_size]          meta
    block_tables [num_seqs, ceil(context / block_size)] int32               meta
    seq_lens     [num_seqs] int32                            meta, CPU shadow

Prefill adds ``key``/``value`` ``[num_tokens, num_kv_heads, head_size]`` for the new tokens and
``query_start_loc`` ``[num_seqs + 1]`` / ``context_lens`` ``[num_seqs]`` (shadowed, so code that
reads offsets on the host still traces). The traced call executes the plan :func:`plan_for`
makes for the profile (passed as ``plan=``): attn-core's pure planners with the profile's
capabilities (:func:`attn_core.profile_capabilities`, what that device's torch would report)
and the case's overrides. Nothing reads or writes the environment.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional

import torch

from attn_core.core.settings import DecodeOverrides, PrefillOverrides
from attn_core.core.shapes import QWEN36, AttentionShape
from attn_core.device.capabilities import Capabilities, profile_capabilities
from attn_core.device.spec import DeviceSpec
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
    shape: AttentionShape = QWEN36
    dtype: str = "float16"
    query_len: int = 1
    tier: Optional[str] = None  # decode: force this plan tier (what a measurement ran)
    decode: DecodeOverrides = field(default_factory=DecodeOverrides)  # sweeps, gates
    prefill: PrefillOverrides = field(default_factory=PrefillOverrides)

    def decode_overrides(self, tier: Optional[str] = None) -> DecodeOverrides:
        """The decode overrides with ``tier`` (or the case's own) forced."""
        tier = tier or self.tier
        return dataclasses.replace(self.decode, tier=tier) if tier else self.decode

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


# Fused prefill backends the simulator can trace: torch's flash SDPA op has a meta kernel and an
# op rule (op_rules.py), so NVIDIA profiles are priced with the backend their auto plan picks
# (H200 run 2 measured it at 27 launches, as traced). The vendor's flash library exists only on
# Iluvatar and cannot be imported here, and it has not been verified on the lab BI-V100 yet:
# bi-v100 profiles keep pricing the torch backend.
TRACEABLE_FUSED = ("sdpa",)


def base_name(spec: DeviceSpec) -> str:
    """The built-in profile a (possibly calibrated, ``name+calibrated``) profile derives from."""
    return spec.name.split("+")[0]


def sim_capabilities(spec: DeviceSpec, dtype: torch.dtype) -> Capabilities:
    """What ``spec``'s device would report for ``dtype`` (no probing), as the simulator plans."""
    caps = profile_capabilities(spec, dtype)
    fused = tuple(name for name in caps.fused_prefill if name in TRACEABLE_FUSED)
    return dataclasses.replace(caps, fused_prefill=fused)


def trace_case(
    spec: DeviceSpec, case: Case, decode_entry: Optional[Callable] = None
) -> tuple[Trace, int]:
    """Trace one call of attn-core for ``case`` after a warm-up call.

    ``decode_entry`` stands in for ``attn_core.paged_decode`` (tests trace deliberately worse
    code through it; nothing in attn-core is patched).

    Returns ``(trace, workspace_bytes)``: the steady-state call's trace and the bytes of reusable
    scratch the warm-up left behind (a fresh workspace per case when the entry point takes one,
    so an earlier, larger case cannot hide this one's needs).
    """
    import attn_core

    if case.path == "decode":
        fn, build = decode_entry or attn_core.paged_decode, decode_inputs
    elif case.path == "prefill":
        fn, build = attn_core.paged_prefix_prefill, prefill_inputs
    else:
        raise ValueError(f"case.path must be 'decode' or 'prefill', got {case.path!r}")
    workspace = _fresh_workspace(fn)
    args, kwargs, shadows = build(case)
    kwargs["plan"] = plan_for(spec, case)
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
    from attn_core.core.workspace import Workspace

    return Workspace()


def plan_for(spec: DeviceSpec, case: Case, tier: Optional[str] = None):
    """attn-core's plan object for ``case`` on ``spec`` (decode: ``tier`` forces a tier)."""
    import attn_core

    dtype = DTYPES[case.dtype]
    caps = sim_capabilities(spec, dtype)
    s = case.shape
    shape = attn_core.AttentionShape(s.num_heads, s.num_kv_heads, s.head_size, s.block_size, dtype)
    if case.path == "decode":
        blocks = -(-case.context // s.block_size)
        lengths = attn_core.DecodeLengths(case.num_seqs, case.context, blocks)
        return attn_core.plan_decode(shape, lengths, spec, caps, case.decode_overrides(tier))
    lengths = attn_core.PrefillLengths(case.query_len, case.context - case.query_len)
    return attn_core.plan_prefill(shape, lengths, spec, caps, case.prefill)
