"""The vendor fork's conventions, against a stand-in vLLM with the fork's signatures.

The stand-in's V1 works (and records its calls), its V2 raises ``NotImplementedError`` and its
``reshape_and_cache`` is a stub, as on BI-V100.
"""

import ep_helpers
import fake_vllm
import pytest
import torch
from ep_helpers import DECODE_TOL, assert_close, decode_args, decode_reference, op_args

from attn_core.reference import make_paged_case
from engine_patch import STATE, is_active, register, routing
from engine_patch.platform import PLATFORM_ENV
from engine_patch.settings import FORCE_ENV, V1_LIMIT_ENV

clean_state = pytest.fixture(ep_helpers.clean_state)


@pytest.fixture
def vendor(monkeypatch, clean_state):
    monkeypatch.setenv(PLATFORM_ENV, "generic")
    monkeypatch.delenv(FORCE_ENV, raising=False)
    monkeypatch.delenv(V1_LIMIT_ENV, raising=False)
    monkeypatch.setenv("ATTN_CORE_DEVICE", "bi-v100")
    mods = fake_vllm.install(monkeypatch)
    routing._spec_for.cache_clear()
    yield mods
    routing._spec_for.cache_clear()


def _case(seq_lens, dtype=torch.float16, heads=24, kv_heads=4, head_size=256):
    return make_paged_case(seq_lens, heads, kv_heads, head_size, 16, dtype, seed=7)


def _mapping(heads, kv_heads):
    return torch.arange(heads, dtype=torch.int32) // (heads // kv_heads)


def test_flavour_and_what_is_kept(vendor):
    state = register()
    assert state.flavour == "vendor" and is_active()
    assert state.natives["paged_attention_v1"].works
    assert not state.natives["reshape_and_cache"].present  # a stub is not kept
    patches = state.patches
    assert patches["vllm._custom_ops.paged_attention_v1"].implementation.startswith("native")
    assert patches["vllm._custom_ops.reshape_and_cache"].implementation == (
        "attn-core (vendor_reshape_and_cache)"
    )


def test_forward_decode_keeps_native_v1_within_its_reach(vendor):
    register()
    paged = vendor["vllm.attention.ops.paged_attn"].PagedAttention
    case = _case([1, 37, 300])
    out = paged.forward_decode(*decode_args(case, 300, _mapping(24, 4), 256**-0.5))
    assert fake_vllm.CALLS == ["native_v1"]
    assert_close(out, decode_reference(case), DECODE_TOL[torch.float16])


def test_forward_decode_beyond_v1_reach_uses_attn_core(vendor, monkeypatch):
    monkeypatch.setenv(V1_LIMIT_ENV, "64")  # keep the case small: V1 reach 64 tokens
    register()
    paged = vendor["vllm.attention.ops.paged_attn"].PagedAttention
    case = _case([65, 9], heads=16, kv_heads=2)
    out = paged.forward_decode(*decode_args(case, 65, _mapping(16, 2), 256**-0.5))
    # The platform's V2 was tried once (its reference check) and raised: attn-core served.
    assert fake_vllm.CALLS == ["native_v2"]
    assert_close(out, decode_reference(case), DECODE_TOL[torch.float16])


@pytest.mark.parametrize("v2, route", [("works", "native_v2"), ("wrong", "attn_core")])
def test_native_v2_only_after_it_matched_the_reference(monkeypatch, clean_state, v2, route):
    monkeypatch.setenv(PLATFORM_ENV, "generic")
    monkeypatch.setenv(V1_LIMIT_ENV, "64")
    mods = fake_vllm.install(monkeypatch, ops=fake_vllm.vendor_ops(v2=v2))
    register()
    paged = mods["vllm.attention.ops.paged_attn"].PagedAttention
    case = _case([65, 9], dtype=torch.float32, heads=16, kv_heads=2)
    for _ in range(2):
        fake_vllm.CALLS.clear()
        out = paged.forward_decode(*decode_args(case, 65, _mapping(16, 2), 256**-0.5))
        assert_close(out, decode_reference(case), DECODE_TOL[torch.float32])
    # Second call: the check is cached; V2 runs only where it is the route.
    assert fake_vllm.CALLS == (["native_v2"] if route == "native_v2" else [])
    impl, reason, _ = routing.choose(65, 16, 256, torch.float32, torch.device("cpu"))
    assert impl == route
    assert ("matched the reference" if v2 == "works" else "did not match") in reason


def test_v2_that_raises_is_replaced_after_the_first_call(vendor):
    state = register()
    ops = vendor["vllm._custom_ops"]
    case = _case([70, 5], dtype=torch.float32)
    want = decode_reference(case)
    for _ in range(2):
        out = torch.full_like(case.query, float("nan"))
        scratch = torch.empty(0)
        ops.paged_attention_v2(
            out, scratch, scratch, scratch, *op_args(case, _mapping(24, 4), 256**-0.5, 70)
        )
        assert_close(out, want, DECODE_TOL[torch.float32])
    assert fake_vllm.CALLS == ["native_v2"]  # tried once, then attn-core only
    assert "NotImplementedError" in state.natives["paged_attention_v2"].failure


def test_force_replaces_a_working_native_op(vendor, monkeypatch):
    monkeypatch.setenv(FORCE_ENV, "1")
    state = register()
    ops = vendor["vllm._custom_ops"]
    assert state.patches["vllm._custom_ops.paged_attention_v1"].reason == f"{FORCE_ENV}=1"
    case = _case([33, 1], dtype=torch.bfloat16)
    out = torch.full_like(case.query, float("nan"))
    ops.paged_attention_v1(out, *op_args(case, _mapping(24, 4), 256**-0.5, 33))
    assert fake_vllm.CALLS == []
    assert_close(out, decode_reference(case), DECODE_TOL[torch.bfloat16])
    impl, reason, _ = routing.choose(16, 16, 256, torch.float16, torch.device("cpu"))
    assert impl == routing.ATTN_CORE and FORCE_ENV in reason


def test_vendor_checks_name_the_argument(vendor, monkeypatch):
    monkeypatch.setenv(FORCE_ENV, "1")
    register()
    ops = vendor["vllm._custom_ops"]
    case = _case([5])
    out = torch.empty_like(case.query)
    with pytest.raises(ValueError, match=r"head_mapping must have shape \[24\]"):
        ops.paged_attention_v1(out, *op_args(case, _mapping(12, 4), 1.0, 5))
    with pytest.raises(ValueError, match=r"block_size must equal value_cache.shape\[3\] \(16\)"):
        ops.paged_attention_v1(out, *op_args(case, _mapping(24, 4), 1.0, 5, block_size=32))


def test_vendor_reshape_and_cache_writes_the_slots(vendor):
    register()
    ops = vendor["vllm._custom_ops"]
    case = _case([40])
    key = torch.randn(3, 4, 256).half()
    value = torch.randn(3, 4, 256).half()
    block = int(case.block_tables[0, 1])
    slots = torch.tensor([block * 16 + 0, block * 16 + 5, -1])
    ops.reshape_and_cache(key, value, case.key_cache, case.value_cache, slots, "auto")
    got_k = case.key_cache[block, :, :, 5, :].reshape(4, 256)
    assert torch.equal(got_k, key[1])
    assert torch.equal(case.value_cache[block, :, :, 0], value[0])


def test_unknown_convention_refused_at_registration(monkeypatch, clean_state):
    import types

    ops = types.ModuleType("vllm._custom_ops")

    def paged_attention_v1(out, query, key_cache, value_cache, kv_map, scale):
        pass

    ops.paged_attention_v1 = paged_attention_v1
    fake_vllm.install(monkeypatch, ops=ops)
    with pytest.raises(ValueError, match="kv_map"):
        register()
    assert not is_active()
    assert clean_state.errors and "UnknownSignatureError" in clean_state.errors[0]


def test_build_without_prefix_path(monkeypatch, clean_state):
    mods = fake_vllm.install(monkeypatch)
    monkeypatch.setenv(PLATFORM_ENV, "generic")
    cls = mods["vllm.attention.ops.paged_attn"].PagedAttention
    monkeypatch.setattr(cls, "forward_prefix", None)
    assert cls.forward_prefix is None
    state = register()
    assert is_active() and "PagedAttention.forward_prefix" not in state.patches
    assert state.kept["PagedAttention.forward_prefix"] == "absent in this vLLM"


@pytest.mark.parametrize(
    "raw, forced", [("on", True), ("YES", True), ("true", True), ("off", False), ("0", False)]
)
def test_force_reads_the_repositorys_boolean_words(vendor, monkeypatch, raw, forced):
    monkeypatch.setenv(FORCE_ENV, raw)
    state = register()
    reason = state.patches["vllm._custom_ops.paged_attention_v1"].reason
    assert (reason == f"{FORCE_ENV}=1") is forced
    impl, _, _ = routing.choose(16, 16, 256, torch.float16, torch.device("cpu"))
    assert (impl == routing.ATTN_CORE) is forced


def test_force_maybe_is_refused_not_off(vendor, monkeypatch):
    """`maybe` used to mean off silently; it is a ValueError naming the variable and value."""
    monkeypatch.setenv(FORCE_ENV, "maybe")
    with pytest.raises(ValueError, match=f"{FORCE_ENV} must be one of .* got 'maybe'"):
        register()
    assert any(FORCE_ENV in e for e in STATE.errors)
