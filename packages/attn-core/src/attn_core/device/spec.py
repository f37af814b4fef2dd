"""What the launch plan needs to know about a device, with where each number came from.

Profiles are data: one frozen :class:`DeviceSpec` per device, every field's provenance in
``provenance`` ("datasheet: ...", "measured: ...", "assumed: ..."). The simulator (attn_sim)
reads the same objects; calibration there produces new ``DeviceSpec`` values with
``dataclasses.replace``, never edits these.

Selection (which profile a device gets, ``ATTN_CORE_DEVICE``) is :mod:`attn_core.device.detect`'s
job; this module is data and the occupancy rule only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

KiB = 1024
GiB = 1024**3


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    sm_count: int
    warp_size: int
    max_threads_per_block: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    registers_per_sm: int
    max_registers_per_thread: int
    register_alloc_unit: int  # registers, allocated per warp in units of this many
    shared_mem_per_sm: int  # bytes usable by blocks on one SM
    shared_mem_per_block: int  # bytes one block may use (the budget plans are checked against)
    shared_mem_alloc_unit: int  # bytes
    shared_mem_reserved_per_block: int  # bytes the runtime keeps per resident block
    memory_bytes: int
    hbm_bandwidth: float  # bytes/s the plan and simulator assume for streaming reads
    fp16_flops: float  # dense fp16 matrix FLOP/s
    fp32_flops: float  # plain fp32 FLOP/s (elementwise, softmax)
    launch_overhead_s: float  # host time to issue one launch from eager PyTorch, seconds
    l2_bytes: int
    provenance: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)
    # Occupancy details (CUDA's cuda_occupancy.h): registers are handed to warps per scheduler
    # sub-partition, and a block must fit the per-block register file.
    register_sub_partitions: int = 4
    max_registers_per_block: int = 65536
    # Device time every launch costs even when the host is ahead (CUDA-graph replay): launch
    # latency plus a tiny kernel's ramp, seconds. Eager steps pay launch_overhead_s on the host
    # as well; graph replay pays only this.
    launch_gap_s: float = 0.0
    # Shared memory one block may opt in to beyond ``shared_mem_per_block`` (CUDA's
    # cudaFuncAttributeMaxDynamicSharedMemorySize); 0 where there is no opt-in. The native
    # prefill's large tile needs it (:mod:`attn_core.prefill.plan_native`).
    shared_mem_per_block_optin: int = 0
    # Device time from a kernel's last block to the first work of a programmatic dependent
    # launch (NVIDIA compute 9.0+: cudaLaunchAttributeProgrammaticStreamSerialization, whose
    # blocks are placed while the kernel before still runs), seconds; 0 where the device has no
    # such launch and every launch pays launch_gap_s. The native decode's merge launches this
    # way where it can (attn_core.native.split.merge_is_dependent).
    dependent_launch_gap_s: float = 0.0

    @property
    def max_warps_per_sm(self) -> int:
        return self.max_threads_per_sm // self.warp_size

    def with_overrides(self, **changes: object) -> DeviceSpec:
        """A copy with some fields replaced; their provenance becomes "override"."""
        prov = dict(self.provenance)
        for key in changes:
            prov[key] = "override"
        return dataclasses.replace(self, provenance=prov, **changes)  # type: ignore[arg-type]


_BI_V100 = DeviceSpec(
    name="bi-v100",
    sm_count=16,
    warp_size=64,
    max_threads_per_block=1024,
    max_threads_per_sm=4096,
    max_blocks_per_sm=16,
    registers_per_sm=131072,
    max_registers_per_thread=255,
    register_alloc_unit=256,
    shared_mem_per_sm=128 * KiB,
    shared_mem_per_block=32 * KiB,
    shared_mem_alloc_unit=256,
    shared_mem_reserved_per_block=0,
    memory_bytes=32 * GiB,
    hbm_bandwidth=584e9,
    fp16_flops=147e12,
    fp32_flops=36.9e12,
    launch_overhead_s=6e-6,
    l2_bytes=4 * 1024 * KiB,
    launch_gap_s=3e-6,
    provenance={
        "sm_count": "measured: earlier work on the platform reported 16 SMs; unconfirmed",
        "warp_size": "datasheet: CoreX warps are 64 threads",
        "max_threads_per_block": "assumed: 1024, as CUDA",
        "max_threads_per_sm": "assumed: 64 warps of 64 threads",
        "max_blocks_per_sm": "assumed: 16",
        "registers_per_sm": "assumed: 128K 32-bit registers",
        "max_registers_per_thread": "assumed: 255, as CUDA",
        "register_alloc_unit": "assumed: 256, as CUDA",
        "shared_mem_per_sm": "assumed: 128 KiB",
        "shared_mem_per_block": "measured: vendor's vLLM limits kernels to 32 KiB per block "
        "(one CoreX header says 48 KiB; profile bi-v100-smem48k assumes that)",
        "shared_mem_alloc_unit": "assumed: 256 bytes",
        "shared_mem_reserved_per_block": "assumed: 0",
        "memory_bytes": "datasheet: 32 GB HBM2",
        "hbm_bandwidth": "measured: ~584 GB/s device-to-device copy elsewhere (datasheet 1.2 TB/s)",
        "fp16_flops": "datasheet: 147 TFLOPS fp16",
        "fp32_flops": "datasheet: 36.9 TFLOPS fp32",
        "launch_overhead_s": "measured: empty-kernel launch about 6 us on the platform",
        "l2_bytes": "assumed: 4 MiB",
        "register_sub_partitions": "assumed: 4 schedulers per SM, as CUDA",
        "max_registers_per_block": "assumed: 64K registers per block, as CUDA",
        "launch_gap_s": "assumed: 3 us, near the H200's measured 2.8 us (no graph-replay "
        "measurement on the platform yet)",
        "dependent_launch_gap_s": "assumed: 0, CoreX has no programmatic dependent launch",
        "shared_mem_per_block_optin": "assumed: 0, no opt-in (the vendor's vLLM keeps every "
        "kernel within 32 KiB per block)",
    },
)

_BI_V100_SMEM48K = _BI_V100.with_overrides(name="bi-v100-smem48k", shared_mem_per_block=48 * KiB)
_BI_V100_SMEM48K = dataclasses.replace(
    _BI_V100_SMEM48K,
    provenance={
        **_BI_V100_SMEM48K.provenance,
        "shared_mem_per_block": "assumed: 48 KiB per block, as one CoreX header states",
    },
)


def _cuda_limits(cc: str) -> tuple[dict, dict]:
    """The occupancy limits NVIDIA compute capabilities 8.0 and 9.0 share, and their
    provenance: ``(DeviceSpec fields, provenance)``."""
    cc_source = f"datasheet: CUDA compute capability {cc}"
    calculator = f"datasheet: CUDA occupancy calculator, cc {cc}"
    values = dict(
        warp_size=32, max_threads_per_block=1024, max_threads_per_sm=2048, max_blocks_per_sm=32,
        registers_per_sm=65536, max_registers_per_thread=255, register_alloc_unit=256,
        shared_mem_per_block=48 * KiB, shared_mem_alloc_unit=128,
        shared_mem_reserved_per_block=1 * KiB,
    )  # fmt: skip
    provenance = {
        "warp_size": "datasheet",
        **dict.fromkeys(
            ("max_threads_per_block", "max_threads_per_sm", "max_blocks_per_sm",
             "registers_per_sm", "max_registers_per_thread", "max_registers_per_block"),
            cc_source,
        ),
        "register_alloc_unit": calculator,
        "shared_mem_alloc_unit": calculator,
        "shared_mem_reserved_per_block": "datasheet: 1 KiB system use per block, cc >= 8.0",
        "register_sub_partitions": f"datasheet: cuda_occupancy.h, 4 sub-partitions for cc {cc}",
    }  # fmt: skip
    return values, provenance


_SM90_LIMITS, _SM90_PROVENANCE = _cuda_limits("9.0")
_SM80_LIMITS, _SM80_PROVENANCE = _cuda_limits("8.0")

_H200 = DeviceSpec(
    name="h200",
    sm_count=132,
    **_SM90_LIMITS,
    shared_mem_per_sm=228 * KiB,
    memory_bytes=150_109_880_320,
    hbm_bandwidth=4.8e12,
    fp16_flops=989e12,
    fp32_flops=67e12,
    launch_overhead_s=4e-6,
    l2_bytes=60 * 1024 * KiB,
    launch_gap_s=2.8e-6,
    shared_mem_per_block_optin=227 * KiB,
    dependent_launch_gap_s=0.5e-6,
    provenance={
        **_SM90_PROVENANCE,
        "sm_count": "datasheet: H200 SXM, 132 SMs",
        "shared_mem_per_sm": "datasheet: 228 KiB per SM, cc 9.0",
        "shared_mem_per_block": "datasheet: 48 KiB without opt-in (227 KiB with)",
        "memory_bytes": (
            "measured: the driver's total_memory (device-facts, H200; datasheet 141 GB)"
        ),
        "hbm_bandwidth": "datasheet: 4.8 TB/s",
        "fp16_flops": "datasheet: 989 TFLOPS dense fp16/bf16",
        "fp32_flops": "datasheet: 67 TFLOPS fp32",
        "launch_overhead_s": "assumed: 4 us per launch from PyTorch eager (a host property: "
        "GPU run 1's host, torch 2.11, fitted 28 us; calibrated profiles carry their host's)",
        "l2_bytes": ("measured: the driver's L2 size (device-facts, H200; datasheet 50 MiB)"),
        "launch_gap_s": "measured: GPU run 1 (H200, torch 2.11), CUDA-graph replay of attn-core "
        "decode at 1x8K: 0.209 ms for 64 launches moving ~0.12 GB (~0.03 ms) => ~2.8 us each",
        "shared_mem_per_block_optin": "datasheet: 227 KiB with opt-in, cc 9.0",
        "dependent_launch_gap_s": "measured: H200, bench/decode_timeline.py "
        "(%globaltimer stamps): the native merge's first work 0.5 us after the last partition "
        "block ended, at every shape (docs/benchmarks.md#device-facts)",
    },
)

_A100 = DeviceSpec(
    name="a100",
    sm_count=108,
    **_SM80_LIMITS,
    shared_mem_per_sm=164 * KiB,
    memory_bytes=80 * 10**9,
    hbm_bandwidth=2.039e12,
    fp16_flops=312e12,
    fp32_flops=19.5e12,
    launch_overhead_s=4e-6,
    l2_bytes=40 * 1024 * KiB,
    launch_gap_s=3e-6,
    shared_mem_per_block_optin=163 * KiB,
    provenance={
        **_SM80_PROVENANCE,
        "sm_count": "datasheet: A100 SXM4 80GB, 108 SMs",
        "shared_mem_per_sm": "datasheet: 164 KiB per SM, cc 8.0",
        "shared_mem_per_block": "datasheet: 48 KiB without opt-in (163 KiB with)",
        "memory_bytes": "datasheet: 80 GB HBM2e",
        "hbm_bandwidth": "datasheet: 2.039 TB/s",
        "fp16_flops": "datasheet: 312 TFLOPS dense fp16",
        "fp32_flops": "datasheet: 19.5 TFLOPS fp32",
        "launch_overhead_s": "assumed: 4 us per launch from PyTorch eager",
        "l2_bytes": "datasheet: 40 MiB",
        "launch_gap_s": "assumed: 3 us, near the H200's measured 2.8 us",
        "shared_mem_per_block_optin": "datasheet: 163 KiB with opt-in, cc 8.0",
        "dependent_launch_gap_s": "datasheet: 0, programmatic dependent launch needs cc 9.0",
    },
)

DEVICE_SPECS: Mapping[str, DeviceSpec] = {
    s.name: s for s in (_BI_V100, _BI_V100_SMEM48K, _H200, _A100)
}
DEFAULT_DEVICE = "bi-v100"


def get_device_spec(name: str) -> DeviceSpec:
    """The profile called ``name``; a clear error lists the known ones."""
    try:
        return DEVICE_SPECS[name]
    except KeyError:
        raise ValueError(
            f"device profile must be one of {sorted(DEVICE_SPECS)}, got {name!r}"
        ) from None


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit if unit > 0 else value


def occupancy_limits(
    spec: DeviceSpec, threads_per_block: int, registers_per_thread: int, shared_mem_bytes: int
) -> dict:
    """Blocks per SM each resource alone allows, as CUDA's occupancy calculator computes them.

    Keys: ``warps``, ``registers``, ``shared_mem``, ``blocks``; the resident count is their
    minimum (0: the block cannot launch). Rules of ``cuda_occupancy.h`` for any warp size:
    registers go to warps in ``register_alloc_unit`` units inside ``register_sub_partitions``
    register files, and a block over ``max_registers_per_block`` (warps rounded up to the
    sub-partitions, the hardware's check) cannot launch; shared memory is taken in
    ``shared_mem_alloc_unit`` units with ``shared_mem_reserved_per_block`` added, and more than
    ``shared_mem_per_block`` cannot launch. ``attn_sim`` checks this against the CUDA driver
    (``bench/occupancy_check.py``); plans should size grids with it.
    """
    for name, value in (
        ("threads_per_block", threads_per_block),
        ("registers_per_thread", registers_per_thread),
        ("shared_mem_bytes", shared_mem_bytes),
    ):
        if value < 0 or (name == "threads_per_block" and value == 0):
            raise ValueError(f"{name} must be {'> 0' if value == 0 else '>= 0'}, got {value}")
    warps = -(-threads_per_block // spec.warp_size)
    limits = {
        "warps": spec.max_warps_per_sm // warps,
        "registers": _register_limit(spec, warps, registers_per_thread),
        "shared_mem": 0,
        "blocks": spec.max_blocks_per_sm,
    }
    if shared_mem_bytes <= spec.shared_mem_per_block:
        per_block = shared_mem_allocation(spec, shared_mem_bytes)
        limits["shared_mem"] = spec.shared_mem_per_sm // per_block if per_block else 1 << 30
    if threads_per_block > spec.max_threads_per_block:
        limits["warps"] = 0
    if registers_per_thread > spec.max_registers_per_thread:
        limits["registers"] = 0
    return limits


def opted_in(spec: DeviceSpec) -> DeviceSpec:
    """``spec`` as a kernel that opts in sees it (``cudaFuncSetAttribute``, dynamic shared
    memory): its per-block budget raised to ``shared_mem_per_block_optin``; ``spec`` itself
    where the device has no larger opt-in budget (the BI-V100's profile)."""
    if spec.shared_mem_per_block_optin <= spec.shared_mem_per_block:
        return spec
    return spec.with_overrides(shared_mem_per_block=spec.shared_mem_per_block_optin)


def shared_mem_allocation(spec: DeviceSpec, shared_mem_bytes: int) -> int:
    """Bytes one block takes from its SM: reservation added, rounded to the allocation unit."""
    return _round_up(
        shared_mem_bytes + spec.shared_mem_reserved_per_block, spec.shared_mem_alloc_unit
    )


def _register_limit(spec: DeviceSpec, warps: int, registers_per_thread: int) -> int:
    if registers_per_thread == 0:
        return 1 << 30
    per_warp = _round_up(registers_per_thread * spec.warp_size, spec.register_alloc_unit)
    parts = spec.register_sub_partitions
    hardware_check = per_warp * _round_up(warps, parts)
    if max(hardware_check, per_warp * warps) > spec.max_registers_per_block:
        return 0
    warps_fit = (spec.registers_per_sm // parts // per_warp) * parts
    return warps_fit // warps
