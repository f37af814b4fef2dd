"""The decode plan of the native kernel, and whether a plan takes it.

The backend choice is a pure function of the capabilities and overrides:

- ``DecodeOverrides.backend == "torch"``: the torch path;
- ``"native"``: the native kernel, or a ``ValueError`` where ``Capabilities.native_decode`` says
  it is not built and verified here;
- unset: the native kernel where it is built and verified, unless an override only the torch
  path understands is set (tier, partition size, single-tile bound, subscription, streaming,
  score rounding, gather width): those were asked of the torch path, so they get it.

The native plan's grid, partitions and partials come from :func:`attn_core.native.split.
native_split`, the function the executor and the simulator read too.
"""

from __future__ import annotations

from attn_core.capabilities import Capabilities
from attn_core.native.facts import THREADS
from attn_core.native.split import NativeSplit
from attn_core.plan_types import KernelStep
from attn_core.settings import DecodeOverrides

BACKENDS = ("torch", "native")
TORCH_ONLY_OVERRIDES = (
    "tier",
    "partition_size",
    "single_tile_max",
    "subscription",
    "stream_tokens",
    "scores",
    "gather_bytes",
)


def choose_backend(caps: Capabilities, overrides: DecodeOverrides) -> str:
    """``"native"`` or ``"torch"`` (see the module docstring)."""
    if overrides.backend == "torch":
        return "torch"
    if overrides.backend == "native":
        if not caps.native_decode:
            raise ValueError(
                "DecodeOverrides.backend (ATTN_CORE_DECODE_BACKEND) is 'native', but "
                "Capabilities.native_decode is False: the kernel is not built or not verified "
                "on this device (python -m attn_core.native status says why)"
            )
        return "native"
    torch_only = [n for n in TORCH_ONLY_OVERRIDES if getattr(overrides, n) is not None]
    return "native" if caps.native_decode and not torch_only else "torch"


def native_steps(split: NativeSplit, num_seqs: int, num_heads: int) -> tuple[KernelStep, ...]:
    """The launches: the partition kernel, then the merge kernel when there are partials."""
    partition = KernelStep(
        "native_partition",
        (split.rows // num_seqs, split.num_partitions, num_seqs),
        THREADS,
        split.partition.smem_bytes,
        split.partition.registers,
    )
    if not split.merged:
        return (partition,)
    merge = KernelStep(
        "native_merge",
        (num_heads, num_seqs, 1),
        THREADS,
        split.merge.smem_bytes,
        split.merge.registers,
    )
    return (partition, merge)
