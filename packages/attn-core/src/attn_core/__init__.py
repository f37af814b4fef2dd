"""attn-core: paged attention on vLLM 0.6.3's cache layout in portable PyTorch.

Public API: :func:`paged_decode`, :func:`paged_prefix_prefill`, :func:`write_to_paged_cache`,
:func:`plan_decode` / :func:`plan_prefill` (frozen plan objects, the single source of launch
decisions; pure functions of shape, lengths, device profile, :class:`Capabilities` and
overrides; :class:`DecodePlan` for the torch path, :class:`NativeDecodePlan` for the native
kernel), their resolving wrappers :func:`decode_plan_for` / :func:`prefill_plan_for`
(:mod:`attn_core.runtime.resolve`: device, capabilities, kernel readiness, overrides, once per
plan), and :class:`DeviceSpec` profiles. The environment is read into
:mod:`attn_core.core.settings` once; ``attn_core.core.settings.reload()`` makes a changed
``ATTN_CORE_*`` variable take effect.

The hybrid model's linear-attention layers (:mod:`attn_core.linear`): the gated delta rule,
flash-linear-attention compatible (:func:`chunk_gated_delta_rule`,
:func:`fused_recurrent_gated_delta_rule`, :func:`gated_delta_decode`), its gates
(:func:`gated_delta_gates`), the short convolution, vLLM
compatible (:func:`causal_conv1d_fn`, :func:`causal_conv1d_update`), and :func:`plan_gated_delta`.
"""

from attn_core.core.cache_write import write_to_paged_cache
from attn_core.core.plan_types import KernelStep
from attn_core.core.settings import DecodeOverrides, Overrides, PrefillOverrides
from attn_core.core.shapes import QWEN36, AttentionShape
from attn_core.decode.plan import DecodeLengths, DecodePlan, plan_decode
from attn_core.decode.plan_native import NativeDecodePlan
from attn_core.device.capabilities import Capabilities, probe_capabilities, profile_capabilities
from attn_core.device.detect import detect_device_spec
from attn_core.device.spec import DEVICE_SPECS, DeviceSpec, get_device_spec
from attn_core.linear.api import (
    causal_conv1d_fn,
    causal_conv1d_update,
    chunk_gated_delta_rule,
    fused_recurrent_gated_delta_rule,
    gated_delta_decode,
)
from attn_core.linear.gates import gated_delta_gates
from attn_core.linear.plan import GatedDeltaPlan, plan_gated_delta
from attn_core.prefill.plan import PrefillLengths, PrefillPlan, plan_prefill
from attn_core.prefill.plan_native import NativePrefillPlan
from attn_core.runtime.decode import paged_decode
from attn_core.runtime.prefill import paged_prefix_prefill, prefill_plan_for
from attn_core.runtime.resolve import decode_plan_for

__all__ = [
    "DEVICE_SPECS",
    "QWEN36",
    "AttentionShape",
    "Capabilities",
    "DecodeLengths",
    "DecodeOverrides",
    "DecodePlan",
    "NativeDecodePlan",
    "Overrides",
    "PrefillLengths",
    "PrefillOverrides",
    "decode_plan_for",
    "prefill_plan_for",
    "probe_capabilities",
    "profile_capabilities",
    "DeviceSpec",
    "KernelStep",
    "PrefillPlan",
    "NativePrefillPlan",
    "detect_device_spec",
    "get_device_spec",
    "paged_decode",
    "paged_prefix_prefill",
    "plan_decode",
    "plan_prefill",
    "write_to_paged_cache",
    "GatedDeltaPlan",
    "causal_conv1d_fn",
    "causal_conv1d_update",
    "chunk_gated_delta_rule",
    "fused_recurrent_gated_delta_rule",
    "gated_delta_decode",
    "gated_delta_gates",
    "plan_gated_delta",
]
