"""Decode's choice between the platform's compiled V1 kernel and attn-core's plan.

This replaces vLLM's V1/V2 heuristic (``max_seq_len <= 8192 and (one partition or many
heads)``), which on BI-V100 picks a V2 that raises ``NotImplementedError``. The rule:

1. ``ENGINE_PATCH_FORCE=1`` -> attn-core.
2. No working native V1 (absent, a stub, or it raised ``NotImplementedError``) -> attn-core.
3. ``max_seq_len`` within V1's reach (:func:`engine_patch.native.v1_max_seq_len` on this
   device's profile, or ``ENGINE_PATCH_V1_MAX_SEQ_LEN``) -> native V1, which at short contexts
   is one launch with no reduction.
4. Otherwise -> attn-core's plan (single tile / one pass / partitioned).

``max_seq_len`` is vLLM's bound (the capture size under CUDA graphs), so the choice never reads
device values.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

import torch

from attn_core import (
    AttentionShape,
    DecodeLengths,
    DecodePlan,
    DeviceSpec,
    decode_plan_for,
    detect_device_spec,
)
from engine_patch import native_v2, settings
from engine_patch.native import v1_max_seq_len
from engine_patch.state import STATE

NATIVE_V1 = "native_v1"
NATIVE_V2 = "native_v2"
ATTN_CORE = "attn_core"


@dataclass(frozen=True)
class DecodeRoute:
    """What decode does for one ``max_seq_len``.

    Attributes:
        impl: ``native_v1``, ``native_v2`` or ``attn_core``.
        reason: why, in words.
        v1_limit: the longest ``max_seq_len`` native V1 takes here (0: never).
        plan: attn-core's plan when ``impl == "attn_core"`` and a plan was asked for.
    """

    impl: str
    reason: str
    v1_limit: int
    plan: Optional[DecodePlan] = None


@lru_cache(maxsize=16)
def _spec_for(device_type: str, index: Optional[int]) -> DeviceSpec:
    device = torch.device(device_type) if index is None else torch.device(device_type, index)
    return detect_device_spec(device)


def v1_limit(block_size: int, head_size: int, elem: int, spec: DeviceSpec) -> tuple[int, str]:
    """V1's reach and where the number came from."""
    override = settings.v1_limit_override()
    if override is not None:
        return override, f"{settings.V1_LIMIT_ENV}={override}"
    limit = v1_max_seq_len(spec, block_size, head_size, elem)
    return limit, f"V1 scores fit {spec.name}'s {spec.shared_mem_per_block} B shared memory"


def choose(
    max_seq_len: int, block_size: int, head_size: int, dtype: torch.dtype, device: torch.device
) -> tuple[str, str, int]:
    """``(impl, reason, v1_limit)`` for one decode call; cheap enough for every call."""
    spec = _spec_for(device.type, device.index)
    elem = torch.finfo(dtype).bits // 8  # no tensor allocated on the per-call path
    limit, source = v1_limit(block_size, head_size, elem, spec)
    if settings.force_enabled():
        return ATTN_CORE, f"{settings.FORCE_ENV}=1", limit
    v1 = STATE.natives.get("paged_attention_v1")
    if v1 is None or not v1.works:
        detail = "not probed" if v1 is None else (v1.failure or v1.detail)
        why = f"no working native V1 ({detail})"
    elif max_seq_len <= limit:
        return NATIVE_V1, f"max_seq_len {max_seq_len} <= V1 limit {limit} ({source})", limit
    else:
        why = f"max_seq_len {max_seq_len} > V1 limit {limit} ({source})"
    v2 = STATE.natives.get("paged_attention_v2")
    if v2 is not None and v2.works:
        ok, detail = native_v2.verified(v2, device, dtype, head_size, block_size)
        if ok:
            return NATIVE_V2, f"{why}; {detail}", limit
        why = f"{why}; {detail}"
    return ATTN_CORE, why, limit


def decode_route(
    num_seqs: int,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    max_seq_len: int,
    dtype: torch.dtype,
    device: torch.device,
) -> DecodeRoute:
    """The route with attn-core's plan attached (for ``status`` and the simulator)."""
    impl, reason, limit = choose(max_seq_len, block_size, head_size, dtype, device)
    plan = None
    if impl == ATTN_CORE:
        plan = decode_plan_for(
            AttentionShape(num_heads, num_kv_heads, head_size, block_size, dtype),
            DecodeLengths(num_seqs, max_seq_len),
            device,
            device_spec=_spec_for(device.type, device.index),
        )
    return DecodeRoute(impl, reason, limit, plan)
