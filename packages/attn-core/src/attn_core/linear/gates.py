"""The gated delta rule's per-token gates from the layer's projections, the step before it.

Qwen3-Next-style layers (the hybrid model's) derive both gates of every token and value head
from two projections ``a`` and ``b`` and two learned vectors:

    g    = -exp(A_log) * softplus(a + dt_bias)    (log decay, <= 0; fp32)
    beta = sigmoid(b)

vLLM computes them in one Triton kernel (``fused_gdn_gating``), which must not run on Iluvatar:
this is the same arithmetic in torch (fp32, a few elementwise launches), on any device.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from attn_core.core.checks import check_tensor
from attn_core.linear.inputs import FLOATS


def gated_delta_gates(
    A_log: torch.Tensor,  # noqa: N803 - the model's parameter name
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    b: Optional[torch.Tensor] = None,
    softplus_beta: float = 1.0,
    softplus_threshold: float = 20.0,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``(g, beta)`` for every token and value head.

    Args:
        A_log, dt_bias: ``[HV]``, the layer's learned decay rate (log) and bias.
        a: ``[..., HV]``, the decay projection of each token; b: like ``a`` or None.
        softplus_beta / softplus_threshold: softplus's ``beta`` and ``threshold`` (where
            ``softplus_beta * x`` exceeds it, softplus is ``x``): vLLM's ``beta`` / ``threshold``.

    Returns:
        ``g``: ``a``'s shape, fp32, ``<= 0``; ``beta``: ``sigmoid(b)`` in b's dtype, or None
        without ``b``.
    """
    check_tensor("a", a, dtype=FLOATS)
    if a.dim() == 0:
        raise ValueError("a must have shape [..., HV], got a scalar")
    hv = a.shape[-1]
    check_tensor("A_log", A_log, shape=(hv,), dtype=FLOATS, device=a.device)
    check_tensor("dt_bias", dt_bias, shape=(hv,), dtype=FLOATS, device=a.device)
    if b is not None:
        check_tensor("b", b, shape=tuple(a.shape), dtype=FLOATS, device=a.device)
    for name, value in (
        ("softplus_beta", softplus_beta),
        ("softplus_threshold", softplus_threshold),
    ):
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
    if softplus_beta <= 0:
        raise ValueError(f"softplus_beta must be > 0, got {softplus_beta!r}")
    rate = F.softplus(a.float() + dt_bias.float(), softplus_beta, softplus_threshold)
    g = rate.mul_(A_log.float().exp().neg_())
    beta = None if b is None else torch.sigmoid(b.float()).to(b.dtype)
    return g, beta
