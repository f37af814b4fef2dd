"""The status commands' native prefill section (CPU: no library, the plan and its reason)."""

from __future__ import annotations

import pytest
import torch

from attn_core import AttentionShape
from attn_core.native.__main__ import main
from attn_core.runtime.prefill_status import prefill_plan_row, status_lines

QWEN = AttentionShape(24, 4, 256, 16, torch.float16)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU answer (a GPU verifies instead)")
def test_native_status_without_a_gpu_shows_the_prefill_plan_and_why(capsys) -> None:
    assert main(["status"]) == 3
    out = capsys.readouterr().out
    assert "prefill plan on cpu (24/4 heads, head 256" in out
    assert "native prefill: needs a CUDA device, got cpu" in out


def test_forced_backend_shows_in_the_plan_row(settings_env) -> None:
    settings_env.set("ATTN_CORE_PREFILL_BACKEND", "torch")
    row = prefill_plan_row(QWEN, torch.device("cpu"), 2048, 32768)
    assert row["backend"] == "torch" and row["variant"] == "-"
    assert "forced by ATTN_CORE_PREFILL_BACKEND" in row["reason"]
    assert row["price_ms"] > 0


def test_status_lines_end_with_the_plan() -> None:
    lines = status_lines(QWEN, torch.device("cpu"), 8192, 100_000)
    assert len(lines) == 1 and lines[0].startswith("prefill plan on cpu")
