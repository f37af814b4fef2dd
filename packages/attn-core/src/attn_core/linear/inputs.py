"""Validation of the linear-attention entry points' arguments, into one object per call.

Shape, dtype and device checks run on every call (host metadata only). Value checks read
tensor values, which syncs the host with the device:

- prefill (:func:`chunk_gated_delta_rule`, :func:`fused_recurrent_gated_delta_rule`,
  :func:`causal_conv1d_fn`) checks values on every call: the chunked path reads ``cu_seqlens``
  on the host anyway, and one reduction over ``g`` (T x HV elements) is noise beside the
  T x HV x K x V work;
- the serving steps (:func:`gated_delta_decode`, :func:`causal_conv1d_update`) check values only
  with ``ATTN_CORE_CHECKS=1`` and never while a CUDA graph is being captured: they run every
  decode step, inside graphs, and must not sync. Without checks an index out of range is the
  torch error (a device-side assert on CUDA) and a repeated index leaves one of the writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from attn_core.core.checks import ArgumentTypeError, check_tensor, resolve_scale, type_name

FLOATS = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)


@dataclass(frozen=True)
class GatedDeltaInputs:
    """One prefill call's inputs, flattened over the batch.

    Attributes:
        q, k: ``[B * T, H, K]``; v: ``[B * T, HV, V]``; g, beta: ``[B * T, HV]``.
        lengths: each sequence's tokens (host ints; B sequences of T, or from ``cu_seqlens``).
        starts: each sequence's first token in the flattened rows.
        scale: resolved (never None); initial_state: ``[N, HV, K, V]`` fp32 or None.
        batch, tokens: B and T of the caller's ``[B, T, ...]`` tensors.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    lengths: tuple[int, ...]
    starts: tuple[int, ...]
    scale: float
    initial_state: Optional[torch.Tensor]
    l2norm: bool
    batch: int
    tokens: int

    @property
    def num_heads(self) -> int:
        return self.q.shape[1]

    @property
    def num_value_heads(self) -> int:
        return self.v.shape[1]


def check_flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be a bool, got {type_name(value)} {value!r}")
    return value


def check_heads_divide(num_heads: int, num_value_heads: int) -> None:
    if num_heads < 1 or num_value_heads % num_heads:
        raise ValueError(
            f"v's value heads (dimension 2 of v) must be a multiple of q's key heads, got "
            f"HV = {num_value_heads} and H = {num_heads}"
        )


def check_gates(g: torch.Tensor, beta: Optional[torch.Tensor]) -> None:
    """``g`` finite and <= 0 (a log decay), ``beta`` finite: one host sync."""
    flags = [(~torch.isfinite(g)).any(), (g > 0).any()]
    if beta is not None:
        flags.append((~torch.isfinite(beta)).any())
    bad = torch.stack(flags).tolist()
    if bad[0]:
        raise ValueError("g must be finite (a log decay <= 0), got NaN or inf")
    if bad[1]:
        raise ValueError(f"g must be <= 0 (a log decay), got a maximum of {float(g.max())}")
    if len(bad) > 2 and bad[2]:
        raise ValueError("beta must be finite, got NaN or inf")


def check_offsets(name: str, offsets: torch.Tensor, total: int) -> list[int]:
    """``offsets [N + 1]``: starts at 0, never decreases, ends at ``total``; host ints."""
    values = [int(x) for x in offsets.tolist()]
    if values[0] != 0:
        raise ValueError(f"{name} must start at 0, got {values[0]}")
    for i in range(len(values) - 1):
        if values[i + 1] < values[i]:
            raise ValueError(
                f"{name} must not decrease, got {name}[{i}] = {values[i]} > "
                f"{name}[{i + 1}] = {values[i + 1]}"
            )
    if values[-1] != total:
        raise ValueError(f"{name} must end at the token count {total}, got {values[-1]}")
    return values


def check_slots(name: str, indices: torch.Tensor, slots: int) -> bool:
    """``indices`` in ``[0, slots)`` and pairwise distinct (an in-place write per index), but
    for negative ones: padding entries (vLLM's ``PAD_SLOT_ID``), allowed and repeatable.
    Returns whether there is one (read from the sync the check makes anyway)."""
    named = indices[indices >= 0]
    padded = named.numel() < indices.numel()
    if named.numel() == 0:
        return padded
    hi = int(named.max())
    if hi >= slots:
        raise ValueError(f"{name} must be in [0, {slots}), got {hi}")
    if torch.unique(named).numel() != named.numel():
        raise ValueError(f"{name} must not repeat a slot (each is updated in place), got repeats")
    return padded


def gated_delta_inputs(
    q: object,
    k: object,
    v: object,
    g: object,
    beta: object,
    scale: object,
    initial_state: object,
    cu_seqlens: object,
    use_qk_l2norm_in_kernel: object,
) -> GatedDeltaInputs:
    """Validate a prefill call (shapes, dtypes, devices, then ``cu_seqlens`` and ``g``)."""
    check_tensor("q", q, ndim=4, dtype=FLOATS)
    assert isinstance(q, torch.Tensor)
    b, t, h, dk = q.shape
    dev = q.device
    check_tensor("k", k, shape=(b, t, h, dk), dtype=q.dtype, device=dev)
    check_tensor("v", v, ndim=4, dtype=q.dtype, device=dev)
    assert isinstance(v, torch.Tensor) and isinstance(k, torch.Tensor)
    check_tensor("v", v, shape=(b, t, None, None))
    hv, dv = v.shape[2], v.shape[3]
    check_heads_divide(h, hv)
    if dk < 1 or dv < 1:
        raise ValueError(f"q's K and v's V must be >= 1, got K = {dk} and V = {dv}")
    check_tensor("g", g, shape=(b, t, hv), dtype=FLOATS, device=dev)
    check_tensor("beta", beta, shape=(b, t, hv), dtype=FLOATS, device=dev)
    assert isinstance(g, torch.Tensor) and isinstance(beta, torch.Tensor)
    l2 = check_flag("use_qk_l2norm_in_kernel", use_qk_l2norm_in_kernel)
    resolved = resolve_scale(scale, dk)  # type: ignore[arg-type]
    if cu_seqlens is None:
        lengths = [t] * b
        starts = [i * t for i in range(b)]
    else:
        check_tensor("cu_seqlens", cu_seqlens, ndim=1, dtype=INDEX_DTYPES)
        assert isinstance(cu_seqlens, torch.Tensor)
        if cu_seqlens.device.type not in ("cpu", dev.type):
            raise ValueError(f"cu_seqlens must be on the CPU or {dev}, got {cu_seqlens.device}")
        if b != 1:
            raise ValueError(f"q must have batch size 1 with cu_seqlens, got B = {b}")
        if cu_seqlens.shape[0] < 2:
            raise ValueError(
                f"cu_seqlens must have N + 1 >= 2 entries, got shape {tuple(cu_seqlens.shape)}"
            )
        bounds = check_offsets("cu_seqlens", cu_seqlens, t)
        starts = bounds[:-1]
        lengths = [bounds[i + 1] - bounds[i] for i in range(len(starts))]
    n = len(lengths)
    if initial_state is not None:
        check_tensor(
            "initial_state", initial_state, shape=(n, hv, dk, dv), dtype=torch.float32, device=dev
        )
    if b * t:
        check_gates(g, beta)
    return GatedDeltaInputs(
        q.reshape(b * t, h, dk), k.reshape(b * t, h, dk), v.reshape(b * t, hv, dv),
        g.reshape(b * t, hv), beta.reshape(b * t, hv), tuple(lengths), tuple(starts), resolved,
        initial_state, l2, b, t,  # type: ignore[arg-type]
    )  # fmt: skip
