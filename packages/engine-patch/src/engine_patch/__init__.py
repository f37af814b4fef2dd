"""engine-patch: a vLLM 0.6.3 general plugin that routes paged attention to attn-core.

Entry point (group ``vllm.general_plugins``, name ``engine_patch``): :func:`register`.
``engine-patch status`` (or ``python -m engine_patch status``) says what is active in this
process and runs a numeric self-test. See the package README for the environment knobs.
"""

import warnings

# torch's wheels do not depend on numpy, and `import torch` without it warns "Failed to
# initialize NumPy: No module named 'numpy'" (torch 2.13: torch/_subclasses/functional_tensor.py;
# 2.1: torch/nn/modules/transformer.py) - on every `engine-patch` call in a plain
# `pip install packages/attn-core packages/engine-patch` or a nox session. Neither engine-patch
# nor attn-core converts tensors to numpy, so the warning says nothing about them; numpy is not
# made a dependency because pip would then pull numpy 2 into the vendor's torch 2.1 stack, built
# against numpy 1. Only that message, and only while this package's imports load torch (inside
# vLLM, torch and numpy are loaded long before the plugin, and the filter does nothing).
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
    from engine_patch.registration import is_active, register
    from engine_patch.state import STATE

PLUGIN_NAME = "engine_patch"

__all__ = ["PLUGIN_NAME", "STATE", "is_active", "register"]
