"""The native kernel on a PagedCase, with NaN-poisoned outputs and cache tails, vs the reference.

These helpers call :func:`attn_core.native.decode.launch_decode` with an explicit partitioning,
so every path of the kernel (one partition, many, partial tiles, empty partitions past a
sequence's end) is exercised whatever the planner would choose.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Optional

import pytest
import torch
from conftest import assert_close, skip_without_float8
from decode_helpers import paged_tensors

from attn_core.core.settings import current_overrides
from attn_core.native.abi import partials_shapes
from attn_core.native.decode import DecodeLibrary, launch_decode, variant_for
from attn_core.native.loader import load_library
from attn_core.reference import PagedCase, make_paged_case, poison_tails, reference_decode


def native_library(group: int) -> DecodeLibrary:
    """The library serving GQA ``group`` on this GPU (built on first use); skips with the reason
    where there is none."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (run on the GPU machine)")
    # the settings snapshot, as the runtime reads it: ATTN_CORE_NATIVE_CACHE / _BUILD hold here too
    # (a default NativeSettings() ignored them and rebuilt every library on the device, 2026-12-02)
    settings = current_overrides().native
    lib, status = load_library(DecodeLibrary, variant_for(group), settings, torch.device("cuda"))
    if lib is None:
        pytest.skip(f"native kernel unavailable here: {status.detail}")
    return lib


def run_native(
    case: PagedCase,
    num_partitions: int,
    partition_size: int,
    *,
    scale: Optional[float] = None,
    alibi_slopes: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
    lib: Optional[DecodeLibrary] = None,
    stream: Optional[int] = None,
) -> torch.Tensor:
    """``out`` (NaN-poisoned, as are the partials) written by ``lib`` (default: the GPU library
    of the case's GQA group) on ``stream`` (default: the current one)."""
    num_seqs, num_heads, head_size = case.query.shape
    lib = lib or native_library(num_heads // case.key_cache.shape[1])
    scale = head_size**-0.5 if scale is None else scale
    fp8 = case.kv_cache_dtype != "auto"
    out = torch.full_like(case.query, math.nan) if out is None else out
    part_out = part_lse = None
    if num_partitions > 1:
        o_shape, l_shape = partials_shapes(num_seqs, num_heads, num_partitions, head_size)
        part_out = torch.full(o_shape, math.nan, device=out.device)
        part_lse = torch.full(l_shape, math.nan, device=out.device)
    launch_decode(
        lib,
        **paged_tensors(case),
        out=out,
        scale=scale * (case.k_scale if fp8 else 1.0),
        v_scale=case.v_scale if fp8 else 1.0,
        kv_cache_dtype=case.kv_cache_dtype,
        num_partitions=num_partitions,
        partition_size=partition_size,
        alibi_slopes=alibi_slopes,
        part_out=part_out,
        part_lse=part_lse,
        stream=stream,
    )
    return out


def reference(case: PagedCase, *, scale=None, alibi_slopes=None) -> torch.Tensor:
    return reference_decode(
        case.query.cpu(),
        case.key_cache.cpu(),
        case.value_cache.cpu(),
        case.block_tables.cpu(),
        case.seq_lens.cpu(),
        scale,
        None if alibi_slopes is None else alibi_slopes.cpu(),
        case.kv_cache_dtype,
        case.k_scale,
        case.v_scale,
    )


def cuda_case(lens, heads, kv_heads, head_size, block_size, dtype, **kwargs) -> PagedCase:
    case = make_paged_case(lens, heads, kv_heads, head_size, block_size, dtype, "cuda", **kwargs)
    poison_tails(case)
    return case


def fp8_paged_case(
    make_case: Callable[..., PagedCase],
    lens: list[int],
    head_size: int,
    block_size: int,
    dtype: torch.dtype,
    kv_cache_dtype: str,
) -> PagedCase:
    """The fp8-cache family's case (8 / 2 heads, k_scale 0.37, v_scale 1.9) from ``make_case``
    (:func:`cuda_case` or the host-emulation suite's); skips where torch has no float8."""
    skip_without_float8()
    return make_case(
        lens, 8, 2, head_size, block_size, dtype,
        kv_cache_dtype=kv_cache_dtype, k_scale=0.37, v_scale=1.9,
    )  # fmt: skip


def assert_split_and_whole(
    run: Callable[..., torch.Tensor],
    case: PagedCase,
    split: tuple[int, int],
    whole: int,
    dtype: torch.dtype,
) -> None:
    """``run`` (:func:`run_native` or the host-emulated one) over ``split`` (partitions, tokens
    each) and over one partition of ``whole`` tokens, each against the reference."""
    want = reference(case)
    assert_close(run(case, *split), want, dtype)
    assert_close(run(case, 1, whole), want, dtype)


def assert_fused_qkv_query_and_out(
    make_case: Callable[..., PagedCase], run: Callable[..., torch.Tensor]
) -> None:
    """vLLM slices q out of a fused qkv projection and passes an ``empty_like`` of it as out:
    ``run`` (:func:`run_native` or the host-emulated one) on such strided tensors from a
    ``make_case`` case matches the reference."""
    case = make_case([77, 512], 8, 2, 128, 16, torch.float16)
    out = slice_query_from_fused_qkv(case)
    run(case, 2, 256, out=out)
    assert_close(out, reference(case), torch.float16)


def slice_query_from_fused_qkv(case: PagedCase) -> torch.Tensor:
    """Replace ``case.query [S, H, D]`` by the first third of a fused qkv projection
    ``[S, 3 H, D]`` holding the same values, as vLLM slices q; returns a NaN ``out`` strided
    like it (the next third of a tensor shaped like the projection)."""
    num_seqs, heads, head_size = case.query.shape
    qkv = torch.randn(
        num_seqs, 3 * heads, head_size, dtype=case.query.dtype, device=case.query.device
    )
    qkv[:, :heads] = case.query
    case.query = qkv[:, :heads]
    return torch.full_like(qkv, math.nan)[:, heads : 2 * heads]
