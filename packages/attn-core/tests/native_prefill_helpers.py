"""The native prefill kernel on a PrefillCase, NaN-poisoned, against the float64 reference.

``ATTN_CORE_PREFILL_LIBS`` names a directory of prebuilt libraries (a device run carries them,
compiled on a machine without a GPU); otherwise the library is built on first use.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Optional

import pytest
import torch
from conftest import skip_without_float8

from attn_core.core.settings import current_overrides
from attn_core.native import abi
from attn_core.native import split as ps
from attn_core.native.loader import load_library
from attn_core.native.prefill import PrefillLibrary, poison_past_context, run_case
from attn_core.reference import PrefillCase, make_prefill_case, reference_prefix_prefill

MMAS = ("wmma", "fma")
FEATURES = ("alibi", "window", "both")


def prefill_library(mma: str) -> PrefillLibrary:
    """The ``mma`` library on this GPU; skips with the reason where there is none."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (run on the GPU machine)")
    settings = current_overrides().native  # the runtime's cache and build switch, not defaults
    lib, status = load_library(
        PrefillLibrary, mma, settings, torch.device("cuda"),
        library_dir=os.environ.get("ATTN_CORE_PREFILL_LIBS"),
    )  # fmt: skip
    if lib is None:
        pytest.skip(f"native prefill ({mma}) unavailable here: {status.detail}")
    return lib


def cuda_prefill_case(seqs, heads, kv_heads, head_size, block_size, dtype, **kw) -> PrefillCase:
    """A CUDA case with NaN in every cache slot at or past each sequence's context (vLLM has
    written the chunk's K/V there; the kernel must take them from ``key`` / ``value``)."""
    case = make_prefill_case(seqs, heads, kv_heads, head_size, block_size, dtype, "cuda", **kw)
    poison_past_context(case)
    return case


def edge_batch(block_size: int, tile: int, long: int = 0) -> list[tuple[int, int]]:
    """(context, chunk) pairs covering the edge lengths; ``long`` adds a long context."""
    seqs = [(0, 1), (1, 15), (block_size - 1, 16), (block_size, 17), (37, max(1, tile - 1))]
    seqs += [(0, tile), (block_size + 3, tile + 1)]
    return seqs + ([(long, 19)] if long else [])


def group_batch(config: int, group: int, context: int) -> list[tuple[int, int]]:
    """(context, chunk) pairs around tile ``config``'s query rows at GQA ``group``: a whole
    tile, one token past it, one short of it over ``context`` tokens, and a single token."""
    tile = ps.tokens_per_tile(config, group)
    return [(0, tile), (5, tile + 1), (context, max(1, tile - 1)), (33, 1)]


def feature_kwargs(feature: str, window: int) -> dict[str, object]:
    """:func:`make_prefill_case`'s keywords for one of :data:`FEATURES`: ALiBi, a sliding
    window of ``window`` tokens, or both."""
    return {
        "alibi": feature in ("alibi", "both"),
        "sliding_window": window if feature in ("window", "both") else None,
    }


def fp8_prefill_case(
    make_case: Callable[..., PrefillCase],
    head_size: int,
    dtype: torch.dtype,
    kv_cache_dtype: str,
    long: int,
) -> PrefillCase:
    """The fp8-cache family's case from ``make_case`` (:func:`cuda_prefill_case` or the
    host-emulation suite's): the edge batch with a ``long`` context, 8 / 2 heads, k_scale 0.37,
    v_scale 1.9; skips where torch has no float8."""
    skip_without_float8()
    block_size = 8 if head_size == 64 else 16  # 8-token fp8 value vectors are 8 bytes
    seqs = edge_batch(block_size, ps.tokens_per_tile(ps.CONFIG_LARGE, 4), long=long)
    return make_case(
        seqs, 8, 2, head_size, block_size, dtype,
        kv_cache_dtype=kv_cache_dtype, k_scale=0.37, v_scale=1.9,
    )  # fmt: skip


def forced_launch(
    lib: PrefillLibrary, case: PrefillCase, config: int, num_splits: Optional[int]
) -> ps.PrefillLaunch:
    """The launch of tile ``config`` for ``case``: ``num_splits`` splits, or (None) the split
    the device's rule gives that configuration (:func:`attn_core.native.prefill.device_launch`'s
    rule, which chooses its own configuration). With both forced nothing asks the device (a
    host-emulated library has none)."""
    num_tokens, num_heads, head_size = case.query.shape
    num_seqs, num_kv_heads = case.context_lens.shape[0], case.key_cache.shape[1]
    group = num_heads // num_kv_heads
    tiles_q = ps.query_tiles(config, group, case.max_query_len)
    if num_splits is None:
        qk = abi.QUERY_KINDS[case.query.dtype]
        facts = lib.config_facts(
            config, qk, abi.cache_kind(case.query.dtype, case.kv_cache_dtype),
            abi.head_bucket(head_size),
        )  # fmt: skip
        assert facts is not None, f"the {lib.mma} library has no kernel for config {config}"
        props = torch.cuda.get_device_properties(case.query.device)
        num_splits = ps.prefill_split(
            props.multi_processor_count,
            max(1, facts.blocks_per_sm),
            tiles_q * num_seqs * num_kv_heads,
            ps.key_tiles(config, int(case.context_lens.max()), case.max_query_len),
            workspace_per_split=ps.workspace_bytes(2, num_tokens, num_heads, head_size) // 2,
        )
    return ps.prefill_launch(
        config, group, num_tokens, num_heads, head_size, case.max_query_len, num_splits
    )


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
    """``out`` written by ``lib`` (default: this GPU's ``mma`` library) on ``stream``
    (default: the current one), at tile ``config`` (default: the device's) and ``num_splits``
    (default: the device's rule). ``out`` and the partials start as NaN: the kernel must write
    every output and the merge read only what the splits wrote."""
    lib = lib or prefill_library(mma)
    launch = None if config is None else forced_launch(lib, case, config, num_splits)
    return run_case(lib, case, num_splits, launch=launch, scale=scale, stream=stream)


def reference(case: PrefillCase, scale: Optional[float] = None) -> torch.Tensor:
    kw = case.reference_kwargs()
    if kw["alibi_slopes"] is not None:
        kw["alibi_slopes"] = kw["alibi_slopes"].cpu()
    return reference_prefix_prefill(**kw, scale=scale)
