"""The impure half of planning, done once per plan: device, capabilities, readiness, overrides.

A decode or prefill call is *resolved* here and then only *run*. Resolving reads the settings
snapshot (:mod:`attn_core.core.settings`: the environment as of the last ``reload()``), picks
the device profile (``device_spec``, else ``ATTN_CORE_DEVICE``, else detected), probes the
device's torch (:func:`~attn_core.device.capabilities.probe_capabilities`), asks whether the
native kernel is built and verified here (:func:`attn_core.native.readiness.native_ready`) and
whether fused prefill backends matched the reference (:mod:`attn_core.prefill.verify`), then
calls the pure planners. A native plan leaves with its loaded library attached, so running it
looks nothing up.

Precedence of every decision: an explicit argument (``backend=``, ``overrides=``,
``device_spec=``), then the settings snapshot, then the planner's default.

:func:`cached_decode_plan` keeps resolved decode plans per shape, ``max_seq_len`` bucket,
table width, ``backend`` argument, profile and settings generation; :func:`attn_core.
paged_decode` asks it only for a call key it has not seen (its own steady state is one dict
lookup), so a steady-state call reads no environment and resolves nothing.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import torch

from attn_core.core.checks import (
    check_backend,
    check_device,
    check_type,
    check_types,
    check_window,
)
from attn_core.core.settings import (
    DECODE_BACKENDS,
    PREFILL_BACKENDS,
    DecodeOverrides,
    PrefillOverrides,
    current_overrides,
)
from attn_core.core.shapes import AttentionShape
from attn_core.decode.plan import AnyDecodePlan, DecodeLengths, plan_decode
from attn_core.decode.plan_native import NativeDecodePlan
from attn_core.device.capabilities import Capabilities, probe_capabilities
from attn_core.device.detect import detect_device_spec
from attn_core.device.spec import DeviceSpec
from attn_core.native.readiness import native_ready
from attn_core.prefill.plan import PrefillLengths, PrefillPlan, plan_prefill
from attn_core.prefill.verify import Runner, verified_capabilities


def decode_plan_for(
    shape: AttentionShape,
    lengths: DecodeLengths,
    device: torch.device,
    device_spec: Optional[DeviceSpec] = None,
    overrides: Optional[DecodeOverrides] = None,
    *,
    backend: Optional[str] = None,
) -> AnyDecodePlan:
    """The decode plan for ``device``, resolved: the profile (``device_spec`` or
    ``ATTN_CORE_DEVICE`` or detected), probed capabilities, the native kernel's readiness, and
    ``overrides`` (default: the settings'), ``backend`` winning over both. A native plan
    carries its verified library; ``plan.backend_reason`` says why its backend was chosen."""
    device = check_device("device", device)
    check_backend(backend, DECODE_BACKENDS)
    _check_resolver_args(shape, lengths, DecodeLengths, device_spec, overrides, DecodeOverrides)
    settings = current_overrides()
    decode = overrides if overrides is not None else settings.decode
    if backend is not None:
        decode = dataclasses.replace(decode, backend=backend)
    spec = device_spec if device_spec is not None else detect_device_spec(device, settings.device)
    caps = probe_capabilities(device, shape.dtype)
    lib = None
    if decode.backend != "torch":
        lib, why = native_ready(settings.native, device, shape)
        caps = dataclasses.replace(caps, native_decode=lib is not None, native_decode_why=why)
    plan = plan_decode(shape, lengths, spec, caps, decode)
    if isinstance(plan, NativeDecodePlan):
        plan = dataclasses.replace(plan, library=lib)
    return plan


def max_seq_len_bucket(max_seq_len: int, capacity: int) -> int:
    """``max_seq_len`` rounded up so one plan serves a run of growing lengths.

    vLLM passes the batch's longest length, which grows by one every step; plans are made for
    the bucket (at most 1/16 or 256 tokens more, capped by the table's capacity). The extra
    slots are masked, so results are exact either way.
    """
    step = max(256, 1 << max(0, max_seq_len.bit_length() - 5))
    return min(capacity, -(-max_seq_len // step) * step)


@functools.lru_cache(maxsize=512)
def cached_decode_plan(
    shape: AttentionShape,
    num_seqs: int,
    bucket: int,
    max_blocks: int,
    device: torch.device,
    backend: Optional[str],
    device_spec: Optional[DeviceSpec],
    settings_generation: int,
) -> AnyDecodePlan:
    """:func:`decode_plan_for`, kept per key (``settings_generation`` is
    :func:`attn_core.core.settings.generation`: a reload resolves again)."""
    del settings_generation  # part of the key only
    lengths = DecodeLengths(num_seqs, bucket, max_blocks)
    return decode_plan_for(shape, lengths, device, device_spec, backend=backend)


@functools.lru_cache(maxsize=64)
def with_library(plan: NativeDecodePlan, device: torch.device) -> NativeDecodePlan:
    """A caller's native plan (made by the pure planner) with the verified library attached;
    kept per (plan, device), so a caller passing the same plan each step resolves it once."""
    lib, why = native_ready(current_overrides().native, device, _shape_of(plan))
    if lib is None:
        raise ValueError(f"plan.backend is 'native' but the native kernel is {why}")
    return dataclasses.replace(plan, library=lib)


def _shape_of(plan: NativeDecodePlan) -> AttentionShape:
    return AttentionShape(
        plan.num_heads, plan.num_kv_heads, plan.head_size, plan.block_size, plan.compute_dtype,
        plan.kv_cache_dtype,
    )  # fmt: skip


def prefill_plan_for(
    shape: AttentionShape,
    lengths: PrefillLengths,
    device: torch.device,
    device_spec: Optional[DeviceSpec] = None,
    overrides: Optional[PrefillOverrides] = None,
    *,
    alibi: bool = False,
    sliding_window: int = 0,
    backend: Optional[str] = None,
    run: Runner,
) -> PrefillPlan:
    """The prefill plan for ``device``, resolved: the profile, the probed capabilities with
    fused backends narrowed to those that matched the reference (``run`` runs the check case;
    checked once per process, :mod:`attn_core.prefill.verify`), and ``overrides`` (default: the
    settings'), ``backend`` winning over both."""
    device = check_device("device", device)
    check_backend(backend, PREFILL_BACKENDS)
    _check_resolver_args(shape, lengths, PrefillLengths, device_spec, overrides, PrefillOverrides)
    check_type("alibi", alibi, bool, "a bool")
    check_window(sliding_window)
    settings = current_overrides()
    chosen = overrides if overrides is not None else settings.prefill
    if backend is not None:
        chosen = dataclasses.replace(chosen, backend=backend)
    spec = device_spec if device_spec is not None else detect_device_spec(device, settings.device)
    caps: Capabilities = probe_capabilities(device, shape.dtype)
    if caps.fused_prefill and chosen.backend is None and not alibi and not sliding_window:
        caps = verified_capabilities(caps, device, shape.dtype, shape.head_size, run)
    return plan_prefill(
        shape, lengths, spec, caps, chosen, alibi=alibi, sliding_window=sliding_window
    )


def _check_resolver_args(
    shape: object,
    lengths: object,
    lengths_type: type,
    device_spec: object,
    overrides: object,
    overrides_type: type,
) -> None:
    """What the resolvers read before the planner sees its arguments, checked by type."""
    check_types(
        ("shape", shape, AttentionShape), ("lengths", lengths, lengths_type),
        ("overrides", overrides, overrides_type),
    )  # fmt: skip
    if device_spec is not None:
        check_type("device_spec", device_spec, DeviceSpec, "None or a DeviceSpec")
