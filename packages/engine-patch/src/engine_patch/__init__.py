"""engine-patch: a vLLM 0.6.3 general plugin that routes paged attention to attn-core.

Entry point (group ``vllm.general_plugins``, name ``engine_patch``): :func:`register`.
``engine-patch status`` (or ``python -m engine_patch status``) says what is active in this
process and runs a numeric self-test. See the package README for the environment knobs.
"""

from engine_patch.registration import is_active, register
from engine_patch.state import STATE

PLUGIN_NAME = "engine_patch"

__all__ = ["PLUGIN_NAME", "STATE", "is_active", "register"]
