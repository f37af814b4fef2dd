"""The native kernel's decode plan, and which backend a decode plan takes (and why).

The backend choice is a pure function of the capabilities and overrides
(:func:`choose_backend`, which returns the reason the plan records):

- ``DecodeOverrides.backend == "torch"``: the torch path;
- ``"native"``: the native kernel; a ``ValueError`` where ``Capabilities.native_decode`` says it
  is not built and verified here (naming why), or where an override only the torch path
  understands is also set (naming both: they contradict each other);
- unset: the native kernel where it is built and verified, unless an override only the torch
  path understands is set (tier, partition size, single-tile bound, subscription, streaming,
  score rounding, gather width): those were asked of the torch path, so they get it, and the
  plan's ``backend_reason`` says so.

:class:`NativeDecodePlan` is the native backend's plan: sizes, the kernel's split (grid,
partitions, partials; :func:`attn_core.native.split.native_split`, which the simulator reads
too) and its launches. The resolver (:mod:`attn_core.runtime.resolve`) attaches the loaded library,
so running the plan looks nothing up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from attn_core.core.plan_types import KernelStep
from attn_core.core.settings import DecodeOverrides
from attn_core.core.shapes import AttentionShape
from attn_core.device.capabilities import Capabilities
from attn_core.device.spec import DeviceSpec
from attn_core.native.split import NativeSplit, merge_grid, native_split

TORCH_ONLY_OVERRIDES = (
    "tier",
    "partition_size",
    "single_tile_max",
    "subscription",
    "stream_tokens",
    "scores",
    "gather_bytes",
)


@dataclass(frozen=True)
class DecodeStep:
    """What every decode plan says of its step, whichever backend runs it (the fields both
    :class:`NativeDecodePlan` and :class:`attn_core.decode.plan.DecodePlan` start with).

    Attributes:
        tier: how the context is split (each plan type names its tiers).
        num_seqs, num_heads, num_kv_heads, head_size, block_size: problem sizes.
        group: query heads per KV head (``num_heads // num_kv_heads``).
        context_tokens: tokens the step covers, ``min(max_seq_len, table capacity)``.
        partition_size: tokens per partition (a multiple of ``block_size``).
        num_partitions: partitions the context is split into.
        cache_element_size: bytes per cache element.
    """

    tier: str
    num_seqs: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    block_size: int
    group: int
    context_tokens: int
    partition_size: int
    num_partitions: int
    cache_element_size: int

    @property
    def kv_bytes(self) -> int:
        """K+V bytes the real context occupies in the cache (what a step must read)."""
        per_token = self.num_kv_heads * self.head_size * self.cache_element_size
        return 2 * self.num_seqs * self.context_tokens * per_token


# The DecodeStep fields a plan copies from the layer's shape.
_SHAPE_FIELDS = ("num_heads", "num_kv_heads", "head_size", "block_size", "group")


def step_sizes(shape: AttentionShape, num_seqs: int, context: int) -> dict[str, Any]:
    """The sizes every :class:`DecodeStep` carries, for ``num_seqs`` sequences of ``shape``
    over ``context`` tokens (keyword arguments of a plan's constructor)."""
    sizes = {name: getattr(shape, name) for name in _SHAPE_FIELDS}
    return {"num_seqs": num_seqs, **sizes, "context_tokens": context}


@dataclass(frozen=True)
class NativeDecodePlan(DecodeStep):
    """One native decode step (the fields of :class:`DecodeStep`, then its own).

    Attributes:
        tier: ``"partitioned"`` when the merge kernel runs, else ``"one_pass"``.
        compute_dtype / kv_cache_dtype: query dtype, cache storage (``"auto"`` or an fp8
            format).
        workspace_bytes: the fp32 partials (0 with one partition).
        steps: the partition launch, and the merge launch when split.
        device_spec: the profile the plan was made for.
        split: the kernel's grid and recorded resources.
        backend_reason: why the native backend was chosen.
        library: the loaded, verified library (attached by the resolver; None in a plan made
            by the pure planner, e.g. the simulator's).
    """

    compute_dtype: torch.dtype
    kv_cache_dtype: str
    workspace_bytes: int
    steps: tuple[KernelStep, ...]
    device_spec: DeviceSpec
    split: NativeSplit
    backend_reason: str = ""
    library: Optional[Any] = field(default=None, compare=False, repr=False)

    backend = "native"

    @property
    def native(self) -> NativeSplit:
        """The split (the name the simulator and benchmarks read)."""
        return self.split


def choose_backend(caps: Capabilities, overrides: DecodeOverrides) -> tuple[str, str]:
    """``(backend, why)`` (see the module docstring)."""
    torch_only = [n for n in TORCH_ONLY_OVERRIDES if getattr(overrides, n) is not None]
    if overrides.backend == "torch":
        return "torch", "backend 'torch' asked for"
    if overrides.backend == "native":
        if torch_only:
            raise ValueError(
                "backend (argument or ATTN_CORE_DECODE_BACKEND) is 'native', but the torch-only "
                f"override(s) {', '.join(torch_only)} are set too: drop one of them"
            )
        if not caps.native_decode:
            raise ValueError(
                "backend (argument or ATTN_CORE_DECODE_BACKEND) is 'native', but the native "
                f"kernel cannot serve this call: {caps.native_decode_why or 'not verified'} "
                "(python -m attn_core.native status says more)"
            )
        return "native", "backend 'native' asked for; built and verified on this device"
    if not caps.native_decode:
        return "torch", f"native kernel {caps.native_decode_why or 'not available'}"
    if torch_only:
        return "torch", f"torch-only override(s) set: {', '.join(torch_only)}"
    return "native", "native kernel built and verified on this device"


def plan_native_decode(
    shape: AttentionShape, num_seqs: int, context: int, spec: DeviceSpec, why: str = ""
) -> NativeDecodePlan:
    """One native step over ``context`` tokens: the partition kernel, the merge if split."""
    split = native_split(shape, num_seqs, context, spec)
    return NativeDecodePlan(
        tier="partitioned" if split.merged else "one_pass",
        **step_sizes(shape, num_seqs, context),
        partition_size=split.partition_size,
        num_partitions=split.num_partitions,
        compute_dtype=shape.dtype,
        kv_cache_dtype=shape.kv_cache_dtype,
        cache_element_size=shape.cache_element_size,
        workspace_bytes=split.workspace_bytes(num_seqs, shape.num_heads, shape.head_size),
        steps=native_steps(split, num_seqs, shape.num_heads, shape.head_size),
        device_spec=spec,
        split=split,
        backend_reason=why,
    )


def native_steps(
    split: NativeSplit, num_seqs: int, num_heads: int, head_size: int
) -> tuple[KernelStep, ...]:
    """The launches: the partition kernel, then the merge kernel when there are partials."""
    partition = KernelStep(
        "native_partition",
        (split.rows // num_seqs, split.num_partitions, num_seqs),
        split.partition.threads,
        split.partition.smem_bytes,
        split.partition.registers,
    )
    if not split.merged:
        return (partition,)
    merge = KernelStep(
        "native_merge",
        merge_grid(num_seqs, num_heads, head_size, split.num_partitions),
        split.merge.threads,
        split.merge.smem_bytes,
        split.merge.registers,
    )
    return (partition, merge)
