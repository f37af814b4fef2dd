"""The Triton guard on a simulated Iluvatar platform (the stand-in vLLM of ``fake_vllm``)."""

import ep_helpers
import fake_vllm
import pytest
import torch

from engine_patch import register
from engine_patch.platform import PLATFORM_ENV
from engine_patch.triton_guard import TritonRefusedError, refused_settings

clean_state = pytest.fixture(ep_helpers.clean_state)


@pytest.fixture
def iluvatar(monkeypatch, clean_state):
    monkeypatch.setenv(PLATFORM_ENV, "iluvatar")
    monkeypatch.delenv("VLLM_ATTENTION_BACKEND", raising=False)
    monkeypatch.delenv("VLLM_USE_TRITON_FLASH_ATTN", raising=False)
    return fake_vllm.install(monkeypatch)


def _args():
    return (256, None, torch.float16, "auto", 16, False)


def test_prefix_path_never_reaches_triton(iluvatar):
    state = register()
    assert state.platform.is_iluvatar
    for module in ("vllm.attention.ops.paged_attn", "vllm.attention.ops.prefix_prefill"):
        with pytest.raises(TritonRefusedError, match="hang Iluvatar"):
            iluvatar[module].context_attention_fwd()
    assert "triton_context_attention_fwd" not in fake_vllm.CALLS
    assert "vllm.attention.ops.prefix_prefill.context_attention_fwd" in state.triton_guard


def test_selector_refuses_triton_backends(iluvatar):
    register()
    selector = iluvatar["vllm.attention.selector"]
    assert selector.which_attn_to_use(*_args()) is fake_vllm.Backend.XFORMERS
    selector.chosen = fake_vllm.Backend.ROCM_FLASH
    with pytest.raises(TritonRefusedError, match="attention backend ROCM_FLASH"):
        selector.which_attn_to_use(*_args())
    with pytest.raises(TritonRefusedError, match="attention backend ROCM_FLASH"):
        selector.get_attn_backend(*_args())


def test_blocksparse_refused_also_where_imported_by_name(iluvatar):
    register()
    layer = iluvatar["vllm.attention.layer"]  # did `from selector import get_attn_backend`
    assert layer.get_attn_backend is iluvatar["vllm.attention.selector"].get_attn_backend
    with pytest.raises(TritonRefusedError, match="block-sparse"):
        layer.get_attn_backend(*_args(), is_blocksparse=True)
    with pytest.raises(TritonRefusedError, match="block-sparse"):
        layer.get_attn_backend(*_args(), True)
    assert layer.get_attn_backend(*_args()) is fake_vllm.Backend.XFORMERS


def test_configuration_asking_for_triton_is_refused(iluvatar, monkeypatch):
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "ROCM_FLASH")
    with pytest.raises(TritonRefusedError, match="VLLM_ATTENTION_BACKEND=ROCM_FLASH"):
        register()
    # The guards are in place even though registration reported the refusal.
    with pytest.raises(TritonRefusedError):
        iluvatar["vllm.attention.ops.paged_attn"].context_attention_fwd()


def test_refused_settings():
    assert refused_settings({}) == []
    assert refused_settings({"VLLM_ATTENTION_BACKEND": "XFORMERS"}) == []
    assert refused_settings({"VLLM_USE_TRITON_FLASH_ATTN": "0"}) == []
    assert len(refused_settings({"VLLM_USE_TRITON_FLASH_ATTN": "True"})) == 1


def test_no_guard_on_other_platforms(monkeypatch, clean_state):
    monkeypatch.setenv(PLATFORM_ENV, "generic")
    mods = fake_vllm.install(monkeypatch)
    state = register()
    assert state.triton_guard == []
    mods["vllm.attention.ops.paged_attn"].context_attention_fwd()  # untouched
    assert fake_vllm.CALLS == ["triton_context_attention_fwd"]


def test_a_refused_setting_still_leaves_the_guard_in_place(iluvatar, monkeypatch):
    """register() raises for ENGINE_PATCH_FORCE=maybe (vLLM logs it and runs on); the Triton
    guard is installed before that setting is read."""
    monkeypatch.setenv("ENGINE_PATCH_FORCE", "maybe")
    with pytest.raises(ValueError, match="ENGINE_PATCH_FORCE must be one of"):
        register()
    with pytest.raises(TritonRefusedError, match="hang Iluvatar"):
        iluvatar["vllm.attention.ops.paged_attn"].context_attention_fwd()
