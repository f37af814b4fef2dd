"""Recurrent states in the serving stack's layout: vLLM's key-last ``[.., V, K]`` states served
transposed (never read as key-major), an unknown layout never served, the setting that states
it, and vLLM's fused sigmoid-gating decode against the float64 reference."""

import sys

import ep_helpers
import fake_linear
import pytest
import torch
from fake_linear import FLA, SHAPES, VLLM_FLA, OriginalCalled

import attn_core
from attn_core.reference.gated_delta import reference_gated_delta, reference_gates
from engine_patch import linear_ops, settings, state_layout
from engine_patch.platform import PLATFORM_ENV, detect_platform
from engine_patch.state import STATE
from engine_patch.triton_guard import TritonRefusedError

clean_state = pytest.fixture(ep_helpers.clean_state)
fakes = pytest.fixture(fake_linear.loaded)
TOL = {"atol": 1e-4, "rtol": 1e-4}
SIGMOID = f"{VLLM_FLA}.fused_sigmoid_gating_delta_rule_update"


def _key_last(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, SHAPES, fake_linear.shape_rule(key_last=True))


def _flip(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(-1, -2).contiguous()


def test_the_layout_is_read_from_vllms_shape_rule(fakes, monkeypatch):
    assert state_layout.layout_for(VLLM_FLA) == ("kv", "vLLM's state shape is (HV, K, V)")
    _key_last(monkeypatch)
    assert state_layout.layout_for(VLLM_FLA)[0] == "vk"
    assert state_layout.layout_for(FLA)[0] == "kv"  # FLA itself: key-major by definition
    monkeypatch.delitem(sys.modules, SHAPES)
    layout, why = state_layout.layout_for(VLLM_FLA)
    assert layout is None and "not loaded" in why
    monkeypatch.setenv(settings.STATE_LAYOUT_ENV, "vk")
    assert state_layout.layout_for(VLLM_FLA) == ("vk", f"{settings.STATE_LAYOUT_ENV}=vk")


def test_a_shape_rule_that_answers_neither_way_is_unknown(fakes, monkeypatch):
    rule = fake_linear.shape_rule(key_last=False)
    rule.MambaStateShapeCalculator.gated_delta_net_state_shape = classmethod(
        lambda cls, **kw: ((3, 7), (1, 6))
    )
    monkeypatch.setitem(sys.modules, SHAPES, rule)
    layout, why = state_layout.vllm_layout()
    assert layout is None and "(1, 6)" in why
    rule.MambaStateShapeCalculator.gated_delta_net_state_shape = classmethod(lambda cls, x: x)
    assert state_layout.vllm_layout()[0] is None


def test_key_last_prefill_states_are_served_transposed(fakes, monkeypatch):
    _key_last(monkeypatch)
    linear_ops.install()
    assert "states vk" in STATE.linear_ops[f"{VLLM_FLA}.chunk_gated_delta_rule"].reason
    q, k, v, g, beta, state = fake_linear.inputs(dk=8, dv=6)
    want_o, want_s = reference_gated_delta(q, k, v, g, beta, 0.3, state)
    o, final = fakes[VLLM_FLA].chunk_gated_delta_rule(q, k, v, g, beta, 0.3, _flip(state), True)
    assert final.shape == (2, 4, 6, 8) and final.is_contiguous()
    torch.testing.assert_close(o.double(), want_o, **TOL)
    torch.testing.assert_close(final.double(), want_s.transpose(-1, -2), **TOL)


def test_key_last_decode_pool_is_updated_in_its_own_layout(fakes, monkeypatch):
    _key_last(monkeypatch)
    linear_ops.install()
    q, k, v, g, beta, pool, slots, cu = fake_linear.decode_batch(dk=8, dv=6)
    stack_pool = _flip(pool)  # [slots, HV, V, K], as a key-last vLLM allocates it
    want = attn_core.gated_delta_decode(q[0], k[0], v[0], g[0], beta[0], pool, slots)
    fn = fakes[VLLM_FLA].fused_recurrent_gated_delta_rule
    o, final = fn(q, k, v, g, beta, initial_state=stack_pool, cu_seqlens=cu,
                  ssm_state_indices=slots)  # fmt: skip
    assert final is stack_pool
    torch.testing.assert_close(o[0], want, **TOL)
    torch.testing.assert_close(stack_pool, _flip(pool), **TOL)


@pytest.mark.parametrize("platform", ["generic", "iluvatar"])
def test_an_unknown_layout_is_never_guessed(fakes, monkeypatch, platform):
    monkeypatch.delitem(sys.modules, SHAPES)
    monkeypatch.setenv(PLATFORM_ENV, platform)
    STATE.platform = detect_platform()
    linear_ops.install()
    q, k, v, g, beta, state = fake_linear.inputs()
    chunk = fakes[VLLM_FLA].chunk_gated_delta_rule
    error = OriginalCalled if platform == "generic" else TritonRefusedError
    with pytest.raises(error) as info:
        chunk(q, k, v, g, beta, initial_state=state)
    if platform == "iluvatar":
        assert "layout is unknown" in str(info.value)
        assert f"{settings.STATE_LAYOUT_ENV}=kv or vk" in str(info.value)
    with pytest.raises(error):
        chunk(q, k, v, g, beta, output_final_state=True)
    # no state in or out: the layout does not matter, the call is served
    o, final = chunk(q, k, v, g, beta)
    assert final is None
    torch.testing.assert_close(o.double(), reference_gated_delta(q, k, v, g, beta)[0], **TOL)
    # the rule loaded later (vLLM loads it before the first decode step) is read then
    _key_last(monkeypatch)
    o, final = chunk(q, k, v, g, beta, initial_state=_flip(state), output_final_state=True)
    want_o, want_s = reference_gated_delta(q, k, v, g, beta, initial_state=state)
    torch.testing.assert_close(final.double(), want_s.transpose(-1, -2), **TOL)


def test_the_setting_overrides_detection(fakes, monkeypatch):
    monkeypatch.setenv(settings.STATE_LAYOUT_ENV, "vk")  # the fake rule says key-major
    linear_ops.install()
    q, k, v, g, beta, state = fake_linear.inputs()
    _, final = fakes[VLLM_FLA].chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=_flip(state), output_final_state=True
    )
    want_s = reference_gated_delta(q, k, v, g, beta, initial_state=state)[1]
    torch.testing.assert_close(final.double(), want_s.transpose(-1, -2), **TOL)
    with pytest.raises(ValueError, match="ENGINE_PATCH_LINEAR_STATE_LAYOUT must be one of kv, vk"):
        settings.linear_state_layout({settings.STATE_LAYOUT_ENV: "k-major"})


@pytest.mark.parametrize("key_last", [False, True])
def test_vllm_sigmoid_gating_decode_matches_the_reference(fakes, monkeypatch, key_last):
    """The fused kernel's gates (fp32 beta) then one recurrent step per sequence, in place."""
    if key_last:
        _key_last(monkeypatch)
    linear_ops.install()
    assert STATE.linear_ops[SIGMOID].serves == linear_ops.SERVED
    q, k, v, _, _, pool, slots, cu = fake_linear.decode_batch(dk=8, dv=6)
    gen = torch.Generator().manual_seed(5)
    a_log, dt_bias = torch.randn(4, generator=gen), torch.randn(4, generator=gen)
    a, b = torch.randn(3, 4, generator=gen), torch.randn(3, 4, generator=gen)
    g, beta = reference_gates(a_log, a, dt_bias, b, softplus_beta=1.5, softplus_threshold=3.0)
    want_o, want_s = [], []
    for i, slot in enumerate(slots.tolist()):
        o, s = reference_gated_delta(
            q[:, i : i + 1], k[:, i : i + 1], v[:, i : i + 1], g[None, i : i + 1],
            beta[None, i : i + 1], 0.4, pool[slot : slot + 1], use_qk_l2norm=True,
        )  # fmt: skip
        want_o.append(o[0, 0])
        want_s.append(s[0])
    stack_pool = _flip(pool) if key_last else pool.clone()
    fn = fakes[VLLM_FLA].fused_sigmoid_gating_delta_rule_update
    o, final = fn(a_log, a, b, dt_bias, q, k, v, beta=1.5, threshold=3.0, scale=0.4,
                  initial_state=stack_pool, cu_seqlens=cu, ssm_state_indices=slots,
                  use_qk_l2norm_in_kernel=True)  # fmt: skip
    assert final is stack_pool and o.shape == v.shape
    torch.testing.assert_close(o[0].double(), torch.stack(want_o), **TOL)
    got = _flip(stack_pool) if key_last else stack_pool
    torch.testing.assert_close(got[slots].double(), torch.stack(want_s), **TOL)
    untouched = [i for i in range(pool.shape[0]) if i not in slots.tolist()]
    assert torch.equal(got[untouched], pool[untouched])
    with pytest.raises(OriginalCalled):  # per-key gates (KDA) are not this rule
        fn(a_log, a, b, dt_bias, q, k, v, initial_state=stack_pool, cu_seqlens=cu,
           ssm_state_indices=slots, is_kda=True)  # fmt: skip


def test_sigmoid_gating_off_a_decode_batch_runs_the_original_without_the_gates(fakes, monkeypatch):
    """Three tokens of one sequence are not a decode batch: the original kernel runs and
    attn-core computes no gates for a call it then does not serve."""
    linear_ops.install()
    q, k, v, _, _, pool, slots, _ = fake_linear.decode_batch(dk=8, dv=6)
    gates = []
    monkeypatch.setattr(attn_core, "gated_delta_gates", lambda **kw: gates.append(kw))
    a_log, dt_bias = torch.zeros(4), torch.zeros(4)
    a, b = torch.zeros(3, 4), torch.zeros(3, 4)
    fn = fakes[VLLM_FLA].fused_sigmoid_gating_delta_rule_update
    with pytest.raises(OriginalCalled):
        fn(a_log, a, b, dt_bias, q, k, v, initial_state=pool, cu_seqlens=torch.tensor([0, 3]),
           ssm_state_indices=slots[:1])  # fmt: skip
    assert gates == []
