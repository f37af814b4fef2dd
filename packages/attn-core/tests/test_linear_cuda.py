"""The linear-attention layers on a CUDA device at the model's sizes (16 key / 32 value heads,
K = V = 128): prefill against the float64 reference, 1,000 decode steps after a chunked
prefill, the transient-memory bounds (the torch path's plan budget, the native path's none),
and a CUDA-graph capture of the decode step.

Run on the GPU machine: ``pytest -m cuda packages/attn-core/tests/test_linear_cuda.py``.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import requires_cuda
from linear_helpers import assert_linear_close, make_linear_case
from test_linear_decode import decode_after_prefill

from attn_core import (
    causal_conv1d_fn,
    causal_conv1d_update,
    chunk_gated_delta_rule,
    fused_recurrent_gated_delta_rule,
    gated_delta_decode,
    plan_gated_delta,
)
from attn_core.native.split import NATIVE_WORKSPACE_BYTES
from attn_core.reference import reference_causal_conv1d, reference_gated_delta

pytestmark = [pytest.mark.cuda, requires_cuda]
DEV = "cuda"
MODEL = (16, 32, 128, 128)  # key heads, value heads, K, V
DEVICE_DECODE_STEPS = 1000


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_varlen_prefill_at_model_dims(dtype) -> None:
    h, hv, dk, dv = MODEL
    case = make_linear_case([1, 63, 64, 65, 200], h, hv, dk, dv, dtype, l2norm=True, seed=1,
                            device=DEV)  # fmt: skip
    want_o, want_s = reference_gated_delta(**case.reference_kwargs())
    o, s = chunk_gated_delta_rule(**case.kwargs(), output_final_state=True)
    assert_linear_close(o, want_o, dtype)
    assert_linear_close(s, want_s, torch.float32 if dtype == torch.float32 else torch.float16)


def test_small_segments_on_the_device() -> None:
    h, hv, dk, dv = MODEL
    case = make_linear_case([130, 70], h, hv, dk, dv, torch.bfloat16, l2norm=True, seed=2,
                            device=DEV)  # fmt: skip
    per = plan_gated_delta(h, hv, dk, dv, 2).bytes_per_chunk
    plan = plan_gated_delta(h, hv, dk, dv, 2, budget_bytes=3 * per)  # two slots
    want_o, want_s = reference_gated_delta(**case.reference_kwargs())
    o, s = chunk_gated_delta_rule(
        **case.kwargs(), output_final_state=True, plan=plan, backend="torch"
    )  # the plan sizes the torch path's segments
    assert_linear_close(o, want_o, torch.bfloat16)
    assert_linear_close(s, want_s, torch.float16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_thousand_decode_steps_after_prefill(dtype) -> None:
    decode_after_prefill(130, DEVICE_DECODE_STEPS, MODEL[:2], MODEL[2:], dtype, device=DEV)


def model_inputs(t: int, seed: int) -> tuple[torch.Tensor, ...]:
    """One sequence of ``t`` tokens at the model's shape: bf16 q, k, v, beta; fp32 g < 0."""
    h, hv, dk, dv = MODEL
    gen = torch.Generator(device=DEV).manual_seed(seed)
    q, k = (torch.randn(1, t, h, dk, generator=gen, device=DEV).bfloat16() for _ in range(2))
    v = torch.randn(1, t, hv, dv, generator=gen, device=DEV).bfloat16()
    g = -torch.rand(1, t, hv, generator=gen, device=DEV)
    beta = torch.rand(1, t, hv, generator=gen, device=DEV).bfloat16()
    return q, k, v, g, beta


def transient_bytes(call) -> int:
    """Peak device memory ``call()`` allocated beyond what it returned (output, final states)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    o, s = call()
    torch.cuda.synchronize()
    kept = o.numel() * o.element_size() + s.numel() * s.element_size()
    return torch.cuda.max_memory_allocated() - base - kept


@pytest.mark.parametrize("lengths", [[16384], [64] * 200, [100] * 90])
def test_prefill_transient_memory_stays_in_the_plan_budget(lengths) -> None:
    """The peak above inputs and outputs stays under the plan's budget at the model's shape
    (the plan counts each phase's live set at its worst case): one long sequence (one state a
    chunk slot), one-chunk sequences side by side (three states a slot: running, before and
    after) and two-chunk ones."""
    h, hv, dk, dv = MODEL
    q, k, v, g, beta = model_inputs(sum(lengths), seed=3)
    cu = torch.tensor([0, *itertools.accumulate(lengths)], device=DEV)
    plan = plan_gated_delta(h, hv, dk, dv, 2)

    def call():
        return chunk_gated_delta_rule(
            q, k, v, g, beta, output_final_state=True, use_qk_l2norm_in_kernel=True, plan=plan,
            cu_seqlens=cu if len(lengths) > 1 else None, backend="torch")  # fmt: skip

    # once first: the process's cuBLAS workspace (32 MiB on the H100) is allocated on its first
    # matmul, and it outlives every call (measured first, the worst case read 533 MiB)
    call()
    transient = transient_bytes(call)
    assert transient <= plan.budget_bytes, transient / 2**20


@pytest.mark.parametrize("entry", [chunk_gated_delta_rule, fused_recurrent_gated_delta_rule])
def test_native_prefill_allocates_only_its_outputs(entry) -> None:
    """The native prefill keeps its state on chip: nothing beyond the output and the final
    states (the token-by-token entry once allocated the torch path's outputs as well: 258 MiB
    at 32K on the H100), but for the chunk-parallel kernels' workspace, bounded by the
    family's 64 MiB."""
    q, k, v, g, beta = model_inputs(4096, seed=4)
    entry(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True, backend="native")  # verified
    transient = transient_bytes(lambda: entry(
        q, k, v, g=g, beta=beta, output_final_state=True, use_qk_l2norm_in_kernel=True,
        backend="native"))  # fmt: skip
    bound = NATIVE_WORKSPACE_BYTES if entry is chunk_gated_delta_rule else 64 << 10
    assert transient <= bound, transient  # offsets, scalars, a workspace: no tensor of T tokens


BAD_GATES = [
    ("g", lambda t: t.index_fill(1, torch.tensor([77], device=DEV), float("nan")),
     "g must be finite"),
    ("g", lambda t: t.index_fill(1, torch.tensor([5], device=DEV), 0.25), "got a maximum of 0.25"),
    ("beta", lambda t: t.index_fill(1, torch.tensor([130], device=DEV), float("inf")),
     "beta must be finite"),
]  # fmt: skip


@pytest.mark.parametrize("entry", [chunk_gated_delta_rule, fused_recurrent_gated_delta_rule])
@pytest.mark.parametrize(("name", "spoil", "message"), BAD_GATES)
def test_native_prefill_refuses_bad_gates_after_its_launch(entry, name, spoil, message) -> None:
    """The native path enqueues the gate checks, launches, then reads them: a bad gate still
    raises at the call, the initial state is untouched, and the stream stays usable."""
    q, k, v, g, beta = model_inputs(200, seed=5)
    gates = {"g": g, "beta": beta}
    gates[name] = spoil(gates[name])
    init = torch.randn(1, MODEL[1], MODEL[2], MODEL[3], device=DEV)
    before = init.clone()
    with pytest.raises(ValueError, match=message):
        entry(q, k, v, g=gates["g"], beta=gates["beta"], initial_state=init,
              output_final_state=True, use_qk_l2norm_in_kernel=True, backend="native")  # fmt: skip
    assert torch.equal(init, before)
    # l2-normalised keys: unnormalised N(0, 1) keys of 128 make the recurrence itself diverge
    o, _ = entry(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True, backend="native")
    assert torch.isfinite(o).all()


def test_decode_in_a_cuda_graph() -> None:
    h, hv, dk, dv = MODEL
    n = 8
    gen = torch.Generator(device=DEV).manual_seed(4)

    def fresh() -> list[torch.Tensor]:
        return [
            torch.randn(n, h, dk, generator=gen, device=DEV).bfloat16(),
            torch.randn(n, h, dk, generator=gen, device=DEV).bfloat16(),
            torch.randn(n, hv, dv, generator=gen, device=DEV).bfloat16(),
            -torch.rand(n, hv, generator=gen, device=DEV),
            torch.rand(n, hv, generator=gen, device=DEV).bfloat16(),
        ]

    static = fresh()
    pool = torch.randn(2 * n, hv, dk, dv, generator=gen, device=DEV) * 0.1
    idx = torch.arange(n, device=DEV, dtype=torch.int32) * 2
    out = torch.empty(n, hv, dv, dtype=torch.bfloat16, device=DEV)

    def step() -> None:
        gated_delta_decode(*static, pool, idx, use_qk_l2norm_in_kernel=True, out=out)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up outside capture (allocator, kernels)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(3):  # replay with new inputs against an eager copy of the pool
        new = fresh()
        for dst, src in zip(static, new, strict=True):
            dst.copy_(src)
        eager_pool = pool.clone()
        want = gated_delta_decode(*new, eager_pool, idx, use_qk_l2norm_in_kernel=True)
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, want, atol=0, rtol=0)
        torch.testing.assert_close(pool, eager_pool, atol=0, rtol=0)


def test_conv_prefill_and_update_on_the_device() -> None:
    gen = torch.Generator(device=DEV).manual_seed(5)
    dim, width, lens = 8192, 4, [1, 3, 40]  # the model's q/k/v channels: 2 x 2048 + 4096
    x = torch.randn(dim, sum(lens), generator=gen, device=DEV).bfloat16()
    w = torch.randn(dim, width, generator=gen, device=DEV).bfloat16()
    states = torch.randn(4, dim, width - 1, generator=gen, device=DEV).bfloat16()
    before = states.clone()
    slots = torch.tensor([3, 0, 1], device=DEV, dtype=torch.int32)
    has = torch.tensor([True, False, True], device=DEV)
    qsl = torch.tensor([0, 1, 4, 44], device=DEV, dtype=torch.int32)
    out = causal_conv1d_fn(x, w, None, states, qsl, slots, has, "silu")
    for i in range(3):
        a, b = int(qsl[i]), int(qsl[i + 1])
        window = before[slots[i]] if has[i] else None
        want, _ = reference_causal_conv1d(x[:, a:b], w, None, window, "silu")
        assert_linear_close(out[:, a:b], want, torch.bfloat16)
    assert torch.equal(states[2], before[2])
    step = torch.randn(3, dim, generator=gen, device=DEV).bfloat16()
    windows = states[slots.long()].clone()
    got = causal_conv1d_update(step, states, w, None, "silu", slots)
    for i in range(3):
        want, _ = reference_causal_conv1d(step[i, :, None], w, None, windows[i], "silu")
        assert_linear_close(got[i], want[:, 0], torch.bfloat16)


@pytest.mark.parametrize("backend", ["torch", "native"])
def test_decode_padding_slots_under_graph_replay(backend) -> None:
    """vLLM's padded CUDA-graph batch: slots -1 leave the pool alone and give zeros, the named
    slots match the float64 rule, on both backends and under graph replay."""
    slots = torch.tensor([-1, 3, -1, 0], dtype=torch.int32, device=DEV)
    case = make_linear_case([1] * 4, 2, 4, 128, 128, torch.bfloat16, varlen=False, seed=9,
                            device=DEV)  # fmt: skip
    pool = torch.randn(5, 4, 128, 128, device=DEV)
    before = pool.clone()
    args = (case.q[:, 0], case.k[:, 0], case.v[:, 0], case.g[:, 0], case.beta[:, 0], pool, slots)
    out = torch.full((4, 4, 128), float("nan"), dtype=torch.bfloat16, device=DEV)
    gated_delta_decode(*args, out=out, backend=backend)  # warm-up: the library, the plan
    pool.copy_(before)
    out.fill_(float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gated_delta_decode(*args, out=out, backend=backend)
    pool.copy_(before)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(pool[[1, 2, 4]], before[[1, 2, 4]])
    assert torch.equal(out[[0, 2]].float(), torch.zeros(2, 4, 128, device=DEV))
    real = [1, 3]
    want_o, want_s = reference_gated_delta(
        case.q[real], case.k[real], case.v[real], case.g[real], case.beta[real],
        initial_state=before[[3, 0]],
    )  # fmt: skip
    assert_linear_close(out[real], want_o[:, 0], torch.bfloat16)
    assert_linear_close(pool[[3, 0]], want_s, torch.float16)
