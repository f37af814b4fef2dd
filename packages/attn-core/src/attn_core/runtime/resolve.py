"""The impure half of planning, done once per plan: device, capabilities, readiness, overrides.

A decode or prefill call is *resolved* here and then only *run*. Resolving reads the settings
snapshot (:mod:`attn_core.core.settings`: the environment as of the last ``reload()``), picks
the device profile (``device_spec``, else ``ATTN_CORE_DEVICE``, else detected), probes the
device's torch (:func:`~attn_core.device.capabilities.probe_capabilities`), asks whether the
native kernel is built and verified here (:func:`attn_core.native.loader.native_ready`) and
whether fused prefill backends matched the reference (:mod:`attn_core.prefill.verify`), then
calls the pure planners. A native plan leaves with its loaded library attached, so running it
looks nothing up.

Precedence of every decision: an explicit argument (``backend=``, ``overrides=``,
``device_spec=``), then the settings snapshot, then the planner's default.

Nothing here keeps plans: each entry point keeps its own, in one place (decode: its steady
state, :mod:`attn_core.runtime.decode_steady`, per call signature and ``max_seq_len`` bucket;
prefill: :mod:`attn_core.runtime.prefill`, per shapes, bucketed lengths
(:func:`prefill_lengths_bucket`) and features), and comes here only for a key it has not seen,
so a steady-state call reads no environment and resolves nothing.
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
from attn_core.decode.backends import BACKENDS as DECODE_BACKEND_REGISTRY
from attn_core.decode.backends import backend_of as decode_backend_of
from attn_core.decode.bounds import max_seq_len_bucket
from attn_core.decode.plan import AnyDecodePlan, DecodeLengths, plan_decode
from attn_core.device.capabilities import Capabilities, probe_capabilities
from attn_core.device.detect import detect_device_spec
from attn_core.device.spec import DeviceSpec
from attn_core.native.loader import native_ready
from attn_core.native.prefill import PrefillLibrary
from attn_core.prefill.plan import (
    AnyPrefillPlan,
    PrefillLengths,
    plan_prefill,
)
from attn_core.prefill.plan_native import (
    VARIANTS,
    NativePrefillPlan,
    plan_native_prefill,
    unsupported,
)
from attn_core.prefill.verify import verified_capabilities


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
    native = DECODE_BACKEND_REGISTRY["native"]
    if decode.backend != "torch" and native.ready is not None:
        lib, why = native.ready(settings.native, device, shape)
        caps = dataclasses.replace(caps, native_decode=lib is not None, native_decode_why=why)
    plan = plan_decode(shape, lengths, spec, caps, decode)
    if decode_backend_of(plan).ready is not None:
        plan = dataclasses.replace(plan, library=lib)  # type: ignore[arg-type]
    return plan


@functools.lru_cache(maxsize=64)
def with_library(plan: AnyDecodePlan, device: torch.device) -> AnyDecodePlan:
    """A caller's plan (made by the pure planner) ready to run: for a backend that needs a
    verified library, with it attached; kept per (plan, device), so a caller passing the same
    plan each step resolves it once."""
    backend = decode_backend_of(plan)
    if backend.ready is None or getattr(plan, "library", None) is not None:
        return plan
    lib, why = backend.ready(current_overrides().native, device, _shape_of(plan))
    if lib is None:
        raise ValueError(f"plan.backend is {backend.name!r} but the native kernel is {why}")
    return dataclasses.replace(plan, library=lib)  # type: ignore[arg-type]


def _shape_of(plan: AnyDecodePlan) -> AttentionShape:
    return AttentionShape(
        plan.num_heads, plan.num_kv_heads, plan.head_size, plan.block_size, plan.compute_dtype,
        getattr(plan, "kv_cache_dtype", "auto"),
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
    large_scale: bool = False,
    backend: Optional[str] = None,
) -> AnyPrefillPlan:
    """The prefill plan for ``device``, resolved: the profile, the probed capabilities with
    fused backends narrowed to those that matched the reference (checked once per process,
    :mod:`attn_core.prefill.verify`), the native kernel's variants
    that loaded and verified (:func:`native_prefill_caps`), and ``overrides`` (default: the
    settings'), ``backend`` winning over both. A native plan carries its verified library.
    ``alibi`` / ``sliding_window`` / ``large_scale`` (a softmax scale > 1): the call's features,
    as :func:`attn_core.plan_prefill` takes them."""
    device = check_device("device", device)
    check_backend(backend, PREFILL_BACKENDS)
    _check_resolver_args(shape, lengths, PrefillLengths, device_spec, overrides, PrefillOverrides)
    check_type("alibi", alibi, bool, "a bool")
    check_type("large_scale", large_scale, bool, "a bool")
    check_window(sliding_window)
    settings = current_overrides()
    chosen = overrides if overrides is not None else settings.prefill
    if backend is not None:
        chosen = dataclasses.replace(chosen, backend=backend)
    spec = device_spec if device_spec is not None else detect_device_spec(device, settings.device)
    caps: Capabilities = probe_capabilities(device, shape.dtype)
    if caps.fused_prefill and chosen.backend is None and not alibi and not sliding_window:
        caps = verified_capabilities(caps, device, shape.dtype, shape.head_size)
    caps, libs = native_prefill_caps(
        caps, shape, lengths, spec, chosen, device, alibi=alibi, sliding_window=sliding_window,
        large_scale=large_scale,
    )  # fmt: skip
    plan = plan_prefill(
        shape, lengths, spec, caps, chosen, alibi=alibi, sliding_window=sliding_window,
        large_scale=large_scale,
    )  # fmt: skip
    if isinstance(plan, NativePrefillPlan):
        plan = dataclasses.replace(plan, library=libs[plan.variant])
    return plan


def prefill_lengths_bucket(
    max_query_len: int, max_context_len: int, num_seqs: int, num_tokens: int, capacity: int
) -> PrefillLengths:
    """The lengths a cached prefill plan is made for: the call's, each rounded up, so the
    chunks of a growing context and chunks of varying size share a plan.

    A plan must be made for *at least* the call's sizes (the native kernel's partials and
    split, :func:`attn_core.prefill.native_path.run_native_prefill`); bigger is exact, since
    the kernels run on the call's own lengths and an empty split writes nothing to merge.

    - ``max_context_len``: :func:`max_seq_len_bucket` (at most 1/16 or 256 tokens more, capped
      by the block table's ``capacity``); it decides streaming and the native split only.
    - ``max_query_len``, ``num_seqs``, ``num_tokens``: exact below 32, then at most 1/16 more
      (a multiple of ``2^(bits - 5)``), never past the next power of two, so the torch and
      fused plans' power-of-two query tile is the one the exact length gets.
    ``num_tokens`` stays within ``num_seqs * max_query_len`` (:class:`PrefillLengths`' bound).
    """
    query = _sixteenth_up(max_query_len)
    seqs = _sixteenth_up(num_seqs)
    context = max_seq_len_bucket(max_context_len, capacity)
    tokens = min(seqs * query, _sixteenth_up(num_tokens))
    return PrefillLengths(query, context, num_seqs=seqs, num_tokens=tokens)


def _sixteenth_up(n: int) -> int:
    step = 1 << max(0, n.bit_length() - 5)
    return -(-n // step) * step


def native_prefill_caps(
    caps: Capabilities,
    shape: AttentionShape,
    lengths: PrefillLengths,
    spec: DeviceSpec,
    overrides: PrefillOverrides,
    device: torch.device,
    *,
    alibi: bool = False,
    sliding_window: int = 0,
    large_scale: bool = False,
) -> tuple[Capabilities, dict]:
    """``caps`` with ``native_prefill`` set to the variants that loaded and verified here, and
    their libraries. Only variants that could win are loaded (a build or a check costs
    seconds): all of them (or ``native_mma``) where native is forced; otherwise those the price
    puts below the torch / fused plan, cheapest first, stopping at the first that verifies.
    Nothing is loaded where another backend is forced or the kernel cannot take the shape."""
    if overrides.backend not in (None, "native"):
        return caps, {}
    not_here = unsupported(shape, spec)
    if device.type != "cuda":
        not_here = f"needs a CUDA device, got {device.type}"
    if not_here:
        return dataclasses.replace(caps, native_prefill=(), native_prefill_why=not_here), {}
    variants = [v for v in VARIANTS if overrides.native_mma in (None, v)]
    priced = sorted(
        (plan_native_prefill(
            shape, spec, v, num_seqs=lengths.num_seqs, num_tokens=lengths.tokens,
            max_query_len=lengths.max_query_len, max_context_len=lengths.max_context_len,
        ) for v in variants),
        key=lambda p: p.cost.seconds,
    )  # fmt: skip
    bar, rival = float("inf"), ""
    if overrides.backend is None:
        portable = plan_prefill(
            shape, lengths, spec, caps, overrides, alibi=alibi, sliding_window=sliding_window,
            large_scale=large_scale,
        )  # fmt: skip
        if portable.cost is not None:
            bar, rival = portable.cost.seconds, portable.backend
    libs: dict = {}
    why: list[str] = []
    for native in priced:
        if native.cost.seconds >= bar:
            why.append(f"{native.variant} priced above {rival}, not loaded")
            continue
        settings = current_overrides().native
        lib, not_ready = native_ready(PrefillLibrary, native.variant, settings, device, shape)
        if lib is None:
            why.append(f"{native.variant} {not_ready}")
            continue
        libs[native.variant] = lib
        break  # the cheapest verified variant is the one a plan would take
    caps = dataclasses.replace(caps, native_prefill=tuple(libs), native_prefill_why="; ".join(why))
    return caps, libs


@functools.lru_cache(maxsize=64)
def with_prefill_library(plan: NativePrefillPlan, device: torch.device) -> NativePrefillPlan:
    """A caller's native prefill plan with its verified library attached; kept per (plan,
    device). ``ValueError`` naming why where the variant cannot serve it here."""
    shape = AttentionShape(
        plan.num_heads, plan.num_kv_heads, plan.head_size, plan.block_size, plan.dtype,
        plan.kv_cache_dtype,
    )  # fmt: skip
    settings = current_overrides().native
    lib, why = native_ready(PrefillLibrary, plan.variant, settings, device, shape)
    if lib is None:
        raise ValueError(f"plan.backend is 'native' ({plan.variant}) but it cannot run here: {why}")
    return dataclasses.replace(plan, library=lib)


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
