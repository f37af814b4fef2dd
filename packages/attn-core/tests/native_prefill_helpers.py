"""The native prefill kernel on a PrefillCase, NaN-poisoned, against the float64 reference.

``ATTN_CORE_PREFILL_LIBS`` names a directory of prebuilt libraries (a device run carries them,
compiled on a machine without a GPU); otherwise the library is built on first use.
"""

from __future__ import annotations

import math
import os
from typing import Optional

import pytest
import torch

from attn_core.core.settings import current_overrides
from attn_core.native.prefill_launch import native_prefix_prefill
from attn_core.native.prefill_library import PrefillLibrary, load_prefill
from attn_core.reference import PrefillCase, make_prefill_case, reference_prefix_prefill

MMAS = ("wmma", "fma")


def prefill_library(mma: str) -> PrefillLibrary:
    """The ``mma`` library on this GPU; skips with the reason where there is none."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (run on the GPU machine)")
    native = current_overrides().native  # the runtime's cache and build switch, not defaults
    lib, why = load_prefill(
        mma, torch.device("cuda"), library_dir=os.environ.get("ATTN_CORE_PREFILL_LIBS"),
        cuda_home=native.cuda_home, cache_dir=native.cache_dir, build=native.build,
        arch=native.arch,
    )  # fmt: skip
    if lib is None:
        pytest.skip(f"native prefill ({mma}) unavailable here: {why}")
    return lib


def poison_past_context(case: PrefillCase) -> None:
    """NaN (fp8: the NaN byte 0x7F) in every cache slot at or past each sequence's context
    length: vLLM has written the chunk's K/V there, and the kernel must take them from
    ``key`` / ``value`` and never read past the context."""
    bs = case.key_cache.shape[3]
    nan = 0x7F if case.kv_cache_dtype != "auto" else math.nan
    ctx = case.context_lens.tolist()
    total = case.seq_lens.tolist()
    for s, (c, n) in enumerate(zip(ctx, total, strict=True)):
        for pos in range(c, -(-n // bs) * bs):
            block = int(case.block_tables[s, pos // bs])
            case.key_cache[block, :, :, pos % bs, :] = nan
            case.value_cache[block, :, :, pos % bs] = nan


def cuda_prefill_case(seqs, heads, kv_heads, head_size, block_size, dtype, **kw) -> PrefillCase:
    case = make_prefill_case(seqs, heads, kv_heads, head_size, block_size, dtype, "cuda", **kw)
    poison_past_context(case)
    return case


def run_native(
    case: PrefillCase,
    mma: str,
    *,
    config: Optional[int] = None,
    num_splits: Optional[int] = None,
    scale: Optional[float] = None,
    lib: Optional[PrefillLibrary] = None,
    stream: Optional[int] = None,
) -> torch.Tensor:
    """``out`` (NaN-poisoned) written by ``lib`` (default: this GPU's ``mma`` library) on
    ``stream`` (default: the current one)."""
    lib = lib or prefill_library(mma)
    out = torch.full_like(case.query, math.nan)
    native_prefix_prefill(
        lib,
        *case.args(),  # paged_prefix_prefill's positional order
        scale,
        alibi_slopes=case.alibi_slopes,
        sliding_window=case.sliding_window,
        kv_cache_dtype=case.kv_cache_dtype,
        k_scale=case.k_scale,
        v_scale=case.v_scale,
        out=out,
        config=config,
        num_splits=num_splits,
        stream=stream,
    )
    return out


def reference(case: PrefillCase, scale: Optional[float] = None) -> torch.Tensor:
    kw = case.reference_kwargs()
    if kw["alibi_slopes"] is not None:
        kw["alibi_slopes"] = kw["alibi_slopes"].cpu()
    return reference_prefix_prefill(**kw, scale=scale)
