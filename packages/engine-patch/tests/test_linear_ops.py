"""Linear-attention ops: which targets are replaced, the adapters' numbers against attn-core's
float64 reference, idempotence, the Iluvatar refusal, ENGINE_PATCH_LINEAR_OPS, status."""

import sys
import types

import ep_helpers
import fake_linear
import pytest
import torch
from fake_linear import (
    CONV,
    FLA,
    FLA_NEW,
    FLA_RECURRENT,
    GDN,
    HF,
    HF35,
    HOLDER,
    VLLM_FLA,
    OriginalCalled,
)

import attn_core
from attn_core.core.shapes import AttentionShape
from attn_core.reference.gated_delta import (
    reference_causal_conv1d,
    reference_gated_delta,
    reference_gates,
)
from engine_patch import cli, linear_ops, settings
from engine_patch.exit_codes import EXIT_CONFIG, ConfigurationError
from engine_patch.invocation import model_layer_plan
from engine_patch.layer_plan import layer_plan, ranges
from engine_patch.platform import PLATFORM_ENV, detect_platform
from engine_patch.state import MARK, STATE
from engine_patch.status import collect, render
from engine_patch.triton_guard import TritonRefusedError

clean_state = pytest.fixture(ep_helpers.clean_state)
TOL = {"atol": 1e-4, "rtol": 1e-4}
SERVED = {
    f"{HF35}.torch_chunk_gated_delta_rule",
    f"{FLA_NEW}.chunk_gated_delta_rule",
    f"{FLA}.chunk_gated_delta_rule",
    f"{FLA}.fused_recurrent_gated_delta_rule",
    f"{VLLM_FLA}.chunk_gated_delta_rule",
    f"{VLLM_FLA}.fused_recurrent_gated_delta_rule",
    f"{VLLM_FLA}.fused_sigmoid_gating_delta_rule_update",
    f"{CONV}.causal_conv1d_fn",
    f"{CONV}.causal_conv1d_update",
    f"{HF}.torch_chunk_gated_delta_rule",
    f"{HF}.torch_recurrent_gated_delta_rule",
    f"{HOLDER}.fused_gdn_gating",
    f"{GDN}.fused_gdn_gating",
}
UNMATCHED = {f"{FLA_RECURRENT}.fused_recurrent_gated_delta_rule"}


fakes = pytest.fixture(fake_linear.loaded)
_inputs = fake_linear.inputs


def test_patching_replaces_exactly_the_matched_targets(fakes):
    originals = {n: dict(vars(m)) for n, m in fakes.items()}
    linear_ops.install()
    assert set(STATE.linear_ops) == SERVED | UNMATCHED
    for target, op in STATE.linear_ops.items():
        module, attr = target.rsplit(".", 1)
        live = getattr(fakes[module], attr)
        if target in SERVED:
            assert op.serves == linear_ops.SERVED and getattr(live, MARK, None), target
        else:
            assert op.serves == linear_ops.UNMATCHED and live is originals[module][attr], target
            assert "no counterpart" in op.reason
    # the model module that imported vLLM's chunk function by name runs attn-core too
    held = fakes[HOLDER].chunk_gated_delta_rule
    assert getattr(held, MARK, None) and held is not originals[HOLDER]["chunk_gated_delta_rule"]
    assert STATE.linear_ops[f"{VLLM_FLA}.chunk_gated_delta_rule"].holders == (
        f"{HOLDER}.chunk_gated_delta_rule",
    )
    assert (
        "unknown_switch"
        in STATE.linear_ops[f"{FLA_RECURRENT}.fused_recurrent_gated_delta_rule"].reason
    )
    assert STATE.linear_ops[f"{FLA}.chunk_gated_delta_rule"].triton
    assert not STATE.linear_ops[f"{HF}.torch_chunk_gated_delta_rule"].triton


def test_install_twice_is_harmless(fakes):
    linear_ops.install()
    first = {t: getattr(fakes[t.rsplit(".", 1)[0]], t.rsplit(".", 1)[1]) for t in SERVED}
    linear_ops.install()
    linear_ops.install()
    again = {t: getattr(fakes[t.rsplit(".", 1)[0]], t.rsplit(".", 1)[1]) for t in SERVED}
    assert first == again
    assert sum(isinstance(f, linear_ops._Finder) for f in sys.meta_path) == 1


@pytest.mark.parametrize("l2", [False, True])
def test_fla_chunk_and_recurrent_match_the_reference(fakes, l2):
    linear_ops.install()
    q, k, v, g, beta, state = _inputs()
    want_o, want_s = reference_gated_delta(q, k, v, g, beta, 0.3, state, use_qk_l2norm=l2)
    fla = fakes[FLA]
    for fn in (fla.chunk_gated_delta_rule, fla.fused_recurrent_gated_delta_rule):
        o, s = fn(q, k, v, g, beta, 0.3, state, True, use_qk_l2norm_in_kernel=l2)
        torch.testing.assert_close(o.double(), want_o, **TOL)
        torch.testing.assert_close(s.double(), want_s, **TOL)


def test_fla_head_first_and_varlen(fakes):
    linear_ops.install()
    q, k, v, g, beta, _ = _inputs(b=1, t=7)
    cu = torch.tensor([0, 3, 7])
    want_o, want_s = reference_gated_delta(q, k, v, g, beta, cu_seqlens=cu)
    chunk = fakes[VLLM_FLA].chunk_gated_delta_rule
    o, s = chunk(q, k, v, g, beta, output_final_state=True, cu_seqlens=cu)
    torch.testing.assert_close(o.double(), want_o, **TOL)
    torch.testing.assert_close(s.double(), want_s, **TOL)
    heads = [x.transpose(1, 2) for x in (q, k, v, g, beta)]
    o, s = fakes[FLA].chunk_gated_delta_rule(*heads, head_first=True, output_final_state=True,
                                             cu_seqlens=cu)  # fmt: skip
    torch.testing.assert_close(o.transpose(1, 2).double(), want_o, **TOL)


@pytest.mark.parametrize("platform", ["generic", "iluvatar"])
def test_a_switch_attn_core_does_not_serve_goes_back_to_the_original(fakes, monkeypatch, platform):
    monkeypatch.setenv(PLATFORM_ENV, platform)
    STATE.platform = detect_platform()
    linear_ops.install()
    q, k, v, g, beta, state = _inputs()
    chunk = fakes[FLA_NEW].chunk_gated_delta_rule
    o, _ = chunk(q, k, v, g, beta, state_v_first=False, cu_seqlens_cpu=None)
    torch.testing.assert_close(o.double(), reference_gated_delta(q, k, v, g, beta)[0], **TOL)
    error = OriginalCalled if platform == "generic" else TritonRefusedError
    with pytest.raises(error):
        chunk(q, k, v, g, beta, allow_neg_eigval=True)


def test_transformers_conventions_match_the_reference(fakes):
    linear_ops.install()
    q, k, v, g, beta, state = _inputs(h=4, hv=4)
    want_o, want_s = reference_gated_delta(q, k, v, g, beta, None, state, use_qk_l2norm=True)
    hf = fakes[HF]
    o, s = hf.torch_chunk_gated_delta_rule(
        q, k, v, g, beta, chunk_size=64, initial_state=state.half(), output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    want_half, _ = reference_gated_delta(q, k, v, g, beta, None, state.half(), use_qk_l2norm=True)
    torch.testing.assert_close(o.double(), want_half, **TOL)
    o, s = hf.torch_recurrent_gated_delta_rule(q, k, v, g, beta, state, True, True)
    torch.testing.assert_close(o.double(), want_o, **TOL)
    torch.testing.assert_close(s.double(), want_s, **TOL)
    o, s = hf.torch_recurrent_gated_delta_rule(q, k, v, g, beta, None, False)
    assert s is None


def test_keyword_catch_all_is_served_until_a_call_uses_it(fakes):
    linear_ops.install()
    q, k, v, g, beta, _ = _inputs(h=4, hv=4)
    chunk = fakes[HF35].torch_chunk_gated_delta_rule
    o, _ = chunk(q, k, v, g, beta)
    torch.testing.assert_close(o.double(), reference_gated_delta(q, k, v, g, beta)[0], **TOL)
    with pytest.raises(OriginalCalled):
        chunk(q, k, v, g, beta, cu_seqlens=None)


def test_vllm_conv_prefill_with_padding_matches_the_reference(fakes):
    """vLLM's causal_conv1d_fn, current signature: x ``[dim, tokens]``, a padding entry
    (PAD_SLOT_ID) neither reads nor writes a slot; its prefix-caching inputs run the original."""
    linear_ops.install()
    gen = torch.Generator().manual_seed(2)
    dim, width, lens = 6, 4, [3, 2, 4]
    x = torch.randn(dim, sum(lens), generator=gen)
    weight = torch.randn(dim, width, generator=gen)
    bias = torch.randn(dim, generator=gen)
    pool = torch.randn(4, dim, width - 1, generator=gen)
    before = pool.clone()
    qsl = torch.tensor([0, 3, 5, 9], dtype=torch.int32)
    idx = torch.tensor([3, -1, 0], dtype=torch.int32)
    has = torch.tensor([True, True, False])
    conv_fn = fakes[CONV].causal_conv1d_fn
    out = conv_fn(x, weight, bias, pool, qsl, idx, has, metadata=object(), validate_data=True)
    for i, (a, n) in enumerate(zip(qsl.tolist()[:-1], lens, strict=True)):
        if idx[i] < 0:
            assert torch.equal(out[:, a : a + n], torch.zeros(dim, n))
            continue
        window = before[idx[i]] if has[i] else None
        want, new = reference_causal_conv1d(x[:, a : a + n], weight, bias, window, "silu")
        torch.testing.assert_close(out[:, a : a + n].double(), want, **TOL)
        torch.testing.assert_close(pool[idx[i]].double(), new, **TOL)
    assert torch.equal(pool[[1, 2]], before[[1, 2]])
    with pytest.raises(OriginalCalled):
        conv_fn(x, weight, bias, pool, qsl, idx, has, num_computed_tokens=qsl[1:])


def test_vllm_gate_kernels_match_the_reference(fakes):
    """vLLM's fused_gdn_gating: ``(g, beta)`` with a leading axis of 1 where it takes ``b``,
    ``g`` alone where it does not; softplus's ``beta`` / ``threshold`` passed through."""
    linear_ops.install()
    gen = torch.Generator().manual_seed(3)
    a_log, dt_bias = torch.randn(8, generator=gen), torch.randn(8, generator=gen)
    a = torch.randn(5, 8, generator=gen).to(torch.bfloat16) * 10
    b = torch.randn(5, 8, generator=gen).to(torch.bfloat16)
    g, beta = fakes[HOLDER].fused_gdn_gating(a_log, a, b, dt_bias, threshold=4.0)
    want_g, want_beta = reference_gates(a_log, a, dt_bias, b, softplus_threshold=4.0)
    assert g.shape == beta.shape == (1, 5, 8) and g.dtype == torch.float32
    assert beta.dtype == torch.bfloat16
    torch.testing.assert_close(g[0].double(), want_g, **TOL)
    torch.testing.assert_close(beta[0].double(), want_beta, atol=8e-3, rtol=8e-3)
    only_g = fakes[GDN].fused_gdn_gating(a_log, a, dt_bias, 2.0)
    want_g, _ = reference_gates(a_log, a, dt_bias, softplus_beta=2.0)
    assert only_g.shape == (5, 8)
    torch.testing.assert_close(only_g.double(), want_g, **TOL)


def test_conv_update_matches_the_reference(fakes):
    linear_ops.install()
    gen = torch.Generator().manual_seed(1)
    dim, width, slots = 6, 4, 3
    x = torch.randn(2, dim, generator=gen)
    weight = torch.randn(dim, width, generator=gen)
    bias = torch.randn(dim, generator=gen)
    pool = torch.randn(slots, dim, width - 1, generator=gen)
    idx = torch.tensor([2, 0])
    want = [reference_causal_conv1d(x[i, :, None], weight, bias, pool[s], "silu")
            for i, s in enumerate(idx.tolist())]  # fmt: skip
    update = fakes[CONV].causal_conv1d_update
    out = update(x, pool, weight, bias, True, idx, validate_data=True)
    for i, s in enumerate(idx.tolist()):
        torch.testing.assert_close(out[i].double(), want[i][0][:, 0], **TOL)
        torch.testing.assert_close(pool[s].double(), want[i][1], **TOL)
    with pytest.raises(OriginalCalled):  # speculative decoding: not served
        update(x, pool, weight, bias, True, idx, num_accepted_tokens=torch.tensor([1, 1]))


def test_iluvatar_refuses_an_unmatched_triton_target(fakes, monkeypatch):
    monkeypatch.setenv(PLATFORM_ENV, "iluvatar")
    STATE.platform = detect_platform()
    linear_ops.install()
    for target in UNMATCHED:
        module, attr = target.rsplit(".", 1)
        assert STATE.linear_ops[target].serves == linear_ops.REFUSED
        with pytest.raises(TritonRefusedError, match="unknown_switch"):
            getattr(fakes[module], attr)()
    untouched = [o for o in STATE.linear_ops.values() if o.triton and o.serves == "untouched"]
    assert untouched == []


def _packed_module(name: str):
    """A later release's module: a Triton decode entry point no target lists, a torch helper
    and a private kernel wrapper."""
    source = (
        "import types\n"
        "triton = types.ModuleType('triton')\n"
        "def fused_recurrent_gated_delta_rule_packed_decode(mixed_qkv, a, b):\n"
        "    raise AssertionError('the Triton kernel ran')\n"
        "def prepare_lens(cu_seqlens):\n"
        "    return cu_seqlens[1:] - cu_seqlens[:-1]\n"
        "def _delta_rule_launch(x):\n"
        "    return x\n"
    )
    module = types.ModuleType(name)
    exec(compile(source, name, "exec"), vars(module))
    for fn in (module.fused_recurrent_gated_delta_rule_packed_decode, module.prepare_lens,
               module._delta_rule_launch):  # fmt: skip
        fn.__module__ = name
    return module


@pytest.mark.parametrize("platform", ["generic", "iluvatar"])
def test_unlisted_triton_entry_points_of_the_family_are_refused_on_iluvatar(
    fakes, monkeypatch, platform
):
    monkeypatch.setenv(PLATFORM_ENV, platform)
    STATE.platform = detect_platform()
    name = f"{VLLM_FLA}.packed_decode"
    packed = _packed_module(name)
    monkeypatch.setitem(sys.modules, name, packed)
    holder = fakes[HOLDER]
    monkeypatch.setattr(holder, "packed", packed.fused_recurrent_gated_delta_rule_packed_decode,
                        raising=False)  # fmt: skip
    linear_ops.install()
    target = f"{name}.fused_recurrent_gated_delta_rule_packed_decode"
    cu = torch.tensor([0, 2, 5])
    assert torch.equal(packed.prepare_lens(cu), torch.tensor([2, 3]))  # a torch helper: kept
    assert packed._delta_rule_launch(3) == 3  # private: not an entry point
    if platform == "generic":
        assert target not in STATE.linear_ops
        with pytest.raises(AssertionError, match="the Triton kernel ran"):
            packed.fused_recurrent_gated_delta_rule_packed_decode(None, None, None)
        return
    op = STATE.linear_ops[target]
    assert op.serves == linear_ops.REFUSED and op.holders == (f"{HOLDER}.packed",)
    for fn in (packed.fused_recurrent_gated_delta_rule_packed_decode, holder.packed):
        with pytest.raises(TritonRefusedError, match="packed_decode.*no attn-core convention"):
            fn(None, None, None)


def test_an_unlisted_module_imported_later_is_guarded_on_iluvatar(fakes, monkeypatch, tmp_path):
    monkeypatch.setenv(PLATFORM_ENV, "iluvatar")
    STATE.platform = detect_platform()
    package = tmp_path / "fla" / "ops"
    package.mkdir(parents=True)
    (tmp_path / "fla" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "kda.py").write_text(
        "import types\ntriton = types.ModuleType('triton')\n"
        "def chunk_kda_delta_rule(q):\n    raise AssertionError('the Triton kernel ran')\n"
    )
    for mod in ("fla", "fla.ops", "fla.ops.kda"):
        monkeypatch.delitem(sys.modules, mod, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    linear_ops.install()
    import fla.ops.kda

    with pytest.raises(TritonRefusedError, match="chunk_kda_delta_rule"):
        fla.ops.kda.chunk_kda_delta_rule(None)


def test_a_target_imported_later_is_patched(fakes, monkeypatch, tmp_path):
    (tmp_path / "eplinear_late_mod.py").write_text(
        "def chunk(q, k, v, g, beta, scale=None):\n    raise AssertionError('original')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(settings.LINEAR_OPS_ENV, "eplinear_late_mod:chunk=chunk_gated_delta_rule")
    monkeypatch.delitem(sys.modules, "eplinear_late_mod", raising=False)
    linear_ops.install()
    import eplinear_late_mod

    monkeypatch.setitem(sys.modules, "eplinear_late_mod", eplinear_late_mod)
    q, k, v, g, beta, _ = _inputs()
    o, _ = eplinear_late_mod.chunk(q, k, v, g, beta)
    torch.testing.assert_close(o.double(), reference_gated_delta(q, k, v, g, beta)[0], **TOL)
    assert STATE.linear_ops["eplinear_late_mod.chunk"].serves == linear_ops.SERVED


@pytest.mark.parametrize(
    "value, words",
    [
        ("fla.ops:chunk", "convention of fla.ops:chunk must be one of"),
        ("fla.ops:chunk=flash", "got 'flash'"),
        ("fla ops:chunk=chunk_gated_delta_rule", "module:attribute=convention"),
        ("fla.ops=chunk_gated_delta_rule", "module:attribute=convention"),
        (",".join(["a:b=causal_conv1d_fn"] * 65), "at most 64"),
    ],
)
def test_bad_linear_ops_setting_is_a_named_error(value, words, capsys):
    with pytest.raises(ValueError, match="ENGINE_PATCH_LINEAR_OPS") as info:
        settings.linear_ops_extra({settings.LINEAR_OPS_ENV: value})
    assert words in str(info.value)


def test_bad_linear_ops_setting_exits_2(monkeypatch, capsys):
    monkeypatch.setenv(settings.LINEAR_OPS_ENV, "fla.ops:chunk=nope")
    assert cli.main(["status", "--no-self-test", "--device", "cpu"]) == EXIT_CONFIG
    assert "ENGINE_PATCH_LINEAR_OPS" in capsys.readouterr().err


def test_layer_plan_from_defaults_and_configs():
    plan = layer_plan()
    assert plan["num_layers"] == 40 and plan["full"] == list(range(3, 40, 4))
    flat = layer_plan({"num_hidden_layers": 6, "full_attention_interval": 3}, "x")
    assert flat["linear"] == [0, 1, 3, 4] and flat["full"] == [2, 5]
    kinds = ["linear_attention", "full_attention"]
    nested = layer_plan({"text_config": {"layer_types": kinds}})
    assert nested["linear"] == [0] and nested["full"] == [1]
    assert layer_plan({"num_hidden_layers": 3})["linear"] == []  # not a hybrid model
    assert ranges([0, 1, 2, 4]) == "0-2,4"
    with pytest.raises(ValueError, match="num_hidden_layers"):
        layer_plan({"num_hidden_layers": 10**10})
    with pytest.raises(ValueError, match="layer_types entries"):
        layer_plan({"layer_types": ["mamba"], "num_hidden_layers": 1})


def test_status_lists_the_linear_ops_and_the_layer_plan(fakes):
    shape = AttentionShape(num_heads=8, num_kv_heads=2, head_size=64, block_size=16,
                           dtype=torch.float32)  # fmt: skip
    report = collect(shape, torch.device("cpu"), self_test=False, contexts=(1024,))
    rows = {r["op"]: r for r in report["linear_ops"]}
    assert set(rows) == SERVED | UNMATCHED
    assert rows[f"{FLA}.chunk_gated_delta_rule"]["serves"] == "torch"
    assert "native_gated_delta" in rows[f"{FLA}.chunk_gated_delta_rule"]["verdict"]
    assert rows[f"{FLA_RECURRENT}.fused_recurrent_gated_delta_rule"]["serves"] == "untouched"
    assert report["layer_plan"]["num_layers"] == 40
    text = render(report)
    assert "linear-attention ops found" in text and "layer plan" in text
    assert f"{CONV}.causal_conv1d_fn" in text and f"{FLA_RECURRENT}" in text


def test_model_layer_plan_reads_the_checkpoint_config(tmp_path):
    plan = model_layer_plan(str(ep_helpers.DATA / "qwen3_5_moe"))
    assert plan["num_layers"] == len(plan["linear"]) + len(plan["full"]) >= 1
    (tmp_path / "config.json").write_text('{"text_config": {"num_hidden_layers": 0}}')
    with pytest.raises(ConfigurationError, match="num_hidden_layers"):
        model_layer_plan(str(tmp_path))


_vllm_decode_batch = fake_linear.decode_batch


def test_vllm_recurrent_decode_batch_runs_attn_core_decode(fakes):
    linear_ops.install()
    fn = fakes[VLLM_FLA].fused_recurrent_gated_delta_rule
    q, k, v, g, beta, pool, slots, cu = _vllm_decode_batch()
    want_pool = pool.clone()
    want = attn_core.gated_delta_decode(q[0], k[0], v[0], g[0], beta[0], want_pool, slots,
                                        use_qk_l2norm_in_kernel=True)  # fmt: skip
    o, final = fn(q, k, v, g, beta, initial_state=pool, inplace_final_state=True,
                  cu_seqlens=cu, ssm_state_indices=slots, use_qk_l2norm_in_kernel=True)  # fmt: skip
    assert final is pool and o.shape == (1, 3, 4, 8)
    torch.testing.assert_close(o[0], want, **TOL)
    torch.testing.assert_close(pool, want_pool, **TOL)
    # the same batch as B sequences of one token, no cu_seqlens
    o2, _ = fn(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), g.transpose(0, 1),
               beta.transpose(0, 1), initial_state=pool.clone(), ssm_state_indices=slots,
               use_qk_l2norm_in_kernel=True)  # fmt: skip
    assert o2.shape == (3, 1, 4, 8)


@pytest.mark.parametrize(
    "change",
    [
        {"num_accepted_tokens": torch.ones(3, dtype=torch.int32)},  # speculative decoding
        {"inplace_final_state": False},
        {"cu_seqlens": torch.tensor([0, 2, 3], dtype=torch.int32)},  # two tokens in one sequence
    ],
    ids=["speculative", "not in place", "prefill"],
)
def test_vllm_recurrent_other_calls_run_the_original(fakes, change):
    linear_ops.install()
    fn = fakes[VLLM_FLA].fused_recurrent_gated_delta_rule
    q, k, v, g, beta, pool, slots, cu = _vllm_decode_batch()
    call = dict(initial_state=pool, inplace_final_state=True, cu_seqlens=cu,
                ssm_state_indices=slots)  # fmt: skip
    call.update(change)
    with pytest.raises(OriginalCalled):
        fn(q, k, v, g, beta, **call)
