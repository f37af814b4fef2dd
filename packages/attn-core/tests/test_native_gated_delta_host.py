"""The Gated DeltaNet kernels (csrc/gated_delta.cu) on the CPU, against the float64 reference.

CI has no GPU: ci/host_emulation.py compiles the CoreX configuration of the source for the host
(each block's threads as fibers, shared memory NaN at every block's start), and these tests call
it through attn-core's own binding (:mod:`attn_core.native.gated_delta`) on CPU tensors. They
cover the decode step (every dtype, both head sizes, odd value sizes and GQA groups, l2
normalisation on and off, value heads sharing a block, strided inputs, mixed gate dtypes,
chained steps, NaN-poisoned outputs, a NaN pool whose unnamed slots must keep their bits, the
padding slot -1), the token-by-token and the chunked prefill (empty sequences and lengths
around the 16-token chunk, initial states or none, the final state written in place), and
both convolutions (slots, lengths 0 to 37, prior windows or none, activations, strides, mixed
dtypes). Cases also run with each phase's
threads in reverse order and must give the same bits (a missing barrier would not).

Not covered here: what nvcc or CoreX's compiler make of the source (ci/clang_check.py, the
``cuda`` tests in test_native_gated_delta_cuda.py), races within a warp's lockstep, and time.
"""

from __future__ import annotations

import pytest
import torch
from host_emulation_helpers import both_orders, emulated_gated_delta

from attn_core.native.gated_delta import (
    check_chunk_parallel,
    check_library,
    conv_errors,
    decode_case,
    decode_errors,
    launch_chunk_parallel_prefill,
    launch_conv_prefill,
    launch_conv_update,
    launch_decode,
    launch_recurrent_prefill,
    prefill_errors,
)
from attn_core.native.split import chunk_record_bytes
from attn_core.reference.gated_delta import reference_causal_conv1d, reference_gated_delta

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}
CPU = torch.device("cpu")


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    assert torch.isfinite(got).all(), "NaN/inf: an element was not written"
    got = got.double()
    return float((got - want).abs().max()) / max(1.0, float(want.abs().max()))


# ------------------------------------------------------------------------------- decode step
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "heads,value_heads,head_k,head_v",
    [(2, 4, 128, 128), (1, 3, 64, 96), (3, 3, 128, 32), (2, 12, 64, 64)],
)
@pytest.mark.parametrize("l2norm", [False, True])
def test_decode_step(dtype, heads, value_heads, head_k, head_v, l2norm) -> None:
    lib = emulated_gated_delta()
    scale = 0.7 * head_k**-0.5

    def run():
        case = decode_case(heads, value_heads, head_k, head_v, dtype, CPU, seqs=3, slots=7)
        o, s, same = decode_errors(lib, case, l2norm=l2norm, scale=scale, stream=0)
        assert same, "a slot that was not named changed"
        assert o <= TOL[dtype] and s <= 1e-5, (o, s)
        return (case["state_pool"],)

    both_orders(run)


@pytest.mark.parametrize("block_heads", [2, 3, 6])
def test_value_heads_sharing_a_block_give_the_same_bits(block_heads: int) -> None:
    lib = emulated_gated_delta()
    pools, outs = [], []
    for heads_per_block in (1, block_heads):
        case = decode_case(2, 12, 64, 64, torch.bfloat16, CPU, seed=3)
        out = torch.full((3, 12, 64), float("nan"), dtype=torch.bfloat16)
        launch_decode(lib, case["q"], case["k"], case["v"], case["g"], case["beta"],
                      case["state_pool"], case["state_indices"], out, scale=0.1, l2norm=True,
                      block_heads=heads_per_block, stream=0)  # fmt: skip
        pools.append(case["state_pool"])
        outs.append(out)
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))
    assert torch.equal(pools[0].nan_to_num(7.0), pools[1].nan_to_num(7.0))


def test_strided_inputs_mixed_gate_dtypes_int64_indices() -> None:
    lib = emulated_gated_delta()
    n, h, hv, dk, dv = 4, 2, 4, 128, 64
    gen = torch.Generator().manual_seed(5)
    qk = torch.randn(n, 2, h, dk + 8, generator=gen).to(torch.float16)  # q, k side by side
    q, k = qk[:, 0, :, :dk], qk[:, 1, :, :dk] * 0.2
    v = torch.randn(n, hv, 2 * dv, generator=gen).to(torch.float16)[:, :, :dv]
    g = -torch.rand(hv, n, generator=gen).t()  # fp32, strided
    beta = torch.rand(n, hv, generator=gen).to(torch.bfloat16)
    pool = torch.randn(9, hv, dk, dv, generator=gen) * 0.2
    idx = torch.tensor([8, 1, 5, 0])
    out = torch.full((n, hv, 3 * dv), float("nan"), dtype=torch.float16)[:, :, dv : 2 * dv]
    before = pool.clone()
    launch_decode(lib, q, k, v, g, beta, pool, idx, out, scale=0.09, l2norm=True, stream=0)
    want_o, want_s = reference_gated_delta(
        q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None], scale=0.09,
        initial_state=before[idx], use_qk_l2norm=True,
    )  # fmt: skip
    assert rel_err(out, want_o[:, 0]) <= TOL[torch.float16]
    assert rel_err(pool[idx], want_s) <= 1e-5


def test_chained_steps_match_the_sequence() -> None:
    """Five steps on the pool equal the reference run over five tokens."""
    lib = emulated_gated_delta()
    n, h, hv, dk, dv, t = 2, 1, 2, 64, 32, 5
    gen = torch.Generator().manual_seed(9)
    q = torch.randn(n, t, h, dk, generator=gen)
    k = torch.randn(n, t, h, dk, generator=gen)
    v = torch.randn(n, t, hv, dv, generator=gen)
    g = -torch.rand(n, t, hv, generator=gen)
    beta = torch.rand(n, t, hv, generator=gen)
    pool = torch.full((4, hv, dk, dv), float("nan"))
    idx = torch.tensor([2, 0], dtype=torch.int32)
    pool[idx.long()] = 0.0
    outs = []
    for step in range(t):
        out = torch.empty(n, hv, dv)
        launch_decode(lib, q[:, step], k[:, step], v[:, step], g[:, step], beta[:, step], pool,
                      idx, out, scale=0.125, l2norm=True, stream=0)  # fmt: skip
        outs.append(out)
    want_o, want_s = reference_gated_delta(q, k, v, g, beta, scale=0.125, use_qk_l2norm=True)
    assert rel_err(torch.stack(outs, 1), want_o) <= 1e-5
    assert rel_err(pool[idx.long()], want_s) <= 1e-5
    assert pool[[1, 3]].isnan().all(), "slots not named were written"


@pytest.mark.parametrize("layout", ["key_last", "padded_slots"])
def test_strided_pools_are_updated_in_their_own_layout(layout: str) -> None:
    """A key-last ``[slots, HV, V, K]`` pool seen as ``[slots, HV, K, V]`` (vLLM's later
    layout), and slots padded apart (a serving cache's pages): the same numbers as a contiguous
    pool, and the memory between slots, NaN, keeps its bits."""
    lib = emulated_gated_delta()
    n, h, hv, dk, dv, slots = 3, 2, 4, 128, 64, 6
    case = decode_case(h, hv, dk, dv, torch.bfloat16, CPU, seqs=n, slots=slots, seed=11)
    dense = case["state_pool"]
    if layout == "key_last":
        storage = dense.transpose(-1, -2).contiguous()
        pool = storage.transpose(-1, -2)
    else:
        storage = torch.full((slots, hv * dk * dv + 40), float("nan"))
        storage[:, : hv * dk * dv] = dense.reshape(slots, -1)
        pool = storage[:, : hv * dk * dv].view(slots, hv, dk, dv)
    assert not pool.is_contiguous()
    outs = []
    for target in (dense, pool):
        out = torch.full((n, hv, dv), float("nan"), dtype=torch.bfloat16)
        launch_decode(lib, case["q"], case["k"], case["v"], case["g"], case["beta"], target,
                      case["state_indices"], out, scale=0.1, l2norm=True, stream=0)  # fmt: skip
        outs.append(out)
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))
    assert torch.equal(pool.nan_to_num(5.0), dense.nan_to_num(5.0))
    if layout == "padded_slots":
        assert storage[:, hv * dk * dv :].isnan().all(), "the gap between slots was written"


def test_padding_slot_is_skipped_with_zero_output() -> None:
    """vLLM pads a captured batch with slot -1: the pool is untouched and the output zeros."""
    lib = emulated_gated_delta()
    case = decode_case(2, 4, 128, 64, torch.float32, CPU, seqs=3, slots=5)
    case["state_indices"][1] = -1
    before = case["state_pool"].clone()
    out = torch.full((3, 4, 64), float("nan"))
    launch_decode(lib, case["q"], case["k"], case["v"], case["g"], case["beta"],
                  case["state_pool"], case["state_indices"], out, scale=0.1, l2norm=False,
                  stream=0)  # fmt: skip
    assert (out[1] == 0).all()
    assert torch.isfinite(out).all()
    named = case["state_indices"][[0, 2]].long()
    untouched = torch.ones(5, dtype=torch.bool)
    untouched[named] = False
    assert before[untouched].nan_to_num(3.0).equal(case["state_pool"][untouched].nan_to_num(3.0))


def test_the_verify_once_checks_pass_on_the_host() -> None:
    """The family's check and the chunk-parallel pair's own."""
    lib = emulated_gated_delta()
    for dtype in DTYPES:
        config = (lib.path.name, dtype, 128, 128, 2)
        for check in (check_library, check_chunk_parallel):
            verdict = check(lib, CPU, config, stream=0)
            assert verdict.ok, (check.__name__, verdict.detail)


# ------------------------------------------------------------------------------------- prefill
# Three kernels serve a prefill: token by token, the fused 16-token chunks, and the
# chunk-parallel pair (64-token chunks in segments; a 1-byte workspace forces one chunk slot a
# segment, so every chunk hands its state to the next through the final-state buffer).
METHODS = ["tokens", "chunks", "parallel", "parallel-1-slot"]


def launch_prefill(method, lib, *, cu_seqlens, **kw) -> None:
    if method.startswith("parallel"):
        bounds = cu_seqlens.tolist()
        lengths = [b - a for a, b in zip(bounds, bounds[1:], strict=False)]
        budget = {"workspace_bytes": 1} if method == "parallel-1-slot" else {}
        launch_chunk_parallel_prefill(lib, lengths=lengths, **kw, **budget)
    else:
        launch_recurrent_prefill(lib, cu_seqlens=cu_seqlens, chunked=method == "chunks", **kw)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads,value_heads,head_k,head_v", [(2, 4, 128, 64), (1, 3, 64, 96)])
@pytest.mark.parametrize("l2norm", [False, True])
@pytest.mark.parametrize("method", METHODS[:3])
def test_prefill(dtype, heads, value_heads, head_k, head_v, l2norm, method) -> None:
    """Lengths around both chunk sizes: 0, 1, 15, 16, 17, 33, 64, 65, 129."""
    lib = emulated_gated_delta()
    parallel = method.startswith("parallel")
    lengths = (3, 0, 17, 1, 64, 65, 129) if parallel else (3, 0, 17, 1, 16, 15, 33)
    o, s = prefill_errors(lib, heads, value_heads, head_k, head_v, dtype, CPU, lengths=lengths,
                          l2norm=l2norm, chunked=method == "chunks", parallel=parallel,
                          stream=0)  # fmt: skip
    assert o <= TOL[dtype] and s <= 1e-5, (o, s)


@pytest.mark.parametrize("workspace_bytes", [1, 2 * 1024 * 1024], ids=["1-slot", "4-slots"])
def test_chunk_parallel_segments_carry_the_state(workspace_bytes) -> None:
    """Segments of one and of four chunk slots (records of 4 value heads at K = 128, V = 64:
    0.5 MiB a slot) over sequences of 0 to 3 chunks: the state crosses segment boundaries."""
    lib = emulated_gated_delta()
    o, s = prefill_errors(lib, 2, 4, 128, 64, torch.float32, CPU, lengths=(130, 0, 64, 1, 70),
                          parallel=True, workspace_bytes=workspace_bytes, stream=0)  # fmt: skip
    assert o <= TOL[torch.float32] and s <= 1e-5, (o, s)


def prefill_inputs(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    t, h, hv, dk, dv = sum(lengths), 2, 4, 64, 32
    return dict(
        q=torch.randn(t, h, dk, generator=gen), k=torch.randn(t, h, dk, generator=gen) * 0.3,
        v=torch.randn(t, hv, dv, generator=gen), g=-torch.rand(t, hv, generator=gen),
        beta=torch.rand(t, hv, generator=gen),
    )  # fmt: skip


@pytest.mark.parametrize("method", METHODS)
def test_prefill_in_place_state_without_initial_and_thread_order(method) -> None:
    lib = emulated_gated_delta()
    lengths = (4, 70)
    x = prefill_inputs(lengths)
    cu = torch.tensor([0, 4, 74], dtype=torch.int64)

    def run(initial: bool):
        state = torch.randn(2, 4, 64, 32, generator=torch.Generator().manual_seed(1))
        before = state.clone()
        out = torch.full((74, 4, 32), float("nan"))
        launch_prefill(method, lib, **x, cu_seqlens=cu, out=out, scale=0.2, l2norm=True,
                       initial_state=state if initial else None, final_state=state,
                       stream=0)  # fmt: skip
        return out, state, before

    for initial in (True, False):
        out, state = both_orders(lambda initial=initial: run(initial)[:2], lib)
        before = run(initial)[2]  # the same seeded state the runs started from
        want_o, want_s = reference_gated_delta(
            *(x[n][None] for n in ("q", "k", "v", "g", "beta")), scale=0.2,
            initial_state=before if initial else None, cu_seqlens=cu, use_qk_l2norm=True,
        )  # fmt: skip
        assert rel_err(out, want_o[0]) <= 1e-5
        assert rel_err(state, want_s) <= 1e-5


@pytest.mark.parametrize("method", METHODS[:3])
def test_prefill_reads_strided_inputs(method) -> None:
    lib = emulated_gated_delta()
    x = prefill_inputs((67,), seed=2)
    wide = {n: torch.cat([t, t], dim=-1) for n, t in x.items() if n in ("q", "k", "v")}
    strided = {n: wide[n][..., : x[n].shape[-1]] for n in wide}
    g_t = x["g"].t().contiguous().t()  # column-major gates
    out = torch.full((67, 4, 32), float("nan"))
    cu = torch.tensor([0, 67], dtype=torch.int32)
    launch_prefill(method, lib, **strided, g=g_t, beta=x["beta"], cu_seqlens=cu, out=out,
                   scale=0.3, l2norm=False, stream=0)  # fmt: skip
    want_o, _ = reference_gated_delta(
        *(x[n][None] for n in ("q", "k", "v", "g", "beta")), scale=0.3, cu_seqlens=cu,
    )  # fmt: skip
    assert rel_err(out, want_o[0]) <= 1e-5


# ------------------------------------------------------------------------------ convolutions
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_conv_update_and_prefill_with_states(dtype) -> None:
    lib = emulated_gated_delta()
    worst = both_orders(lambda: (torch.tensor([conv_errors(lib, dtype, CPU, stream=0)]),))[0]
    assert float(worst) <= TOL[dtype] * 2


@pytest.mark.parametrize("tokens", [1, 3])
@pytest.mark.parametrize("activation", [None, "silu"])
def test_conv_update_without_indices_or_bias(tokens, activation) -> None:
    lib = emulated_gated_delta()
    gen = torch.Generator().manual_seed(tokens)
    n, dim = 3, 130
    x = torch.randn(n, dim, tokens, generator=gen).to(torch.bfloat16)
    state = torch.randn(n, dim, 5, generator=gen)  # fp32 state, bf16 inputs; 5 > W - 1
    weight = torch.randn(dim, 4, generator=gen)
    before = state.clone()
    out = torch.full_like(x, float("nan"))
    launch_conv_update(lib, x, state, weight, None, None, out, silu=activation is not None,
                       stream=0)  # fmt: skip
    for i in range(n):
        want, window = reference_causal_conv1d(x[i], weight, None, before[i, :, :3], activation)
        assert rel_err(out[i], want) <= TOL[torch.bfloat16]
        assert rel_err(state[i, :, :3], window) <= 1e-6
    assert torch.equal(state[:, :, 3:], before[:, :, 3:]), "positions past W - 1 were written"


def test_conv_prefill_without_states_contiguous_x() -> None:
    lib = emulated_gated_delta()
    gen = torch.Generator().manual_seed(4)
    dim, lens = 70, [5, 0, 17, 2]
    total = sum(lens)
    x = torch.randn(dim, total, generator=gen).to(torch.float16)  # contiguous [dim, total]
    weight = torch.randn(dim, 4, generator=gen).to(torch.float16)
    bias = torch.randn(dim, generator=gen)
    qsl = torch.tensor([0, 5, 5, 22, 24], dtype=torch.int64)
    out = torch.full_like(x, float("nan"))
    launch_conv_prefill(lib, x, qsl, weight, bias, None, None, None, out, silu=True, stream=0)
    for i, length in enumerate(lens):
        a = int(qsl[i])
        if length:
            want, _ = reference_causal_conv1d(x[:, a : a + length], weight, bias, None, "silu")
            assert rel_err(out[:, a : a + length], want) <= TOL[torch.float16]


def test_conv_prefill_skips_a_padding_slot() -> None:
    """A negative slot (vLLM's padding, what causal_conv1d_fn passes for ``pad_slot_id``): the
    kernels neither read its window, though ``has_initial_state`` says so, nor write one."""
    lib = emulated_gated_delta()
    gen = torch.Generator().manual_seed(9)
    dim, lens = 66, [4, 6, 2]
    x = torch.randn(dim, sum(lens), generator=gen)
    weight = torch.randn(dim, 4, generator=gen)
    states = torch.randn(3, dim, 3, generator=gen)
    before = states.clone()
    qsl = torch.tensor([0, 4, 10, 12], dtype=torch.int32)
    slots = torch.tensor([2, -1, 0], dtype=torch.int32)
    has = torch.tensor([True, True, True])
    out = torch.full_like(x, float("nan"))
    launch_conv_prefill(lib, x, qsl, weight, None, states, slots, has, out, silu=False, stream=0)
    for i in (0, 2):
        a, s = int(qsl[i]), int(slots[i])
        want, window = reference_causal_conv1d(x[:, a : a + lens[i]], weight, None, before[s])
        assert rel_err(out[:, a : a + lens[i]], want) <= 1e-5
        assert rel_err(states[s], window) <= 1e-6
    assert torch.equal(states[1], before[1]), "the unnamed slot was written"
    assert torch.isfinite(out[:, 4:10]).all()


@pytest.mark.parametrize("head_k,head_v", [(64, 32), (128, 128), (128, 96)])
def test_record_size_is_the_one_the_plan_prices(head_k, head_v) -> None:
    assert emulated_gated_delta().chunk_record_floats(head_k, head_v) * 4 == chunk_record_bytes(
        head_k, head_v
    )
