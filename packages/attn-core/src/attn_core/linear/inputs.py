"""Validation of the linear-attention entry points' arguments, into one object per call.

Shape, dtype and device checks run on every call (host metadata only). Value checks read
tensor values, which waits for the device:

- prefill (:func:`chunk_gated_delta_rule`, :func:`fused_recurrent_gated_delta_rule`,
  :func:`causal_conv1d_fn`) checks values on every call. ``cu_seqlens`` is read on the host
  (the launch plan needs the lengths). The gates are checked by :func:`start_gate_check`: two
  reductions enqueued before the kernels and copied to pinned host memory; the native path
  launches its kernels, then waits for that copy alone (:meth:`GateCheck.settle`), so the host
  stays a call ahead of the device instead of draining it before every layer. A bad gate still
  raises at the call, and what the kernels wrote with it (the call's own outputs, never
  returned) is dropped. The entry point took 4.18 ms at 32K against 3.59 for its kernels
  launched directly while it waited before launching (H100, docs/benchmarks.md#gated-deltanet);
- the serving steps (:func:`gated_delta_decode`, :func:`causal_conv1d_update`) check values only
  with ``ATTN_CORE_CHECKS=1`` and never while a CUDA graph is being captured: they run every
  decode step, inside graphs, and must not sync. Without checks an index out of range is the
  torch error (a device-side assert on CUDA) and a repeated index leaves one of the writes.
"""

from __future__ import annotations

import math
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
        gates: the value checks of ``g`` and ``beta``, enqueued: settle them before the
            results leave the call.
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
    gates: GateCheck

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


@dataclass(frozen=True)
class GateCheck:
    """The extremes of ``g`` and ``beta`` on their way to the host (:func:`start_gate_check`).

    Attributes:
        extremes: ``[4]`` fp32 on the host: min and max of ``g``, then of ``beta``; None
            when there are no tokens.
        ready: recorded on the device's stream after their copy; None when already there.
    """

    extremes: Optional[torch.Tensor]
    ready: Optional[torch.cuda.Event]

    def settle(self) -> None:
        """Raise the ``ValueError`` a NaN / infinite / positive ``g`` or a NaN / infinite
        ``beta`` earns; waits for the extremes' copy only."""
        if self.extremes is None:
            return
        if self.ready is not None:
            self.ready.synchronize()
        g_lo, g_hi, b_lo, b_hi = self.extremes.tolist()
        if not (math.isfinite(g_lo) and math.isfinite(g_hi)):
            raise ValueError("g must be finite (a log decay <= 0), got NaN or inf")
        if g_hi > 0:
            raise ValueError(f"g must be <= 0 (a log decay), got a maximum of {g_hi}")
        if not (math.isfinite(b_lo) and math.isfinite(b_hi)):
            raise ValueError("beta must be finite, got NaN or inf")


def start_gate_check(g: torch.Tensor, beta: torch.Tensor) -> GateCheck:
    """Enqueue the gate checks on the current stream: ``g`` finite and <= 0 (a log decay),
    ``beta`` finite (a NaN anywhere makes both extremes NaN)."""
    if g.numel() == 0:
        return GateCheck(None, None)
    # in fp32: a 16-bit aminmax is not on torch 2.1's CPU (nor needed: fp32 holds every value)
    extremes = torch.stack([*torch.aminmax(g.float()), *torch.aminmax(beta.float())])
    if extremes.device.type != "cuda":
        return GateCheck(extremes, None)
    host = torch.empty(4, dtype=torch.float32, pin_memory=True)
    host.copy_(extremes, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record()
    return GateCheck(host, ready)


def check_gates(g: torch.Tensor, beta: torch.Tensor) -> None:
    """:func:`start_gate_check`, settled at once (one host sync)."""
    start_gate_check(g, beta).settle()


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
    """Validate a prefill call: shapes, dtypes, devices and ``cu_seqlens`` now, ``g`` and
    ``beta`` enqueued (the returned inputs' ``gates``)."""
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
    gates = start_gate_check(g, beta)
    return GatedDeltaInputs(
        q.reshape(b * t, h, dk), k.reshape(b * t, h, dk), v.reshape(b * t, hv, dv),
        g.reshape(b * t, hv), beta.reshape(b * t, hv), tuple(lengths), tuple(starts), resolved,
        initial_state, l2, b, t, gates,  # type: ignore[arg-type]
    )  # fmt: skip
