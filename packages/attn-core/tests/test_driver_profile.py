"""A CUDA device no profile matches gets a profile from its driver, never bi-v100's."""

from __future__ import annotations

from types import SimpleNamespace

from attn_core.device.driver_profile import spec_from_properties
from attn_core.device.spec import get_device_spec

RTX = SimpleNamespace(
    name="NVIDIA GeForce RTX 4090",
    major=8,
    minor=9,
    multi_processor_count=128,
    warp_size=32,
    max_threads_per_block=1024,
    max_threads_per_multi_processor=1536,
    regs_per_multiprocessor=65536,
    shared_memory_per_block=49152,
    shared_memory_per_multiprocessor=102400,
    L2_cache_size=72 * 1024 * 1024,
    total_memory=25_393_692_672,
)


def test_driver_fields_come_from_the_driver():
    spec = spec_from_properties(RTX)
    assert spec.name == "nvidia-geforce-rtx-4090+driver"
    assert (spec.sm_count, spec.max_threads_per_sm, spec.shared_mem_per_sm) == (128, 1536, 102400)
    assert spec.l2_bytes == 72 * 1024 * 1024 and spec.memory_bytes == 25_393_692_672
    assert spec.provenance["sm_count"] == "reported by the driver (multi_processor_count)"


def test_what_the_driver_does_not_say_is_assumed_from_the_nearest_architecture():
    spec = spec_from_properties(RTX)
    a100 = get_device_spec("a100")
    assert spec.hbm_bandwidth == a100.hbm_bandwidth
    assert spec.provenance["hbm_bandwidth"] == "assumed: as a100"
    hopper = spec_from_properties(SimpleNamespace(**{**vars(RTX), "major": 9}))
    assert hopper.provenance["hbm_bandwidth"] == "assumed: as h200"


def test_a_torch_without_some_properties_keeps_the_base_value_marked_assumed():
    old = SimpleNamespace(name="X", major=8, multi_processor_count=10, warp_size=32)
    spec = spec_from_properties(old)
    assert spec.sm_count == 10
    assert spec.registers_per_sm == get_device_spec("a100").registers_per_sm
    assert spec.provenance["registers_per_sm"] == "assumed: as a100"


def test_never_the_bi_v100_profile():
    assert spec_from_properties(RTX).warp_size == 32 != get_device_spec("bi-v100").warp_size
