"""The steady state of ``paged_decode``: a call shaped like one already validated and run.

vLLM calls decode about ten times per token with tensors whose sizes, strides, dtypes and
devices do not change between steps; only their data and ``max_seq_len`` move. Everything
:func:`attn_core.paged_decode` checks about those properties, the plan it resolves for them and,
on the native backend, the kernel's argument block are decided by the first such call. This
module keys them on the call's *signature* (every tensor's ``(shape, strides, dtype, device)``,
the options, the scale values and the settings generation) and keeps, per signature, the
caches' layout, the table's capacity, whether value checks are on and, per ``max_seq_len``
bucket, the plan and its prepared launch.

A later call with the same signature checks only what can differ per call: ``max_seq_len``
(an int in ``[1, capacity]``), the workspace's thread, the caches' alignment (native), and the
values themselves where ``ATTN_CORE_CHECKS=1``. Then it runs.

Soundness: a signature is made only from plain tensors (``type(t) is torch.Tensor``), plain
``float`` / ``int`` scales and ``str`` options; anything else goes the full way and meets its
error there. An entry is recorded only after the full path validated the call and ran it, so a
hit is a call the full path has already accepted in every property the signature holds.
Entries are bounded (:data:`MAX_ENTRIES`) and a settings ``reload()`` starts a new generation,
so a changed setting never reuses an old decision.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Optional

import torch

from attn_core.core.cache_layout import CacheLayout
from attn_core.core.settings import generation
from attn_core.core.workspace import Workspace
from attn_core.decode.bounds import max_seq_len_bucket
from attn_core.decode.native_step import native_partials
from attn_core.decode.plan import AnyDecodePlan
from attn_core.device.spec import DeviceSpec
from attn_core.native.decode import PreparedDecode

_TENSOR = torch.Tensor
_NUMBERS = (float, int)  # type() checks: bool, numpy scalars and tensors take the full path
# vLLM serves a handful of batch sizes (its CUDA-graph sizes and the odd eager batch) per
# model; 256 signatures is far above that and bounds what stale entries can hold.
MAX_ENTRIES = 256


# (workspace, its generation, part_out address, part_lse address)
_Addresses = tuple["weakref.ref[Workspace]", int, Optional[int], Optional[int]]


@dataclass(frozen=True)
class SteadyStep:
    """One ``max_seq_len`` bucket's plan; ``prepared`` is the native launch template (None on
    the torch path) and ``partials`` the elements of its fp32 partials (0 with one partition)."""

    plan: AnyDecodePlan
    prepared: Optional[PreparedDecode] = None
    partials: tuple[int, int] = (0, 0)
    # the partials' addresses last handed out: (workspace weakref, its generation, out, lse),
    # replaced whole (one store), so threads sharing the step never see a torn entry
    addresses: list[Optional[_Addresses]] = field(
        default_factory=lambda: [None], compare=False, repr=False
    )


def partial_addresses(
    step: SteadyStep, device: torch.device, workspace: Workspace
) -> tuple[Optional[int], Optional[int]]:
    """:func:`attn_core.decode.native_step.native_partials` for ``step``, remembered while
    ``workspace`` keeps its buffers (its ``generation`` unchanged): the workspace lookup, two
    ``str(device)`` keys and two ``data_ptr`` calls cost 2.9 us of a ~29 us eager call on one
    H200 host; remembered, 0.3 us, and the call 1.5 us faster on another
    (docs/benchmarks.md#decode-graphs-and-eager)."""
    known = step.addresses[0]
    if known is not None and known[0]() is workspace and known[1] == workspace.generation:
        return known[2], known[3]
    part_out, part_lse = native_partials(step.partials, device, workspace)
    step.addresses[0] = (weakref.ref(workspace), workspace.generation, part_out, part_lse)
    return part_out, part_lse


@dataclass
class SteadyEntry:
    """What the full path decided for one signature."""

    layout: CacheLayout
    capacity: int  # block_tables.shape[1] * block_size: max_seq_len's bound
    scale: float  # the resolved softmax scale
    value_checks: bool  # ATTN_CORE_CHECKS in this settings generation
    steps: dict[int, SteadyStep] = field(default_factory=dict)


_ENTRIES: dict[tuple, SteadyEntry] = {}


def signature(
    query: object,
    key_cache: object,
    value_cache: object,
    block_tables: object,
    seq_lens: object,
    out: object,
    alibi_slopes: object,
    kv_cache_dtype: object,
    scale: object,
    k_scale: object,
    v_scale: object,
    backend: object,
    device_spec: object,
) -> Optional[tuple]:
    """The call's steady-state key, or None when an argument is not of a plain type."""
    parts: list[object] = []
    for t in (query, key_cache, value_cache, block_tables, seq_lens):
        if type(t) is not _TENSOR:
            return None
        parts.append((t.shape, t.stride(), t.dtype, t.device))  # type: ignore[attr-defined]
    for t in (out, alibi_slopes):
        if t is None:
            parts.append(None)
        elif type(t) is _TENSOR:
            parts.append((t.shape, t.stride(), t.dtype, t.device))  # type: ignore[attr-defined]
        else:
            return None
    if type(k_scale) not in _NUMBERS or type(v_scale) not in _NUMBERS:
        return None
    if scale is not None and type(scale) not in _NUMBERS:
        return None
    if type(kv_cache_dtype) is not str or (backend is not None and type(backend) is not str):
        return None
    if device_spec is not None and type(device_spec) is not DeviceSpec:
        return None
    parts += (kv_cache_dtype, scale, k_scale, v_scale, backend, device_spec, generation())
    return tuple(parts)


def lookup(sig: Optional[tuple], max_seq_len: object) -> Optional[tuple[SteadyEntry, int]]:
    """``(entry, bucket)`` for a known signature whose ``max_seq_len`` is in range, else None
    (the caller then takes the full path, which raises for a bad ``max_seq_len``)."""
    if sig is None:
        return None
    entry = _ENTRIES.get(sig)
    if entry is None or type(max_seq_len) is not int:
        return None
    if not 0 < max_seq_len <= entry.capacity:  # type: ignore[operator]
        return None
    return entry, max_seq_len_bucket(max_seq_len, entry.capacity)  # type: ignore[arg-type]


def record(sig: tuple, entry: SteadyEntry, bucket: int, step: SteadyStep) -> None:
    """Keep ``step`` for ``bucket`` under ``sig`` (the full path has validated and run it)."""
    known = _ENTRIES.get(sig)
    if known is None:
        if len(_ENTRIES) >= MAX_ENTRIES:
            _ENTRIES.clear()
        known = _ENTRIES.setdefault(sig, entry)
    known.steps[bucket] = step


def forget() -> None:
    """Drop every entry (tests; nothing else needs it: a reload changes the key)."""
    _ENTRIES.clear()
