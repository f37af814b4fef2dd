"""Shared test support for attn-core: NaN poisoning, per-dtype tolerances, a CUDA skip.

The float64 reference lives in ``attn_core.reference`` (shared with engine-patch and the HIL
suites); this file only holds pytest plumbing.
"""

from __future__ import annotations

import math

import pytest
import torch

from attn_core.core import settings
from attn_core.reference.threads import share_cores_among_workers

# Per-dtype tolerances against the float64 reference. fp16: probabilities are rounded to fp16
# before P.V (as in vLLM) and the output once more; the worst error seen over this suite's
# cases was 1.6e-3 on outputs of magnitude ~1. bf16 has 8 mantissa bits (2^-8 = 3.9e-3).
TOLERANCES = {
    torch.float16: {"atol": 2.5e-3, "rtol": 5e-3},
    torch.bfloat16: {"atol": 2e-2, "rtol": 3e-2},
    torch.float32: {"atol": 2e-5, "rtol": 2e-5},
}

DECODE_ENV = (
    "ATTN_CORE_DECODE_PARTITION_SIZE",
    "ATTN_CORE_DECODE_SINGLE_TILE_MAX",
    "ATTN_CORE_DECODE_STREAM_TOKENS",
    "ATTN_CORE_DECODE_TIER",
    "ATTN_CORE_DECODE_SUBSCRIPTION",
    "ATTN_CORE_DECODE_GATHER_BYTES",
    "ATTN_CORE_DECODE_SCORES",
)  # ATTN_CORE_DEVICE / ATTN_CORE_CHECKS pass through: CI may run the suite on a profile


def pytest_configure(config: pytest.Config) -> None:
    share_cores_among_workers()


requires_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (run on the GPU machine)"
)


def skip_without_float8() -> None:
    """Skip where this torch has no float8 dtypes: the reference reads fp8 caches through them."""
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip(f"torch {torch.__version__} has no float8 dtypes for the reference")


def poisoned_like(t: torch.Tensor) -> torch.Tensor:
    """A tensor shaped like ``t`` full of NaN: any element a kernel fails to write shows up."""
    return torch.full_like(t, math.nan)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    """``actual`` (any dtype/device) against a float64 reference, with ``dtype``'s tolerance."""
    assert torch.isfinite(actual).all(), "output has NaN/inf (unwritten or poisoned elements)"
    torch.testing.assert_close(actual.double().cpu(), expected.double(), **TOLERANCES[dtype])


@pytest.fixture(autouse=True)
def clean_decode_env(monkeypatch: pytest.MonkeyPatch):
    """Every test starts without decode overrides and with a settings snapshot of that
    environment; tests pass overrides, or set a variable through :func:`settings_env` (which
    reloads the snapshot, as a process would on start). The snapshot is reloaded afterwards."""
    for name in DECODE_ENV:
        monkeypatch.delenv(name, raising=False)
    settings.reload()
    yield monkeypatch
    monkeypatch.undo()
    settings.reload()


class SettingsEnv:
    """Set an ``ATTN_CORE_*`` variable and reload the settings snapshot (when it takes effect)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self._monkeypatch = monkeypatch

    def set(self, name: str, value: str) -> None:
        self._monkeypatch.setenv(name, value)
        settings.reload()

    def unset(self, name: str) -> None:
        self._monkeypatch.delenv(name, raising=False)
        settings.reload()


@pytest.fixture
def settings_env(clean_decode_env: pytest.MonkeyPatch) -> SettingsEnv:
    return SettingsEnv(clean_decode_env)
