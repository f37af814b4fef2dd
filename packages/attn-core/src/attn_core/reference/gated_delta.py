"""Independent float64 reference for the hybrid model's linear-attention layers.

The gated delta rule, one token at a time, exactly as written (per token t and value head h,
key head ``h // (HV // H)``):

    S <- S * exp(g_t)
    S <- S + k_t (x) beta_t * (v_t - S^T k_t)
    o_t = S^T (q_t * scale)

and the depthwise causal convolution of its short-conv step, one tap at a time. Both run in
float64 on the CPU and share no code with :mod:`attn_core.linear` (the l2 normalisation's
``eps = 1e-6`` inside the root is the ecosystem's convention, a fact, not an algorithm).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

L2NORM_EPS = 1e-6


def l2_normalise(x: torch.Tensor) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + 1e-6)`` over the last axis."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def reference_gated_delta(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[torch.Tensor] = None,
    cu_seqlens: Optional[torch.Tensor] = None,
    use_qk_l2norm: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule token by token in float64.

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, HV, V]`` with ``HV % H == 0``.
        g (log decay), beta: ``[B, T, HV]``.
        initial_state: ``[N, HV, K, V]`` or None (zeros); N is B, or ``len(cu_seqlens) - 1``.
        cu_seqlens: ``[N + 1]`` token offsets of the sequences of a ``B == 1`` batch, or None.

    Returns:
        ``(o, final_state)``: ``[B, T, HV, V]`` and ``[N, HV, K, V]``, float64 on the CPU.
    """
    b, t, h, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    group = hv // h
    scale = dk**-0.5 if scale is None else float(scale)
    qd, kd, vd, gd, bd = (x.detach().double().cpu() for x in (q, k, v, g, beta))
    if use_qk_l2norm:
        qd, kd = l2_normalise(qd), l2_normalise(kd)
    if cu_seqlens is None:
        spans = [(i, 0, t) for i in range(b)]
    else:
        bounds = [int(x) for x in cu_seqlens.cpu()]
        spans = [(0, bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]
    out = torch.zeros(b, t, hv, dv, dtype=torch.float64)
    final = torch.zeros(len(spans), hv, dk, dv, dtype=torch.float64)
    for n, (row, start, end) in enumerate(spans):
        state = torch.zeros(hv, dk, dv, dtype=torch.float64)
        if initial_state is not None:
            state = initial_state[n].detach().double().cpu().clone()
        for pos in range(start, end):
            kt = kd[row, pos].repeat_interleave(group, 0)  # [HV, K]
            qt = qd[row, pos].repeat_interleave(group, 0) * scale
            state = state * gd[row, pos].exp()[:, None, None]
            recalled = torch.einsum("hk,hkv->hv", kt, state)
            delta = bd[row, pos][:, None] * (vd[row, pos] - recalled)
            state = state + kt[:, :, None] * delta[:, None, :]
            out[row, pos] = torch.einsum("hk,hkv->hv", qt, state)
        final[n] = state
    return out, final


def reference_causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    window: Optional[torch.Tensor] = None,
    activation: Optional[str] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's depthwise causal convolution in float64, tap by tap.

    Args:
        x: ``[dim, L]``; weight: ``[dim, W]`` (``weight[:, W - 1]`` multiplies the current
            token); bias: ``[dim]`` or None.
        window: ``[dim, W - 1]`` inputs before the sequence, oldest first, or None (zeros).
        activation: None, ``"silu"`` or ``"swish"``.

    Returns:
        ``(out, new_window)``: ``[dim, L]`` and the last ``W - 1`` inputs ``[dim, W - 1]``,
        float64 on the CPU.
    """
    dim, length = x.shape
    width = weight.shape[1]
    xd = x.detach().double().cpu()
    wd = weight.detach().double().cpu()
    prior = torch.zeros(dim, width - 1, dtype=torch.float64)
    if window is not None:
        prior = window.detach().double().cpu()
    full = torch.cat([prior, xd], dim=1)
    out = torch.zeros(dim, length, dtype=torch.float64)
    for pos in range(length):
        for tap in range(width):
            out[:, pos] += wd[:, tap] * full[:, pos + tap]
    if bias is not None:
        out += bias.detach().double().cpu()[:, None]
    if activation in ("silu", "swish"):
        out = out * torch.sigmoid(out)
    return out, full[:, full.shape[1] - (width - 1) :].clone()


def reference_gates(
    A_log: torch.Tensor,  # noqa: N803 - the model's parameter name
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    b: Optional[torch.Tensor] = None,
    softplus_beta: float = 1.0,
    softplus_threshold: float = 20.0,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The gates ``g = -exp(A_log) * softplus(a + dt_bias)`` and ``beta = 1 / (1 + exp(-b))``
    element by element in float64, softplus as ``log(1 + exp(s x)) / s`` except ``x`` where
    ``s x`` exceeds the threshold. Returns float64 tensors on the CPU (``beta`` None without
    ``b``)."""
    x = (a.detach().double().cpu() + dt_bias.detach().double().cpu()).reshape(-1, a.shape[-1])
    rate = torch.empty_like(x)
    for i in range(x.shape[0]):
        for h in range(x.shape[1]):
            v = float(x[i, h])
            sv = softplus_beta * v
            rate[i, h] = v if sv > softplus_threshold else math.log1p(math.exp(sv)) / softplus_beta
    g = (-A_log.detach().double().cpu().exp() * rate).reshape(a.shape)
    beta = None if b is None else 1.0 / (1.0 + (-b.detach().double().cpu()).exp())
    return g, beta
