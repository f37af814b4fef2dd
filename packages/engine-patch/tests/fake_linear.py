"""Stand-ins for the serving stacks' linear-attention modules, as modules.

Their parameters are those of flash-linear-attention, vLLM's FLA copy and Mamba convolution
ops, and transformers' Qwen3-Next torch fallbacks (read for their names only), plus one
signature no convention matches. Every body raises:
a test that reaches one has run the original instead of attn-core. The FLA and vLLM modules hold
a module object named ``triton``, which is how engine-patch tells a Triton-backed function.
"""

from __future__ import annotations

import sys
import types
from typing import Optional

import torch

from engine_patch import linear_ops, settings
from engine_patch.platform import PLATFORM_ENV, detect_platform
from engine_patch.state import STATE

FLA = "fla.ops.gated_delta_rule"
FLA_NEW = "fla.ops.gated_delta_rule.chunk"
FLA_RECURRENT = "fla.ops.gated_delta_rule.fused_recurrent"
VLLM_FLA = "vllm.model_executor.layers.fla.ops"
CONV = "vllm.model_executor.layers.mamba.ops.causal_conv1d"
HOLDER = "vllm.model_executor.models.qwen3_next"
GDN = "vllm.model_executor.layers.mamba.gdn_linear_attn"
HF = "transformers.models.qwen3_next.modeling_qwen3_next"
HF35 = "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe"
SHAPES = "vllm.model_executor.layers.mamba.mamba_utils"
T = Optional[torch.Tensor]


class OriginalCalled(AssertionError):
    pass


def _module(name: str, triton: bool, **functions) -> types.ModuleType:
    module = types.ModuleType(name)
    if triton:
        module.triton = types.ModuleType("triton")
    for attr, fn in functions.items():
        fn.__module__ = name
        setattr(module, attr, fn)
    return module


def _fla_chunk(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
               cu_seqlens=None, head_first=False, use_qk_l2norm_in_kernel=False):  # fmt: skip
    raise OriginalCalled("FLA chunk_gated_delta_rule")


def _fla_recurrent(q, k, v, g=None, beta=None, scale=None, initial_state=None,
                   output_final_state=False, cu_seqlens=None,
                   use_qk_l2norm_in_kernel=False):  # fmt: skip
    raise OriginalCalled("FLA fused_recurrent_gated_delta_rule")


def _fla_new_chunk(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                   use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                   allow_neg_eigval=False, state_v_first=False, cu_seqlens=None,
                   cu_seqlens_cpu=None, chunk_indices=None):  # fmt: skip
    raise OriginalCalled("newer FLA chunk_gated_delta_rule")


def _vllm_recurrent(q, k, v, g, beta, scale=None, initial_state=None, inplace_final_state=True,
                    cu_seqlens=None, ssm_state_indices=None, num_accepted_tokens=None,
                    use_qk_l2norm_in_kernel=False):  # fmt: skip
    raise OriginalCalled("vLLM fused_recurrent_gated_delta_rule")


def _conv_fn(x, weight, bias, conv_states, query_start_loc, cache_indices=None,
             has_initial_state=None, activation="silu", pad_slot_id=-1,
             block_idx_first_scheduled_token=None, block_idx_last_scheduled_token=None,
             initial_state_idx=None, num_computed_tokens=None, block_size_to_align=0,
             metadata=None, validate_data=False):  # fmt: skip
    raise OriginalCalled("vLLM causal_conv1d_fn")


def _conv_update(x, conv_state, weight, bias=None, activation=None, conv_state_indices=None,
                 num_accepted_tokens=None, query_start_loc=None, max_query_len=-1,
                 pad_slot_id=-1, block_idx_last_scheduled_token=None, initial_state_idx=None,
                 retrieve_parent_token=None, validate_data=False):  # fmt: skip
    raise OriginalCalled("vLLM causal_conv1d_update")


def _recurrent_unknown(q, k, v, g, beta, scale=None, initial_state=None,
                       output_final_state=False, unknown_switch=False):  # fmt: skip
    """A signature with a parameter no convention knows (``unknown_switch``): not matched."""
    raise OriginalCalled("fused_recurrent_gated_delta_rule with an unknown parameter")


def _vllm_sigmoid_gating(A_log, a, b, dt_bias, q, k, v, beta=1.0, threshold=20.0, scale=None,
                         initial_state=None, inplace_final_state=True, cu_seqlens=None,
                         ssm_state_indices=None, num_accepted_tokens=None,
                         use_qk_l2norm_in_kernel=False, is_kda=False):  # fmt: skip  # noqa: N803
    raise OriginalCalled("vLLM fused_sigmoid_gating_delta_rule_update")


def shape_rule(key_last: bool) -> types.ModuleType:
    """vLLM's Mamba state-shape module, its GDN rule answering key-major or key-last."""

    class MambaStateShapeCalculator:
        @classmethod
        def gated_delta_net_state_shape(cls, tp_world_size, num_k_heads, num_v_heads,
                                        head_k_dim, head_v_dim, conv_kernel_size,
                                        num_spec=0):  # fmt: skip
            dims = (head_v_dim, head_k_dim) if key_last else (head_k_dim, head_v_dim)
            conv = (conv_kernel_size - 1, head_k_dim * num_k_heads * 2 + head_v_dim * num_v_heads)
            return conv, (num_v_heads // tp_world_size, *dims)

    module = types.ModuleType(SHAPES)
    module.MambaStateShapeCalculator = MambaStateShapeCalculator
    return module


def _gdn_gating(A_log, a, b, dt_bias, beta=1.0, threshold=20.0):  # noqa: N803
    raise OriginalCalled("vLLM fused_gdn_gating")


def _gdn_gating_g_only(A_log, a, dt_bias, beta=1.0, threshold=20.0):  # noqa: N803
    raise OriginalCalled("vLLM fused_gdn_gating without b")


def _hf_chunk(query, key, value, g, beta, chunk_size=64, initial_state=None,
              output_final_state=False, use_qk_l2norm_in_kernel=False):  # fmt: skip
    raise OriginalCalled("transformers torch_chunk_gated_delta_rule")


def _hf_recurrent(query, key, value, g, beta, initial_state, output_final_state,
                  use_qk_l2norm_in_kernel=False):  # fmt: skip
    raise OriginalCalled("transformers torch_recurrent_gated_delta_rule")


def _hf_chunk_kwargs(query, key, value, g, beta, chunk_size=64, initial_state=None,
                     output_final_state=False, use_qk_l2norm_in_kernel=False,
                     **kwargs):  # fmt: skip
    raise OriginalCalled("transformers torch_chunk_gated_delta_rule (**kwargs)")


def modules() -> dict[str, types.ModuleType]:
    """Fresh fake modules by name (a holder imported vLLM's chunk function by name)."""
    fla = _module(FLA, True, chunk_gated_delta_rule=_copy(_fla_chunk),
                  fused_recurrent_gated_delta_rule=_copy(_fla_recurrent))  # fmt: skip
    vllm_fla = _module(VLLM_FLA, True, chunk_gated_delta_rule=_copy(_fla_chunk),
                       fused_recurrent_gated_delta_rule=_copy(_vllm_recurrent))  # fmt: skip
    vllm_fla.fused_sigmoid_gating_delta_rule_update = _copy(_vllm_sigmoid_gating)
    vllm_fla.fused_sigmoid_gating_delta_rule_update.__module__ = VLLM_FLA
    conv = _module(CONV, True, causal_conv1d_fn=_copy(_conv_fn),
                   causal_conv1d_update=_copy(_conv_update))  # fmt: skip
    holder = _module(HOLDER, True, fused_gdn_gating=_copy(_gdn_gating))
    holder.chunk_gated_delta_rule = vllm_fla.chunk_gated_delta_rule
    gdn = _module(GDN, True, fused_gdn_gating=_copy(_gdn_gating_g_only))
    hf = _module(HF, False, torch_chunk_gated_delta_rule=_copy(_hf_chunk),
                 torch_recurrent_gated_delta_rule=_copy(_hf_recurrent))  # fmt: skip
    fla_new = _module(FLA_NEW, True, chunk_gated_delta_rule=_copy(_fla_new_chunk))
    unknown = _module(
        FLA_RECURRENT, True, fused_recurrent_gated_delta_rule=_copy(_recurrent_unknown)
    )
    hf35 = _module(HF35, False, torch_chunk_gated_delta_rule=_copy(_hf_chunk_kwargs))
    return {
        HF35: hf35,
        FLA_NEW: fla_new,
        FLA: fla,
        VLLM_FLA: vllm_fla,
        CONV: conv,
        HOLDER: holder,
        HF: hf,
        FLA_RECURRENT: unknown,
        GDN: gdn,
        SHAPES: shape_rule(key_last=False),
    }


def _copy(fn):
    """A distinct function object per fake module (as each real module defines its own)."""
    new = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__)
    new.__kwdefaults__ = fn.__kwdefaults__
    return new


def loaded(monkeypatch, clean_state):
    """Fixture body: the fake modules loaded, no vLLM, the generic platform; yields them by
    name and removes the import hook after."""
    import ep_helpers

    ep_helpers.hide_vllm(monkeypatch)
    monkeypatch.setenv(PLATFORM_ENV, "generic")
    monkeypatch.delenv(settings.LINEAR_OPS_ENV, raising=False)
    monkeypatch.delenv(settings.STATE_LAYOUT_ENV, raising=False)
    mods = modules()
    for name, module in mods.items():
        monkeypatch.setitem(sys.modules, name, module)
    STATE.platform = detect_platform()
    yield mods
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, linear_ops._Finder)]


def inputs(b=2, t=5, h=2, hv=4, dk=8, dv=8, seed=0):
    """``q, k, v, g, beta`` of FLA's layout and a key-major initial state, fp32."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, t, h, dk, generator=gen)
    k = torch.randn(b, t, h, dk, generator=gen)
    v = torch.randn(b, t, hv, dv, generator=gen)
    g = -torch.rand(b, t, hv, generator=gen)
    beta = torch.rand(b, t, hv, generator=gen)
    state = torch.randn(b, hv, dk, dv, generator=gen) * 0.1
    return q, k, v, g, beta, state


def decode_batch(n=3, h=2, hv=4, dk=8, dv=8, seed=7):
    """vLLM's decode call: one token for each of ``n`` sequences, flattened into ``[1, n]``,
    the states a key-major pool of ``n + 2`` slots named by ``ssm_state_indices``."""
    q, k, v, g, beta, _ = inputs(1, n, h, hv, dk, dv, seed)
    pool = torch.randn(n + 2, hv, dk, dv, generator=torch.Generator().manual_seed(seed))
    slots = torch.tensor([4, 0, 2][:n])
    cu = torch.arange(n + 1, dtype=torch.int32)
    return q, k, v, g, beta, pool, slots, cu
