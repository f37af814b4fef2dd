"""vLLM 0.6.3's Triton prefix-prefill kernel (``context_attention_fwd``), loaded from its sdist,
as a benchmark peer (the kernel that hangs BI-V100; Triton runs on the H200).

The sdist is fetched on a machine with a package index and carried along (see
``vllm_baseline.py``; without build isolation its metadata step needs ``setuptools_scm`` on
``PYTHONPATH``). :func:`load_context_attention_fwd` extracts
``vllm/attention/ops/prefix_prefill.py`` to a temporary directory and imports it with a
stand-in for the one vLLM module it imports (``vllm.platforms.current_platform``, asked only
for the device capability); nothing of vLLM is stored in this repository.
"""

from __future__ import annotations

import importlib.util
import sys
import tarfile
import tempfile
import types
from collections.abc import Callable
from pathlib import Path
from typing import Optional

import torch

MEMBER = "vllm/attention/ops/prefix_prefill.py"


class _Platform:
    @staticmethod
    def has_device_capability(capability: int) -> bool:
        major, minor = torch.cuda.get_device_capability()
        return major * 10 + minor >= capability


def load_context_attention_fwd(sdist: Path) -> tuple[Optional[Callable], str]:
    """``(context_attention_fwd, "")`` or ``(None, why not)``."""
    if not sdist.is_file():
        return None, f"no vLLM sdist at {sdist}"
    try:
        import triton  # noqa: F401
    except ImportError:
        return None, "triton is not installed"
    tmp = Path(tempfile.mkdtemp(prefix="vllm_pp_"))
    with tarfile.open(sdist) as tar:
        member = next((m for m in tar.getmembers() if m.name.endswith(MEMBER)), None)
        if member is None:
            return None, f"{sdist} has no {MEMBER}"
        try:
            tar.extract(member, tmp, filter="data")
        except TypeError:  # Python without extraction filters
            tar.extract(member, tmp)
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = _Platform()  # type: ignore[attr-defined]
    sys.modules.setdefault("vllm", types.ModuleType("vllm"))
    sys.modules["vllm.platforms"] = platforms
    spec = importlib.util.spec_from_file_location("vllm_prefix_prefill", tmp / member.name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, "context_attention_fwd", None)
    return (fn, "") if fn is not None else (None, "the module defines no context_attention_fwd")


def vllm_prefill_fn(fwd: Callable, case, out: torch.Tensor) -> Callable[[], torch.Tensor]:
    """One call of vLLM's kernel on a PrefillCase (its argument names in comments)."""

    def run() -> torch.Tensor:
        fwd(
            case.query, case.key, case.value, out, case.kv_cache_dtype,
            case.key_cache, case.value_cache,
            case.block_tables,  # b_loc
            case.query_start_loc,  # b_start_loc
            case.seq_lens,  # b_seq_len
            case.context_lens,  # b_ctx_len
            case.max_query_len,  # max_input_len
        )  # fmt: skip
        return out

    return run


if __name__ == "__main__":
    from _args import not_a_benchmark  # this script's folder leads sys.path

    not_a_benchmark(__doc__, "bench/native_prefill_bench.py times this kernel")
