"""Plans from flat keyword arguments, for tests: builds the explicit inputs the planners take.

``decode_plan`` / ``prefill_plan`` accept sizes, a profile name or spec, capability flags and
override fields as keywords and call the pure :func:`attn_core.plan_decode` /
:func:`attn_core.plan_prefill`; no environment is read.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from attn_core import (
    AttentionShape,
    Capabilities,
    DecodeLengths,
    DecodeOverrides,
    DecodePlan,
    DeviceSpec,
    PrefillLengths,
    PrefillOverrides,
    PrefillPlan,
    get_device_spec,
    plan_decode,
    plan_prefill,
)

Spec = Union[str, DeviceSpec, None]


def _spec(spec: Spec) -> DeviceSpec:
    if spec is None:
        return get_device_spec("bi-v100")
    return get_device_spec(spec) if isinstance(spec, str) else spec


def decode_plan(
    num_seqs: int,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    max_seq_len: int,
    max_blocks_per_seq: Optional[int] = None,
    dtype: torch.dtype = torch.float16,
    *,
    kv_cache_dtype: str = "auto",
    device_spec: Spec = None,
    scores_fp32_from_bmm: bool = False,
    bmm_in_compute_dtype: bool = True,
    **overrides,
) -> DecodePlan:
    """``overrides``: :class:`DecodeOverrides` fields (tier, partition_size, ...)."""
    return plan_decode(
        AttentionShape(num_heads, num_kv_heads, head_size, block_size, dtype, kv_cache_dtype),
        DecodeLengths(num_seqs, max_seq_len, max_blocks_per_seq),
        _spec(device_spec),
        Capabilities(
            bmm_writes_fp32=scores_fp32_from_bmm or dtype == torch.float32,
            half_matmul=bmm_in_compute_dtype,
        ),
        DecodeOverrides(**overrides),
    )


def prefill_plan(
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    dtype: torch.dtype,
    max_query_len: int,
    *,
    max_context_len: int = 0,
    device: Union[str, torch.device] = "cpu",
    device_spec: Spec = None,
    fused: tuple[str, ...] = (),
    bmm_writes_fp32: bool = False,
    alibi: bool = False,
    sliding_window: Optional[int] = None,
    score_dtype: Optional[torch.dtype] = None,
    large_scale: bool = False,
    **overrides,
) -> PrefillPlan:
    """``overrides``: :class:`PrefillOverrides` fields (backend, budget_bytes, stream, tiles)."""
    if score_dtype is not None:
        overrides["score_dtype"] = str(score_dtype).replace("torch.", "")
    return plan_prefill(
        AttentionShape(num_heads, num_kv_heads, head_size, 16, dtype),
        PrefillLengths(max_query_len, max_context_len),
        _spec(device_spec),
        Capabilities(
            device_type=torch.device(device).type,
            bmm_writes_fp32=bmm_writes_fp32 or dtype == torch.float32,
            fused_prefill=fused,
        ),
        PrefillOverrides(**overrides),
        alibi=alibi,
        sliding_window=sliding_window or 0,
        large_scale=large_scale,
    )
