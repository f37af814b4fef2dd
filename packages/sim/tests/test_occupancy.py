"""Occupancy against cases computed by hand from cuda_occupancy.h's rules, per architecture."""

from __future__ import annotations

import pytest

from attn_core.device.spec import get_device_spec
from attn_sim.occupancy import blocks_per_sm, waves

H200 = get_device_spec("h200")
A100 = get_device_spec("a100")
BI = get_device_spec("bi-v100")
BI48 = get_device_spec("bi-v100-smem48k")


@pytest.mark.parametrize(
    "spec, threads, regs, smem, want, limiter",
    [
        # 8 warps; 64 regs -> 2048/warp, 16384/sub-partition -> 8 warps x 4 = 32 warps -> 4 blocks
        (H200, 256, 64, 0, 4, "registers"),
        # 48 KiB + 1 KiB reserved = 50176 B; 233472 // 50176 = 4
        (H200, 128, 32, 48 * 1024, 4, "shared_mem"),
        # 255 regs -> 8192/warp; 32 warps x 8192 > 64K registers per block: cannot launch
        (H200, 1024, 255, 0, 0, "registers"),
        # 3 warps, 40 regs -> 1280/warp; 16384 // 1280 = 12 -> 48 warps -> 16 blocks
        (H200, 96, 40, 0, 16, "registers"),
        # tiny blocks: 32 blocks/SM cap
        (H200, 32, 16, 0, 32, "blocks"),
        # 48 KiB + 1 byte: over the per-block budget
        (H200, 128, 32, 48 * 1024 + 1, 0, "shared_mem"),
        # 20000 + 1024 -> 21120 (128 B units); 167936 // 21120 = 7
        (A100, 128, 32, 20000, 7, "shared_mem"),
        # 1024 threads = 32 warps; 64 // 32 = 2
        (A100, 1024, 32, 0, 2, "warps"),
        # warp size 64: 128 threads = 2 warps; 64 regs -> 4096/warp; 32768 // 4096 = 8 -> 32
        # warps -> 16 blocks, equal to the block cap (registers named first)
        (BI, 128, 64, 2576, 16, "registers"),
        # 2576 B -> 2816 (256 B units); 131072 // 2816 = 46 (not the limit)
        (BI, 128, 32, 2576, 16, "blocks"),
        # vLLM V1 at 8K tokens: 32768 logits + 528 static > 32 KiB -> cannot launch
        (BI, 128, 64, 32768 + 528, 0, "shared_mem"),
        # ... but fits 48 KiB: 33296 -> 33536; 131072 // 33536 = 3
        (BI48, 128, 64, 32768 + 528, 3, "shared_mem"),
        # 1024 threads = 16 warps of 64; 128 regs -> 8192/warp -> 4 per sub-partition -> 16 warps
        # -> 1 block; per-block registers 16 x 8192 = 128K > 64K: cannot launch
        (BI, 1024, 128, 0, 0, "registers"),
        (BI, 1024, 64, 0, 2, "registers"),
    ],
)
def test_blocks_per_sm_hand_computed(spec, threads, regs, smem, want, limiter):
    occ = blocks_per_sm(spec, threads, regs, smem)
    assert occ.blocks_per_sm == want, occ.limits
    assert occ.limiter == limiter


def test_warp_rounding_any_warp_size():
    # 65 threads: 3 warps of 32 on the H200, 2 warps of 64 on the BI-V100
    assert blocks_per_sm(H200, 65, 0, 0).warps_per_block == 3
    assert blocks_per_sm(BI, 65, 0, 0).warps_per_block == 2


def test_threads_over_block_limit_cannot_launch():
    occ = blocks_per_sm(H200, 1025, 16, 0)
    assert occ.blocks_per_sm == 0 and occ.limiter == "warps"


@pytest.mark.parametrize("bad", [dict(threads_per_block=0), dict(shared_mem_bytes=-1)])
def test_bad_arguments_name_themselves(bad):
    args = dict(threads_per_block=128, registers_per_thread=32, shared_mem_bytes=0) | bad
    name = next(iter(bad))
    with pytest.raises(ValueError, match=name):
        blocks_per_sm(H200, **args)


def test_waves_and_tail():
    # 800 blocks on 16 SMs x 16 blocks = 256 slots: 4 waves, last 32/256 busy
    w = waves(BI, 800, 16)
    assert (w.slots, w.waves) == (256, 4)
    assert w.tail_utilisation == pytest.approx(32 / 256)
    assert w.efficiency == pytest.approx(800 / 256 / 4)
    # 4800 blocks: 19 waves, last 192/256
    w = waves(BI, 4800, 16)
    assert (w.waves, w.tail_utilisation) == (19, pytest.approx(192 / 256))
    full = waves(H200, 132 * 4 * 3, 4)
    assert (full.waves, full.tail_utilisation, full.efficiency) == (3, 1.0, 1.0)


def test_waves_refuses_a_design_that_does_not_fit():
    with pytest.raises(ValueError, match="blocks_per_sm"):
        waves(BI, 10, 0)


def test_memory_efficiency_quantises_at_sm_granularity():
    # 4 blocks on 16 SMs: a quarter of the SMs pull bandwidth
    assert waves(BI, 4, 16).memory_efficiency == pytest.approx(4 / 16)
    # 800 blocks, 256 slots: the 32-block tail still covers all 16 SMs: no loss
    assert waves(BI, 800, 16).memory_efficiency == 1.0
    # 258 blocks: a 2-block tail costs like 16 blocks
    assert waves(BI, 258, 16).memory_efficiency == pytest.approx(258 / (256 + 16))
    # compute-bound quantisation is the slot one
    assert waves(BI, 258, 16).efficiency == pytest.approx(258 / 512)
