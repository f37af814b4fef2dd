"""Which way round a serving stack keeps the gated delta rule's recurrent states.

attn-core's states are key-major, ``[.., HV, K, V]`` (flash-linear-attention's default and
transformers'). vLLM's Mamba cache has kept them both ways: its FLA copy indexed the state as
``o_k[:, None] * V + o_v`` in some releases and ``o_v[:, None] * K + o_k`` (key-last,
``[.., HV, V, K]``) in later ones, with the cache shape from
``MambaStateShapeCalculator.gated_delta_net_state_shape`` following suit. With ``K == V`` (128
in Qwen3.5/3.6) the shapes cannot tell the two apart, and serving one layout as the other
reads every state transposed: wrong numbers, no error. So the layout of a vLLM target is read
from vLLM's own shape rule, asked about ``K = 2, V = 3``; where that rule is not loaded or
answers neither way the layout is unknown and the call is not served (the original runs, or
the Triton refusal on Iluvatar). ``ENGINE_PATCH_LINEAR_STATE_LAYOUT`` states it instead.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Optional

from engine_patch import settings

KEY_MAJOR, KEY_LAST = settings.STATE_LAYOUTS  # "kv": [.., K, V]; "vk": [.., V, K]
SHAPE_RULE_MODULE = "vllm.model_executor.layers.mamba.mamba_utils"
# Packages whose states are key-major by definition (FLA's ``state_v_first`` switch, off by
# default, is a neutral parameter: a call setting it runs the original).
KEY_MAJOR_PACKAGES = ("fla", "transformers")
_PROBE_K, _PROBE_V = 2, 3


def vllm_layout() -> tuple[Optional[str], str]:
    """``(layout or None, why)`` from the loaded vLLM's state-shape rule (nothing imported)."""
    module = sys.modules.get(SHAPE_RULE_MODULE)
    if module is None:
        return None, f"{SHAPE_RULE_MODULE} is not loaded, so vLLM's state shape is unknown"
    rule = getattr(getattr(module, "MambaStateShapeCalculator", None),
                   "gated_delta_net_state_shape", None)  # fmt: skip
    if rule is None:
        return None, f"{SHAPE_RULE_MODULE} has no gated_delta_net_state_shape"
    try:
        shapes = rule(tp_world_size=1, num_k_heads=1, num_v_heads=1, head_k_dim=_PROBE_K,
                      head_v_dim=_PROBE_V, conv_kernel_size=4)  # fmt: skip
        tail = tuple(int(n) for n in shapes[1][-2:])
    except Exception as exc:  # any failure means "unknown", never a guess
        return None, f"vLLM's gated_delta_net_state_shape could not be asked: {exc!r}"
    if tail == (_PROBE_K, _PROBE_V):
        return KEY_MAJOR, "vLLM's state shape is (HV, K, V)"
    if tail == (_PROBE_V, _PROBE_K):
        return KEY_LAST, "vLLM's state shape is (HV, V, K)"
    return None, f"vLLM's gated_delta_net_state_shape gave {shapes[1]} for K = 2, V = 3"


def layout_for(
    module: str, environ: Optional[Mapping[str, str]] = None
) -> tuple[Optional[str], str]:
    """``(layout or None, why)`` of the states a function of ``module`` takes."""
    forced = settings.linear_state_layout(environ)
    if forced is not None:
        return forced, f"{settings.STATE_LAYOUT_ENV}={forced}"
    if module.split(".")[0] in KEY_MAJOR_PACKAGES:
        return KEY_MAJOR, f"{module.split('.')[0]}'s states are (HV, K, V)"
    return vllm_layout()
