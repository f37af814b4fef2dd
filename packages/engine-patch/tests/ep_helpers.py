"""engine-patch's test helpers and fixture bodies.

There is deliberately no conftest.py: pytest loads every initial conftest.py as the module
``conftest`` before collecting, and attn-core's tests do ``from conftest import ...``, so a
second conftest.py breaks a run over several packages. Test modules take the fixtures with
``clean_state = pytest.fixture(ep_helpers.clean_state)``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attn_core.core import verify_once
from attn_core.core.settings import parse_bool
from attn_core.reference import PagedCase
from engine_patch import native_v2
from engine_patch.platform import PLATFORM_ENV
from engine_patch.state import LOCK, STATE, PatchState

DATA = Path(__file__).parent / "data"
REQUIRE_ENV = "ENGINE_PATCH_REQUIRE_VLLM"

# Against the float64 reference, as attn-core's tests (decode) and FlashInfer's (prefill).
DECODE_TOL = {
    torch.float16: {"atol": 2.5e-3, "rtol": 5e-3},
    torch.bfloat16: {"atol": 2e-2, "rtol": 3e-2},
    torch.float32: {"atol": 2e-5, "rtol": 2e-5},
}
PREFIX_TOL = {
    torch.float16: {"atol": 2e-2, "rtol": 2e-2},
    torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2},
    torch.float32: {"atol": 1e-4, "rtol": 1e-4},
}


def require(module: str, why: str) -> None:
    """Skip when ``module`` is missing, unless ``ENGINE_PATCH_REQUIRE_VLLM`` is on (then fail)."""
    try:
        __import__(module)
    except ImportError as exc:
        message = f"{module} is not importable ({exc}); {why}"
        if parse_bool(REQUIRE_ENV, os.environ.get(REQUIRE_ENV)):
            pytest.fail(f"{REQUIRE_ENV} is on but {message}")
        pytest.skip(message + " (install it with packages/engine-patch/ci/install-vllm.sh)")


def undo_patches() -> None:
    """Put every symbol engine-patch replaced back and forget the registration."""
    with LOCK:
        for record in reversed(list(STATE.patches.values())):
            original = record.original
            if isinstance(record.owner, type):
                original = staticmethod(original)
            setattr(record.owner, record.attr, original)
        verify_once.forget(native_v2.KIND)
        fresh = PatchState()
        for name in vars(fresh):
            setattr(STATE, name, getattr(fresh, name))


def forget_vllm(monkeypatch) -> None:
    """Drop every imported ``vllm`` module for one test (``monkeypatch`` puts them back)."""
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)


def hide_vllm(monkeypatch) -> None:
    """This process as if vLLM were not installed: ``import vllm`` raises ImportError."""
    forget_vllm(monkeypatch)
    monkeypatch.setitem(sys.modules, "vllm", None)


def assert_close(got: torch.Tensor, want: torch.Tensor, tol: dict) -> None:
    assert torch.isfinite(got).all(), "output has non-finite values (unwritten elements?)"
    torch.testing.assert_close(got.double().cpu(), want, **tol)


def decode_reference(case: PagedCase, scale: float | None = None) -> torch.Tensor:
    """The float64 decode of ``case`` (its cache dtype and fp8 scales, no ALiBi):
    ``[num_seqs, num_heads, head_size]``."""
    return case.reference(scale)


def decode_args(case: PagedCase, max_seq_len: int, kv_heads, scale: float) -> tuple:
    """``PagedAttention.forward_decode``'s arguments for ``case``, in the order both conventions
    share: the fork's (``kv_heads`` a head_mapping tensor) ends here, vLLM 0.6.3's (``kv_heads``
    a count) goes on with ``k_scale, v_scale``."""
    return (
        case.query,
        case.key_cache,
        case.value_cache,
        case.block_tables,
        case.seq_lens,
        max_seq_len,
        case.kv_cache_dtype,
        kv_heads,
        scale,
        None,
    )


def op_args(
    case: PagedCase, kv_heads, scale: float, max_seq_len: int, block_size: int | None = None
) -> tuple:
    """``_custom_ops.paged_attention_v1``'s arguments after ``out`` (V2's after its scratch
    outputs) for ``case``, in the order both conventions share: the fork's (``kv_heads`` a
    head_mapping tensor) ends here, vLLM 0.6.3's (``kv_heads`` a count) goes on with
    ``k_scale, v_scale``. ``block_size`` is the cache's unless a test passes a wrong one."""
    return (
        case.query,
        case.key_cache,
        case.value_cache,
        kv_heads,
        scale,
        case.block_tables,
        case.seq_lens,
        case.value_cache.shape[-1] if block_size is None else block_size,
        max_seq_len,
        None,
        case.kv_cache_dtype,
    )


def run_python(code: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:  # noqa: F821
    """Run ``code`` in a fresh interpreter (plugins load once per process in vLLM)."""
    import subprocess

    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=300
    )


def clean_state():
    """Fixture body: undo every patch before and after the test; yields the state."""
    undo_patches()
    yield STATE
    undo_patches()


def clean_env(monkeypatch, clean_state):
    """Fixture body: no ENGINE_PATCH_* / ATTN_CORE_* variable but the ones a test sets, the
    generic platform and no vLLM (these tests are about input; importing the real one would
    cost ~13 s in `nox -s vllm`)."""
    for name in list(os.environ):
        if name.startswith(("ENGINE_PATCH_", "ATTN_CORE_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv(PLATFORM_ENV, "generic")
    hide_vllm(monkeypatch)


def vllm_modules():
    """Fixture body: the real vLLM modules engine-patch patches (skips or fails per
    :func:`require`)."""
    require("vllm", "the vLLM 0.6.3 tests need the real package")
    require("transformers", "vLLM 0.6.3 needs transformers")
    from vllm import _custom_ops
    from vllm.attention.ops import paged_attn

    return _custom_ops, paged_attn
