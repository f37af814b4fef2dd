"""The native Gated DeltaNet library (csrc/gated_delta.cu) on a CUDA device.

Built through attn-core's own loader (nvcc or CoreX; cached), checked against the float64
reference by the verify-once check for every dtype and head size, then through the public
entry points at the model's sizes (16 key / 32 value heads, K = V = 128, conv dim 8192) against
the torch path, in a CUDA graph, and with the block-sharing of value heads varied.

Run on the GPU machine: ``pytest -m cuda packages/attn-core/tests/test_native_gated_delta_cuda.py``.
"""

from __future__ import annotations

import re

import pytest
import torch
from conftest import requires_cuda

from attn_core import (
    causal_conv1d_fn,
    causal_conv1d_update,
    chunk_gated_delta_rule,
    fused_recurrent_gated_delta_rule,
    gated_delta_decode,
)
from attn_core.core.settings import current_overrides
from attn_core.native.gated_delta import (
    OPERANDS16_STATE_TOLERANCE,
    VARIANT,
    GatedDeltaLibrary,
    check_chunk_parallel,
    check_chunk_parallel16,
    check_library,
    decode_case,
    launch_chunk_parallel_prefill,
    launch_decode,
    launch_recurrent_prefill,
)
from attn_core.native.loader import NativeError, load_library
from attn_core.native.split import chunk_record_bytes

pytestmark = [pytest.mark.cuda, requires_cuda]
DEV = torch.device("cuda")
MODEL = (16, 32, 128, 128)  # key heads, value heads, K, V
CONV_DIM = 2 * 16 * 128 + 32 * 128
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
OUT_TOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def library() -> GatedDeltaLibrary:
    lib, status = load_library(GatedDeltaLibrary, VARIANT, current_overrides().native, DEV)
    assert lib is not None, status.detail
    return lib


def test_the_library_loads_with_no_local_memory() -> None:
    lib = library()
    for which in ("decode", "decode_key_last", "recurrent_prefill", "chunked_prefill",
                  "chunk_prep", "chunk_pass", "conv_update", "conv_prefill",
                  "conv_prefill_state"):  # fmt: skip
        for head_k in (64, 128) if "conv" not in which else (128,):
            facts = lib.kernel_info(which, head_k)
            assert facts.local_bytes == 0, (which, head_k, facts)
            assert facts.blocks_per_sm >= 2, (which, head_k, facts)
    # the 16-bit pair: K = 128 only; chunk_pass16 takes 145 KiB of shared memory, one block an SM
    for which, blocks in (("chunk_prep16", 2), ("chunk_pass16", 1)):
        facts = lib.kernel_info(which, 128)
        assert facts.local_bytes == 0 and facts.blocks_per_sm >= blocks, (which, facts)
    for head_v in (32, 96, 128):
        assert lib.chunk_record16_bytes(128, head_v) == chunk_record_bytes(128, head_v, True)
    assert lib.chunk_record16_bytes(64, 128) == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("head_v,group", [(128, 2), (96, 3), (32, 1)])
def test_the_16bit_pair_passes_its_check(dtype, head_v, group) -> None:
    """The 16-bit pair against the float64 recurrence (its own verify-once check: lengths 0 to
    200 around the 64-token chunk, one segment and one-slot segments), within the dtype's state
    tolerance; fp32 inputs and K = 64 are refused by name, not served."""
    lib = library()
    verdict = check_chunk_parallel16(lib, DEV, (lib.path.name, dtype, 128, head_v, group))
    assert verdict.ok, verdict.detail
    for refused in ((torch.float32, 128), (dtype, 64)):
        verdict = check_chunk_parallel16(lib, DEV, (lib.path.name, refused[0], refused[1], 64, 1))
        assert not verdict.ok and "no 16-bit pair" in verdict.detail, verdict.detail


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_k,head_v,group", [(128, 128, 2), (64, 64, 1), (128, 96, 3)])
def test_the_reference_checks_pass(dtype, head_k, head_v, group) -> None:
    """The family's check and the chunk-parallel pair's own."""
    lib = library()
    for check in (check_library, check_chunk_parallel):
        verdict = check(lib, DEV, (lib.path.name, dtype, head_k, head_v, group))
        assert verdict.ok, (check.__name__, verdict.detail)


def model_step(batch: int, dtype: torch.dtype, seed: int = 0) -> dict:
    h, hv, dk, dv = MODEL
    gen = torch.Generator(device=DEV).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=DEV)

    pool = randn(2 * batch + 1, hv, dk, dv) * 0.1
    return dict(
        q=randn(batch, h, dk).to(dtype), k=randn(batch, h, dk).to(dtype),
        v=randn(batch, hv, dv).to(dtype), g=-torch.rand(batch, hv, generator=gen, device=DEV),
        beta=torch.rand(batch, hv, generator=gen, device=DEV).to(dtype), state_pool=pool,
        state_indices=torch.randperm(2 * batch + 1, generator=gen, device=DEV)[:batch].int(),
    )  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("batch", [1, 8, 64])
def test_decode_native_matches_torch_at_model_sizes(dtype, batch) -> None:
    x = model_step(batch, dtype)
    pool_t = x["state_pool"].clone()
    out_n = gated_delta_decode(**x, use_qk_l2norm_in_kernel=True, backend="native")
    out_t = gated_delta_decode(**{**x, "state_pool": pool_t}, use_qk_l2norm_in_kernel=True,
                               backend="torch")  # fmt: skip
    torch.testing.assert_close(out_n.float(), out_t.float(), atol=OUT_TOL[dtype], rtol=0)
    torch.testing.assert_close(x["state_pool"], pool_t, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("batch", [1, 64])
def test_decode_on_a_key_last_pool_matches_torch(batch) -> None:
    """vLLM's later ``[slots, HV, V, K]`` pool, passed as its transposed view: native (the
    default backend takes it) and torch agree, and the pool is updated in its own layout."""
    x = model_step(batch, torch.bfloat16, seed=6)
    key_last = x["state_pool"].transpose(-1, -2).contiguous()
    pool_t = x["state_pool"].clone()
    out_n = gated_delta_decode(**{**x, "state_pool": key_last.transpose(-1, -2)},
                               use_qk_l2norm_in_kernel=True)  # fmt: skip
    out_t = gated_delta_decode(**{**x, "state_pool": pool_t}, use_qk_l2norm_in_kernel=True,
                               backend="torch")  # fmt: skip
    torch.testing.assert_close(out_n.float(), out_t.float(), atol=OUT_TOL[torch.bfloat16], rtol=0)
    torch.testing.assert_close(key_last.transpose(-1, -2), pool_t, atol=1e-5, rtol=1e-5)


def test_decode_default_backend_is_native_and_graph_capturable() -> None:
    """Warm up (loads and verifies), capture one step, replay it over new inputs: the pool
    advances as the torch path's does, step after step."""
    x = model_step(8, torch.bfloat16, seed=1)
    pool_t = x["state_pool"].clone()
    out = torch.empty(8, MODEL[1], MODEL[3], dtype=torch.bfloat16, device=DEV)
    step = dict(x, out=out, use_qk_l2norm_in_kernel=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    warm = step["state_pool"].clone()
    with torch.cuda.stream(side):
        gated_delta_decode(**{**step, "state_pool": warm})  # loads and verifies
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gated_delta_decode(**step)
    fresh = model_step(8, torch.bfloat16, seed=2)  # the capture ran nothing: pools still equal
    for t in range(3):
        for name in ("q", "k", "v", "g", "beta"):
            x[name].copy_(fresh[name] * (1 + t))
        graph.replay()
        want = gated_delta_decode(**{**x, "state_pool": pool_t}, use_qk_l2norm_in_kernel=True,
                                  backend="torch")  # fmt: skip
        torch.cuda.synchronize()
        torch.testing.assert_close(out.float(), want.float(), atol=3e-2, rtol=0)
        torch.testing.assert_close(x["state_pool"], pool_t, atol=1e-4, rtol=1e-4)


def test_value_heads_sharing_a_block_give_the_same_bits() -> None:
    lib = library()
    results = []
    for block_heads in (1, 2):
        case = decode_case(16, 32, 128, 128, torch.bfloat16, DEV, seqs=64, slots=70, seed=4)
        out = torch.empty(64, 32, 128, dtype=torch.bfloat16, device=DEV)
        launch_decode(lib, case["q"], case["k"], case["v"], case["g"], case["beta"],
                      case["state_pool"], case["state_indices"], out, scale=0.08, l2norm=True,
                      block_heads=block_heads)  # fmt: skip
        results.append((out, case["state_pool"].nan_to_num(5.0)))
    assert torch.equal(results[0][0].view(torch.int16), results[1][0].view(torch.int16))
    assert torch.equal(results[0][1], results[1][1])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_conv_native_matches_torch_at_model_sizes(dtype) -> None:
    gen = torch.Generator(device=DEV).manual_seed(3)
    dim = CONV_DIM
    weight = torch.randn(dim, 4, generator=gen, device=DEV).to(dtype)
    bias = torch.randn(dim, generator=gen, device=DEV).to(dtype)
    lens = [1, 3, 700, 5000]
    qsl = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device=DEV, dtype=torch.int32)
    x = torch.randn(qsl[-1].item(), dim, generator=gen, device=DEV).to(dtype).t()
    states = torch.randn(6, dim, 3, generator=gen, device=DEV).to(dtype)
    slots = torch.tensor([5, 0, 2, 3], device=DEV, dtype=torch.int32)
    has = torch.tensor([True, False, True, True], device=DEV)
    results = []
    for backend in ("native", "torch"):
        st = states.clone()
        out = causal_conv1d_fn(x, weight, bias, st, qsl, slots, has, "silu", backend=backend)
        nxt = torch.randn(4, dim, generator=torch.Generator(device=DEV).manual_seed(8),
                          device=DEV).to(dtype)  # fmt: skip
        upd = causal_conv1d_update(nxt, st, weight, bias, "silu", slots, backend=backend)
        results.append((out.float(), upd.float(), st.float()))
    tol = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype]
    for got, want in zip(results[0], results[1], strict=True):
        torch.testing.assert_close(got, want, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_native_prefills_match_torch_at_model_sizes(dtype) -> None:
    """Varlen, with initial states: the native token-by-token and chunked kernels against the
    torch paths and each other; the default chunked call is the native one."""
    h, hv, dk, dv = MODEL
    gen = torch.Generator(device=DEV).manual_seed(6)
    lens = [1, 63, 64, 65, 700]
    total = sum(lens)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=DEV)

    x = dict(
        q=randn(1, total, h, dk).to(dtype), k=randn(1, total, h, dk).to(dtype),
        v=randn(1, total, hv, dv).to(dtype),
        g=-torch.rand(1, total, hv, generator=gen, device=DEV) * 0.3,
        beta=torch.rand(1, total, hv, generator=gen, device=DEV).to(dtype),
        initial_state=randn(len(lens), hv, dk, dv) * 0.1, cu_seqlens=cu,
        use_qk_l2norm_in_kernel=True, output_final_state=True,
    )  # fmt: skip
    o_n, s_n = fused_recurrent_gated_delta_rule(**x, backend="native")
    o_t, s_t = fused_recurrent_gated_delta_rule(**x, backend="torch")
    o_nc, s_nc = chunk_gated_delta_rule(**x, backend="native")
    o_c, s_c = chunk_gated_delta_rule(**x, backend="torch")
    o_d, s_d = chunk_gated_delta_rule(**x)  # the default: native, verified by now
    tol = OUT_TOL[dtype]
    torch.testing.assert_close(o_n.float(), o_t.float(), atol=tol, rtol=0)
    torch.testing.assert_close(o_nc.float(), o_c.float(), atol=tol, rtol=0)
    torch.testing.assert_close(o_nc.float(), o_n.float(), atol=tol, rtol=0)
    torch.testing.assert_close(s_n, s_t, atol=1e-4, rtol=1e-4)
    # native chunked: the 16-bit pair for bf16 (its state tolerance), the fp32 pair for fp32
    state_tol = OPERANDS16_STATE_TOLERANCE.get(dtype, 1e-4) * max(1.0, float(s_c.abs().max()))
    torch.testing.assert_close(s_nc, s_c, atol=max(state_tol, 1e-3), rtol=1e-3)
    assert torch.equal(o_d, o_nc) and torch.equal(s_d, s_nc)


@pytest.mark.parametrize(
    "workspace_bytes,dtype,operands16",
    [(64 << 20, torch.bfloat16, False), (1, torch.bfloat16, False),
     (64 << 20, torch.bfloat16, True), (1, torch.bfloat16, True), (64 << 20, torch.float16, True)],
    ids=["64MiB", "1-slot", "16bit-64MiB", "16bit-1-slot", "16bit-fp16"],
)  # fmt: skip
def test_chunk_parallel_matches_the_fused_kernel_at_model_sizes(
    workspace_bytes, dtype, operands16
) -> None:
    """Varlen (0 to 3000 tokens), initial states: the chunk-parallel pairs (fp32, and 16-bit
    on the matrix unit) against the fused 16-token kernel (both native, each checked against
    the reference elsewhere), with the default workspace and with one chunk slot a segment."""
    h, hv, dk, dv = MODEL
    gen = torch.Generator(device=DEV).manual_seed(8)
    lens = [1, 0, 63, 64, 65, 700, 3000]
    total = sum(lens)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=DEV)

    x = dict(
        q=randn(total, h, dk).to(dtype), k=randn(total, h, dk).to(dtype),
        v=randn(total, hv, dv).to(dtype),
        g=-torch.rand(total, hv, generator=gen, device=DEV) * 0.3,
        beta=torch.rand(total, hv, generator=gen, device=DEV).to(dtype),
    )  # fmt: skip
    init = randn(len(lens), hv, dk, dv) * 0.1
    lib = library()
    outs, states = [], []
    for parallel in (False, True):
        out = torch.full((total, hv, dv), float("nan"), dtype=dtype, device=DEV)
        final = torch.full_like(init, float("nan"))
        if parallel:
            launch_chunk_parallel_prefill(lib, **x, lengths=lens, out=out, scale=dk**-0.5,
                                          l2norm=True, initial_state=init, final_state=final,
                                          workspace_bytes=workspace_bytes,
                                          operands16=operands16)  # fmt: skip
        else:
            launch_recurrent_prefill(lib, **x, cu_seqlens=cu.to(DEV), out=out, scale=dk**-0.5,
                                     l2norm=True, initial_state=init, final_state=final,
                                     chunked=True)  # fmt: skip
        outs.append(out)
        states.append(final)
    torch.testing.assert_close(outs[1].float(), outs[0].float(), atol=OUT_TOL[dtype], rtol=0)
    state_tol = OPERANDS16_STATE_TOLERANCE[dtype] if operands16 else 1e-4
    scale = max(1.0, float(states[0].abs().max()))  # the check's metric: relative to the largest
    torch.testing.assert_close(states[1], states[0], atol=state_tol * scale, rtol=0)


def test_native_chunked_prefill_at_32k_matches_torch() -> None:
    """One 32K-token sequence at the model's sizes, bf16: the state after it and the last
    outputs agree with the torch chunked path; the native call's transient device memory
    (above its inputs and outputs) stays under the issue's 64 MiB."""
    h, hv, dk, dv = MODEL
    gen = torch.Generator(device=DEV).manual_seed(7)
    t = 32768

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=DEV)

    x = dict(
        q=randn(1, t, h, dk).bfloat16(), k=randn(1, t, h, dk).bfloat16(),
        v=randn(1, t, hv, dv).bfloat16(),
        g=-torch.rand(1, t, hv, generator=gen, device=DEV) * 0.1,
        beta=torch.rand(1, t, hv, generator=gen, device=DEV).bfloat16(),
        use_qk_l2norm_in_kernel=True, output_final_state=True,
    )  # fmt: skip
    chunk_gated_delta_rule(**x, backend="native")  # loads and verifies first
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    o_n, s_n = chunk_gated_delta_rule(**x, backend="native")
    torch.cuda.synchronize()
    kept = o_n.numel() * o_n.element_size() + s_n.numel() * s_n.element_size()
    transient = torch.cuda.max_memory_allocated() - base - kept
    assert transient <= 64 << 20, transient / 2**20
    o_t, s_t = chunk_gated_delta_rule(**x, backend="torch")
    torch.testing.assert_close(o_n[:, -256:].float(), o_t[:, -256:].float(), atol=3e-2, rtol=0)
    # the default here is the 16-bit pair: its state within bf16's state tolerance of fp32's
    tol = OPERANDS16_STATE_TOLERANCE[torch.bfloat16] * max(1.0, float(s_t.abs().max()))
    torch.testing.assert_close(s_n, s_t, atol=tol, rtol=0)


def test_sizes_the_kernels_do_not_cover_take_torch_or_name_why_when_forced() -> None:
    """K = 96 (no instantiation) and V = 48 (not a multiple of 32): the default serves them on
    the torch path; a forced native call raises naming the size, and writes nothing."""
    gen = torch.Generator(device=DEV).manual_seed(11)
    for dk, dv, why in ((96, 64, "head_k must be one of (64, 128), got 96"),
                        (64, 48, "head_v must be a multiple of 32, got 48")):  # fmt: skip
        q = torch.randn(2, 2, dk, generator=gen, device=DEV)
        x = dict(q=q, k=q.clone(), v=torch.randn(2, 4, dv, generator=gen, device=DEV),
                 g=-torch.rand(2, 4, generator=gen, device=DEV),
                 beta=torch.rand(2, 4, generator=gen, device=DEV),
                 state_indices=torch.tensor([1, 0], device=DEV))  # fmt: skip
        pool = torch.zeros(3, 4, dk, dv, device=DEV)
        with pytest.raises(
            ValueError, match=re.escape(f"cannot serve gated_delta_decode here: {why}")
        ):
            gated_delta_decode(**x, state_pool=pool, backend="native")
        assert not pool.any(), "a refused call wrote the pool"
        got = gated_delta_decode(**x, state_pool=pool)  # the torch path
        want = gated_delta_decode(**x, state_pool=torch.zeros_like(pool), backend="torch")
        torch.testing.assert_close(got, want)


def test_the_16bit_pair_refuses_rows_it_cannot_copy_whole() -> None:
    """q, k and v rows that do not start on 16 bytes (views one element into a wider tensor):
    the library refuses the 16-bit pair by name and writes nothing; the native chunked call
    serves them all the same (on the fp32 pair), matching the torch path."""
    h, hv, dk, dv = 2, 4, 128, 128
    gen = torch.Generator(device=DEV).manual_seed(12)
    t = 300

    def shifted(*shape):  # last dim contiguous, rows 2 bytes off a 16-byte boundary
        return torch.randn(*shape[:-1], shape[-1] + 1, generator=gen, device=DEV).bfloat16()[
            ..., 1:
        ]

    x = dict(q=shifted(t, h, dk), k=shifted(t, h, dk), v=shifted(t, hv, dv),
             g=-torch.rand(t, hv, generator=gen, device=DEV) * 0.3,
             beta=torch.rand(t, hv, generator=gen, device=DEV).bfloat16())  # fmt: skip
    lib = library()
    out = torch.full((t, hv, dv), float("nan"), dtype=torch.bfloat16, device=DEV)
    with pytest.raises(NativeError, match="chunk-parallel prefill16 launch failed"):
        launch_chunk_parallel_prefill(lib, **x, lengths=[t], out=out, scale=dk**-0.5,
                                      l2norm=True, operands16=True)  # fmt: skip
    assert out.isnan().all(), "a refused launch wrote its output"
    batch = {name: value[None] for name, value in x.items()}
    o_n, s_n = chunk_gated_delta_rule(**batch, backend="native", use_qk_l2norm_in_kernel=True,
                                      output_final_state=True)  # fmt: skip
    o_t, s_t = chunk_gated_delta_rule(**batch, backend="torch", use_qk_l2norm_in_kernel=True,
                                      output_final_state=True)  # fmt: skip
    torch.testing.assert_close(o_n.float(), o_t.float(), atol=3e-2, rtol=0)
    torch.testing.assert_close(s_n, s_t, atol=1e-3, rtol=1e-3)
