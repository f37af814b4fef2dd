"""Fused prefill backends as data: one :data:`BACKENDS` registry, name -> how to call it.

A fused backend supplies one primitive, ``attend(q, k, v, scale, causal) -> (out, lse)``:

    q   [t, heads, hs]          the chunk's queries (a tile of them)
    k/v [kv_heads, n, hs]       keys/values, head-major (GQA by broadcast inside the kernel)
    out [heads, t, hs] fp32     softmax-normalised attention over these n keys
    lse [heads, t] fp32         log-sum-exp of the scaled scores, to merge parts

``causal=True`` is only asked for square blocks (n == t, top-left == bottom-right). The driver
in :mod:`attn_core.prefill.fused` splits a chunk's bottom-right causal attention over
``[context ; chunk]`` into non-causal parts (the context, earlier chunk tokens) and one square
causal part, and merges them by log-sum-exp.

Where a backend may run is :mod:`attn_core.device.capabilities`' question; whether it matched the
float64 reference on this device, dtype and head size is :mod:`attn_core.prefill.verify`'s
(once per process). ``ATTN_CORE_PREFILL_BACKEND`` forces a backend; a forced one that is
unavailable or fails the check raises instead of falling back. Triton is never used: on
Iluvatar only the vendor's flash library is a candidate.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

import torch

from attn_core.device.capabilities import VENDOR_MODULE, fused_unavailable_reason

AttendFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, float, bool], tuple[torch.Tensor, torch.Tensor]
]


@dataclass(frozen=True)
class FusedBackend:
    """One fused prefill kernel: where it may run and how to call it."""

    name: str
    description: str
    attend: AttendFn

    def available(self, device: torch.device, dtype: torch.dtype) -> Optional[str]:
        """None where this backend can run, else why not (:mod:`attn_core.device.capabilities`)."""
        return fused_unavailable_reason(self.name, device, dtype)


# --- torch SDPA's flash kernel (NVIDIA) ----------------------------------------------------


def _sdpa_attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    # The private op is the one that returns the log-sum-exp (public SDPA does not); it has had
    # this signature from torch 2.1 through 2.x, and the reference check catches any drift.
    t, heads, hs = q.shape
    kvh = k.shape[0]
    group = heads // kvh
    if causal:
        # Square causal block: expand the block's K/V to every query head (block-sized copy).
        qh = q.transpose(0, 1).unsqueeze(0)  # [1, heads, t, hs]
        kh = k.unsqueeze(1).expand(kvh, group, *k.shape[1:]).reshape(1, heads, -1, hs)
        vh = v.unsqueeze(1).expand(kvh, group, *v.shape[1:]).reshape(1, heads, -1, hs)
    else:
        # Non-causal: fold the group into the query axis, [1, kvh, group * t, hs], so K/V are
        # read once per KV head with no copy and no GQA support needed from the kernel.
        qh = q.view(t, kvh, group, hs).permute(1, 2, 0, 3).reshape(1, kvh, group * t, hs)
        kh, vh = k.unsqueeze(0), v.unsqueeze(0)
    out, lse = _flash_with_lse(qh.contiguous(), kh, vh, causal, scale)
    return out.reshape(heads, t, hs).float(), lse.reshape(heads, t).float()


def _flash_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[1, H, L, D]`` inputs -> (out ``[1, H, Lq, D]``, natural-log lse ``[1, H, Lq]``)."""
    res = torch.ops.aten._scaled_dot_product_flash_attention(
        q, k, v, 0.0, causal, False, scale=scale
    )
    return res[0], res[1]


# --- the vendor's flash-attn library (BI-V100) ---------------------------------------------


def _vendor_attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    flash_attn_func = importlib.import_module(VENDOR_MODULE).flash_attn_func
    # flash-attn layout [batch, tokens, heads, hs]; it broadcasts KV heads over query heads.
    res = flash_attn_func(
        q.unsqueeze(0),
        k.transpose(0, 1).unsqueeze(0),
        v.transpose(0, 1).unsqueeze(0),
        softmax_scale=scale,
        causal=causal,
        return_attn_probs=True,
    )
    out, lse = res[0], res[1]
    return out[0].transpose(0, 1).float(), lse[0].float()


BACKENDS: dict[str, FusedBackend] = {
    b.name: b
    for b in (
        FusedBackend("sdpa", "torch's flash SDPA kernel (NVIDIA)", _sdpa_attend),
        FusedBackend(
            "vendor_flash",
            "the vendor's flash_attn library (Iluvatar CoreX)",
            _vendor_attend,
        ),
    )
}
