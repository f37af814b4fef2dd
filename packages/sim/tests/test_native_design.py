"""The simulator's native-kernel rows and gate."""

from __future__ import annotations

import dataclasses

import pytest

from attn_core.device.spec import get_device_spec
from attn_sim.designs import QWEN36, evaluate
from attn_sim.gates import GateReport, _check_native_grid
from attn_sim.native_design import (
    HEADLINE_BATCHES,
    HEADLINE_CONTEXTS,
    native_designs,
    native_rows,
    native_step_s,
)
from attn_sim.workloads import Case

BI = get_device_spec("bi-v100")


def test_one_launch_without_partials_two_with():
    assert [d.name for d in native_designs(BI, QWEN36, 64, 8192)] == ["native_partition"]
    names = [d.name for d in native_designs(BI, QWEN36, 1, 102400)]
    assert names == ["native_partition", "native_merge"]


def test_kv_is_read_once_per_kv_head():
    (part, _) = native_designs(BI, QWEN36, 1, 102400)
    assert part.kv_bytes_read == 2 * 4 * 102400 * 256 * 2


def test_time_is_at_least_the_floor_and_adds_arithmetic():
    designs = native_designs(BI, QWEN36, 8, 102400)
    floor = designs[0].kv_bytes_read / BI.hbm_bandwidth
    t = native_step_s(BI, designs)
    assert t > floor
    compute = designs[0].flops / BI.fp32_flops
    assert t >= floor + compute


def test_headline_rows_cover_the_grid_and_call_the_torch_pricer():
    asked = []

    def torch_ms(batch, ctx):
        asked.append((batch, ctx))
        return 1.0

    rows = native_rows(BI, QWEN36, torch_ms)
    grid = [(b, c) for c in HEADLINE_CONTEXTS for b in HEADLINE_BATCHES]
    assert [(r["batch"], r["context"]) for r in rows] == grid == asked
    assert all(r["fits"] for r in rows)
    assert all(r["native/floor"] >= 1 for r in rows)


def test_the_gate_flags_a_kernel_over_the_shared_memory_budget():
    tiny = BI.with_overrides(shared_mem_per_block=4096, name="tiny")
    report = GateReport()
    _check_native_grid(tiny, report, [Case("decode", 1, 8192)])
    assert report.checks >= 1
    assert [v.gate for v in report.violations] == ["native_kernel"]
    assert "cannot be resident on tiny" in report.violations[0].detail


def test_the_gate_passes_on_the_default_profile():
    report = GateReport()
    _check_native_grid(BI, report, [Case("decode", b, 102400) for b in (1, 8, 64)])
    assert report.checks == 5 and not report.violations


H200 = get_device_spec("h200")


def test_the_h200_runs_the_matrix_unit_body_with_its_opt_in_budget():
    """NVIDIA profiles price the matrix-unit body: its products at the fp16 matrix rate, its 64 KiB
    of dynamic shared memory against the opt-in budget (the launcher opts in), which the gate
    accepts; the BI-V100 keeps the CUDA-core body inside the default budget."""
    (part, _) = native_designs(H200, QWEN36, 1, 102400)
    assert part.opts_in and part.tensor_flops > 0 and part.static_smem == 0
    assert part.dynamic_smem > H200.shared_mem_per_block
    judged = evaluate(H200, part)
    assert judged.fits and judged.smem_budget == H200.shared_mem_per_block_optin
    report = GateReport()
    _check_native_grid(H200, report, [Case("decode", b, 102400) for b in (1, 8, 64)])
    # partition and merge kernels at each batch: 64 x 100K splits in three (256 rows fill 65 %
    # of the 396 slots in one wave, 97 % in two; attn_core.native.split.rule_partitions)
    assert report.checks == 6 and not report.violations
    (bi_part, _) = native_designs(BI, QWEN36, 1, 102400)
    assert not bi_part.opts_in and bi_part.tensor_flops == 0
    # without the opt-in the same design would not fit
    assert not evaluate(H200, dataclasses.replace(part, opts_in=False)).fits


def test_the_matrix_unit_body_takes_its_tile_roof_when_it_is_longer():
    """A block works through its 16-token tiles in turn: on the H200 at 1 x 100K the roof (65 tiles
    at three blocks per SM) is longer than streaming plus arithmetic, so it is the time; the
    CUDA-core body (the BI-V100's) has no roof."""
    from attn_sim.native_design import MMA_SM_TILE_S

    part, merge = native_designs(H200, QWEN36, 1, 102400)
    judged = evaluate(H200, part)
    assert part.serial_tiles == 65  # 99 partitions of 1040 tokens
    roof = judged.waves.waves * 65 * judged.occupancy.blocks_per_sm * MMA_SM_TILE_S
    streaming = (part.kv_bytes_read + part.other_bytes) / H200.hbm_bandwidth
    assert roof > streaming
    assert native_step_s(H200, [part]) == pytest.approx(roof + H200.launch_gap_s)
    (bi_part, _) = native_designs(BI, QWEN36, 1, 102400)
    assert bi_part.serial_tiles == 0
