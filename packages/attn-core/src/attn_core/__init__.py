"""attn-core: paged attention on vLLM 0.6.3's cache layout in portable PyTorch.

Public API: :func:`paged_decode`, :func:`paged_prefix_prefill`, :func:`write_to_paged_cache`,
:func:`plan_decode` / :func:`plan_prefill` (frozen plan objects, the single source of launch
decisions) and :class:`DeviceSpec` profiles.
"""

from attn_core.cache_write import write_to_paged_cache
from attn_core.decode import paged_decode
from attn_core.device_detect import detect_device_spec
from attn_core.device_spec import DEVICE_SPECS, DeviceSpec, get_device_spec
from attn_core.plan_decode import DecodePlan, plan_decode
from attn_core.plan_prefill import PrefillPlan, plan_prefill
from attn_core.plan_types import KernelStep
from attn_core.prefill import paged_prefix_prefill

__all__ = [
    "DEVICE_SPECS",
    "DecodePlan",
    "DeviceSpec",
    "KernelStep",
    "PrefillPlan",
    "detect_device_spec",
    "get_device_spec",
    "paged_decode",
    "paged_prefix_prefill",
    "plan_decode",
    "plan_prefill",
    "write_to_paged_cache",
]
