"""Blocks per SM the way CUDA's occupancy calculator computes them, and waves with their tail.

The rule itself lives in :func:`attn_core.device.spec.occupancy_limits`, so attn-core's plans
can size grids with the numbers the simulator checks. The limits follow ``cuda_occupancy.h``
(the header behind ``cudaOccupancyMaxActiveBlocksPerMultiprocessor``), for any warp size:

- warps:     ``max_warps_per_sm // ceil(threads / warp_size)``
- registers: a warp is given ``round_up(regs_per_thread * warp_size, register_alloc_unit)``
  registers inside one of ``register_sub_partitions`` register files, so
  ``warps_fit = (registers_per_sm // sub_partitions // regs_per_warp) * sub_partitions``;
  a block whose registers exceed ``max_registers_per_block`` (with its warps rounded up to the
  sub-partition count, the hardware's check) cannot launch at all.
- shared memory: ``round_up(static + dynamic + reserved_per_block, shared_mem_alloc_unit)`` per
  block out of ``shared_mem_per_sm``; more than ``shared_mem_per_block`` (static + dynamic) cannot
  launch.
- blocks:    ``max_blocks_per_sm``.

A design that cannot launch gets ``blocks_per_sm == 0`` and ``limiter`` says why.
"""

from __future__ import annotations

from dataclasses import dataclass

from attn_core.device.spec import DeviceSpec, occupancy_limits, shared_mem_allocation


@dataclass(frozen=True)
class Occupancy:
    """Resident blocks per SM and which resource set the number.

    ``limits`` maps each resource ("warps", "registers", "shared_mem", "blocks") to the blocks it
    alone would allow; ``limiter`` names the smallest (ties: first in that order).
    """

    blocks_per_sm: int
    limiter: str
    limits: dict
    warps_per_block: int
    shared_mem_allocated: int  # bytes one block takes from the SM, granularity and reservation in

    def occupancy(self, spec: DeviceSpec) -> float:
        """Resident warps over the SM's maximum."""
        return self.blocks_per_sm * self.warps_per_block / spec.max_warps_per_sm


def blocks_per_sm(
    spec: DeviceSpec,
    threads_per_block: int,
    registers_per_thread: int,
    shared_mem_bytes: int,
) -> Occupancy:
    """Occupancy of one kernel design on ``spec``.

    The limits are attn-core's :func:`attn_core.device.spec.occupancy_limits` (one rule for the
    plans and the simulator); this adds which one binds.

    Args:
        spec: the device profile.
        threads_per_block: block size in threads.
        registers_per_thread: registers the compiled kernel uses per thread.
        shared_mem_bytes: static + dynamic shared memory of one block, bytes.
    """
    limits = occupancy_limits(spec, threads_per_block, registers_per_thread, shared_mem_bytes)
    limiter = min(limits, key=lambda k: limits[k])
    return Occupancy(
        blocks_per_sm=limits[limiter],
        limiter=limiter,
        limits=limits,
        warps_per_block=-(-threads_per_block // spec.warp_size),
        shared_mem_allocated=shared_mem_allocation(spec, shared_mem_bytes),
    )


@dataclass(frozen=True)
class Waves:
    """How a grid spreads over the device.

    ``waves`` is ``ceil(blocks / slots)`` with ``slots = blocks_per_sm * sm_count``;
    ``tail_utilisation`` is the busy fraction of the last wave's slots.

    Two quantisation factors (1.0 = no loss):

    - ``efficiency = exact_waves / waves``: blocks of fixed duration (compute- or latency-bound)
      leave the tail wave's empty slots idle.
    - ``memory_efficiency``: bandwidth-bound blocks share HBM; an SM is assumed to reach its
      ``1 / sm_count`` share of bandwidth with one resident block, so only a tail (or a whole
      grid) smaller than one block per SM loses bandwidth:
      ``blocks / ((waves - 1) * slots + max(tail_blocks, sm_count))``.
    """

    blocks: int
    slots: int
    waves: int
    tail_utilisation: float

    @property
    def exact_waves(self) -> float:
        return self.blocks / self.slots

    sm_count: int = 1

    @property
    def efficiency(self) -> float:
        return self.exact_waves / self.waves if self.waves else 1.0

    @property
    def memory_efficiency(self) -> float:
        if not self.waves:
            return 1.0
        tail = self.blocks - (self.waves - 1) * self.slots
        return self.blocks / ((self.waves - 1) * self.slots + max(tail, self.sm_count))


def waves(spec: DeviceSpec, blocks: int, blocks_per_sm_: int) -> Waves:
    """Waves of a ``blocks``-block grid when each SM holds ``blocks_per_sm_`` of them."""
    if blocks < 0:
        raise ValueError(f"blocks must be >= 0, got {blocks}")
    if blocks_per_sm_ <= 0:
        raise ValueError(f"blocks_per_sm must be > 0 (a design that fits), got {blocks_per_sm_}")
    slots = blocks_per_sm_ * spec.sm_count
    count = -(-blocks // slots)
    tail = blocks - (count - 1) * slots if count else 0
    return Waves(
        blocks=blocks,
        slots=slots,
        waves=count,
        tail_utilisation=tail / slots if count else 0.0,
        sm_count=spec.sm_count,
    )
