"""Fixtures: a clean registration per test, the real vLLM modules (helpers: ep_helpers.py)."""

from __future__ import annotations

import pytest
from ep_helpers import require, undo_patches

from engine_patch.state import STATE


@pytest.fixture
def clean_state():
    undo_patches()
    yield STATE
    undo_patches()


@pytest.fixture
def vllm_modules():
    """The real vLLM modules engine-patch patches (skips or fails per :func:`require`)."""
    require("vllm", "the vLLM 0.6.3 tests need the real package")
    require("transformers", "vLLM 0.6.3 needs transformers")
    from vllm import _custom_ops
    from vllm.attention.ops import paged_attn

    return _custom_ops, paged_attn
