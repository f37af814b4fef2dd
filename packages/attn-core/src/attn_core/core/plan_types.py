"""Plan building blocks shared by decode and prefill plans and read by the simulator.

A plan step describes one launch the way a device kernel would run it: its grid, its block, and
the shared memory and registers each block needs. The torch execution path issues a fixed set of
batched ops per step; the simulator charges the step's grid against a :class:`DeviceSpec`
(occupancy, waves, shared-memory budget). Keeping both in one object is what makes the simulator
judge the code that actually runs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KernelStep:
    """One launch of a plan.

    Attributes:
        name: what the step does ("single_tile", "partition", "reduce", "prefill_tile", ...).
        grid: ``(x, y, z)`` blocks; attn-core's decode grids are
            ``(num_seqs, num_kv_heads, num_partitions)``.
        threads_per_block: threads in one block.
        shared_mem_bytes: static + dynamic shared memory one block needs.
        registers_per_thread: registers the design assumes per thread.
    """

    name: str
    grid: tuple[int, int, int]
    threads_per_block: int
    shared_mem_bytes: int
    registers_per_thread: int = 64

    @property
    def num_blocks(self) -> int:
        x, y, z = self.grid
        return x * y * z
