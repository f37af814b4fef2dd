"""Issue 18 (a newcomer's first hour): with the plugin filtered out (``VLLM_PLUGINS`` without
engine_patch), ``engine-patch status`` still says which vLLM is installed and which platform
this is; only the verdict changes."""

from __future__ import annotations

import ep_helpers
import fake_vllm
import pytest
import torch

from attn_core.core.shapes import AttentionShape
from engine_patch.platform import PLATFORM_ENV
from engine_patch.status import collect, render

clean_state = pytest.fixture(ep_helpers.clean_state)
SMALL = AttentionShape(
    num_heads=8, num_kv_heads=2, head_size=64, block_size=16, dtype=torch.float32
)


@pytest.mark.parametrize("platform", ["generic", "iluvatar"])
def test_filtered_plugin_still_shows_vllm_version_and_platform(monkeypatch, clean_state, platform):
    monkeypatch.setenv(PLATFORM_ENV, platform)
    fake_vllm.install(monkeypatch, plugins=lambda: None)  # as with VLLM_PLUGINS=other
    report = collect(SMALL, torch.device("cpu"), contexts=(1024,), self_test=False)
    assert not report["patch_active"]
    assert report["vllm"]["version"] not in (None, "")
    assert report["platform"] is not None
    assert report["platform"]["iluvatar"] is (platform == "iluvatar")
    text = render(report)
    vllm_line = next(line for line in text.splitlines() if line.startswith("vLLM "))
    platform_line = next(line for line in text.splitlines() if line.startswith("platform "))
    assert "None" not in vllm_line and "?" not in platform_line, text
