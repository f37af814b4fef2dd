"""The long-context suite's whole-prompt case (native vs torch): skipped with the reason off a
GPU or where no native variant verifies, shown in the table and JUnit either way."""

from __future__ import annotations

import sys

import pytest
import torch
from hil_helpers import REPO

sys.path.insert(0, str(REPO / "hil" / "suites"))

import long_context  # noqa: E402
import long_context_prompt as prompt  # noqa: E402


def test_cpu_is_a_skip_naming_the_device() -> None:
    rec = prompt.prompt_record(4096, 1024, long_context.QUICK_SHAPE, torch.float16, "cpu", 0)
    assert rec["skipped"] == "the whole-prompt native prefill needs a CUDA device, got cpu"
    rec["tolerance"] = 1e-2
    assert "needs a CUDA device" in long_context.table([rec])
    assert "<skipped" in long_context.junit_xml([rec])


def test_no_verified_variant_is_a_skip_but_other_errors_raise(monkeypatch) -> None:
    def missing(*a, **k):
        raise ValueError("prefill backend 'native' (forced ...), but no MMA variant is built and "
                         "verified here: wmma not available")  # fmt: skip

    monkeypatch.setattr(prompt, "_compare", missing)
    rec = prompt.prompt_record(4096, 1024, long_context.QUICK_SHAPE, torch.float16, "cuda", 0)
    assert rec["skipped"].startswith("native prefill unavailable here: ")

    def bug(*a, **k):
        raise ValueError("query must be [num_tokens, num_heads, head_size]")

    monkeypatch.setattr(prompt, "_compare", bug)
    with pytest.raises(ValueError, match="query must be"):
        prompt.prompt_record(4096, 1024, long_context.QUICK_SHAPE, torch.float16, "cuda", 0)


def test_a_measured_prompt_row_and_its_failure() -> None:
    rec = {"kind": "prompt", "backend": "native vs torch", "context_len": 131072,
           "dtype": "float16", "rel_error": 2e-3, "tolerance": 1e-2, "native_s": 2.0,
           "torch_s": 1.5}  # fmt: skip
    assert "ok (native 2000.0 / torch 1500.0 ms)" in long_context.table([rec])
    rec["rel_error"] = 0.5
    assert "FAIL" in long_context.table([rec])
    assert "<failure" in long_context.junit_xml([rec])
