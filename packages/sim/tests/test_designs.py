"""Kernel designs against vLLM 0.6.3's launcher formulas and the issue's numbers."""

from __future__ import annotations

from attn_core.core.plan_types import KernelStep
from attn_core.device.spec import get_device_spec
from attn_sim.cost import design_cost
from attn_sim.designs import (
    QWEN36,
    evaluate,
    from_steps,
    gqa_partitioned,
    gqa_single_pass,
    gqa_tile_smem,
    vllm_v1,
    vllm_v2,
)

BI = get_device_spec("bi-v100")
BI48 = get_device_spec("bi-v100-smem48k")
H200 = get_device_spec("h200")
K100 = 100 * 1024


def test_v1_shared_memory_formula():
    # warp 32: NUM_WARPS = 4, outputs (4/2)*256*4 = 2048; logits: 1000 -> padded 1008 * 4
    d = vllm_v1(H200, QWEN36, 1, 1000)
    assert d.dynamic_smem == 1008 * 4
    assert d.static_smem == 256 * 2 + 2 * 4 * 4
    assert d.grid == (24, 1, 1) and d.threads == 128
    # short sequences: the outputs term wins
    assert vllm_v1(H200, QWEN36, 1, 100).dynamic_smem == 2048
    # warp 64 (BI-V100): NUM_WARPS = 2, outputs (2/2)*256*4 = 1024
    assert vllm_v1(BI, QWEN36, 1, 16).dynamic_smem == 1024


def test_v1_overflows_bi_v100_budgets_where_expected():
    # 32 KiB: logits of 8192 tokens alone are 32 KiB, plus 528 static bytes -> overflow
    assert evaluate(BI, vllm_v1(BI, QWEN36, 1, 7936)).fits
    assert not evaluate(BI, vllm_v1(BI, QWEN36, 1, 8192)).fits
    # 48 KiB: 12K tokens overflow, 11.5K fit
    assert evaluate(BI48, vllm_v1(BI48, QWEN36, 1, 11776)).fits
    assert not evaluate(BI48, vllm_v1(BI48, QWEN36, 1, 12288)).fits
    assert evaluate(BI, vllm_v1(BI, QWEN36, 1, K100)).smem_over == 409600 + 528 - 32768


def test_v2_versus_gqa_grid_at_100k():
    part, reduce = vllm_v2(BI, QWEN36, 1, K100)
    assert part.blocks == 4800 and part.grid == (24, 1, 200)
    assert reduce.grid == (24, 1, 1) and reduce.dynamic_smem == 2 * 200 * 4
    gqa_part, gqa_reduce = gqa_partitioned(BI, QWEN36, 1, K100)
    assert gqa_part.blocks == 800 and gqa_part.grid == (1, 4, 200)
    assert gqa_reduce.grid == (1, 4, 1)
    # the query-head grid reads K/V six times (GQA 6), the KV-head grid once
    assert part.kv_bytes_read == 6 * gqa_part.kv_bytes_read


def test_gqa_tiles_of_32_tokens_overflow_32k_at_head_256():
    # K and V tiles [32, 256] fp16 are 32 KiB by themselves
    assert gqa_tile_smem(QWEN36, 32) == 32768 + 6 * 256 * 2 + 6 * 32 * 4
    assert not evaluate(BI, gqa_partitioned(BI, QWEN36, 1, K100)[0]).fits
    assert evaluate(BI, gqa_partitioned(BI, QWEN36, 1, K100, tile_tokens=16)[0]).fits
    assert evaluate(BI48, gqa_partitioned(BI48, QWEN36, 1, K100)[0]).fits


def test_single_pass_is_one_launch_and_cheaper_than_two():
    (single,) = gqa_single_pass(BI48, QWEN36, 1, K100)
    two = gqa_partitioned(BI48, QWEN36, 1, K100)
    assert single.grid == two[0].grid
    t_single = design_cost(BI48, single).time_s
    t_two = sum(design_cost(BI48, d).time_s for d in two)
    assert t_single < t_two


def test_gqa_design_beats_v2_on_predicted_time():
    v2 = sum(design_cost(BI48, d).time_s for d in vllm_v2(BI48, QWEN36, 1, K100))
    gqa = sum(design_cost(BI48, d).time_s for d in gqa_partitioned(BI48, QWEN36, 1, K100))
    assert gqa < v2 / 3


def test_plan_steps_become_designs():
    steps = (KernelStep("partition", (2, 4, 50), 256, 20000, 64),)
    (d,) = from_steps(steps)
    assert (d.blocks, d.threads, d.smem, d.registers) == (400, 256, 20000, 64)
    assert evaluate(BI, d).fits


def test_unlaunchable_design_costs_infinity():
    d = vllm_v1(BI, QWEN36, 1, K100)
    assert design_cost(BI, d).time_s == float("inf")


def test_plan_designs_carry_the_plan_traffic():
    from attn_sim.designs import plan_designs
    from attn_sim.workloads import Case, plan_for

    plan = plan_for(BI, Case("decode", 1, K100))
    designs = {d.name: d for d in plan_designs(plan)}
    assert plan.tier == "partitioned"
    assert designs["partition"].kv_bytes_read == plan.kv_bytes == 2 * K100 * 4 * 256 * 2
    partials = 24 * plan.num_partitions * (256 + 2) * 4
    assert designs["reduce"].other_bytes == partials + 24 * 256 * 2
    assert design_cost(BI, designs["partition"]).time_s < sum(
        design_cost(BI, d).time_s for d in vllm_v2(BI, QWEN36, 1, K100)
    )
