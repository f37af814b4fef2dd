"""attn-core behind ``_custom_ops``' signatures, one function per op and calling convention.

Each function has exactly the parameters of the op it stands in for (vLLM calls them
positionally), checks what attn-core cannot see (``block_size``, ``num_kv_heads`` /
``head_mapping`` against the caches) and writes the result into the caller's output tensor.
V2's scratch outputs (``exp_sum``, ``max_logits``, ``tmp_out``) are left untouched: vLLM only
reads ``out``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Optional

import torch

import attn_core
from attn_core.core.checks import check_tensor, value_checks_enabled


@functools.lru_cache(maxsize=32)
def head_mapping(num_heads: int, num_kv_heads: int, device: torch.device) -> torch.Tensor:
    """The fork's ``head_mapping [num_heads]`` for the standard grouped layout (cached)."""
    group = num_heads // num_kv_heads
    return torch.arange(num_heads, dtype=torch.int32, device=device) // group


def _check_block_size(block_size: int, value_cache: torch.Tensor) -> None:
    actual = value_cache.shape[-1] if value_cache.dim() == 4 else None
    if block_size != actual:
        raise ValueError(
            f"block_size must equal value_cache.shape[3] ({actual}), got {block_size!r}"
        )


def _check_num_kv_heads(num_kv_heads: int, key_cache: torch.Tensor) -> None:
    actual = key_cache.shape[1] if key_cache.dim() == 5 else None
    if num_kv_heads != actual:
        raise ValueError(
            f"num_kv_heads must equal key_cache.shape[1] ({actual}), got {num_kv_heads!r}"
        )


def check_head_mapping(
    head_mapping: torch.Tensor, query: torch.Tensor, key_cache: torch.Tensor
) -> None:
    """The fork's ``head_mapping [num_heads]``: attn-core serves the standard GQA mapping
    ``h -> h // (num_heads // num_kv_heads)``; its values are compared only with
    ``ATTN_CORE_CHECKS=1`` (reading them syncs the device)."""
    num_heads = query.shape[1]
    check_tensor("head_mapping", head_mapping, shape=(num_heads,))
    num_kv_heads = key_cache.shape[1]
    if num_heads % num_kv_heads:
        raise ValueError(
            f"num_heads ({num_heads}) must be a multiple of key_cache.shape[1] ({num_kv_heads})"
        )
    if value_checks_enabled():
        group = num_heads // num_kv_heads
        want = torch.arange(num_heads, device=head_mapping.device) // group
        if not torch.equal(head_mapping.to(want.dtype), want):
            raise ValueError(
                f"head_mapping must be the grouped mapping {want.tolist()}, "
                f"got {head_mapping.tolist()}"
            )


def _refuse_blocksparse(blocksparse_vert_stride: int) -> None:
    if blocksparse_vert_stride is not None and blocksparse_vert_stride > 1:
        raise ValueError(
            "blocksparse_vert_stride must be 0 or 1 for attn-core (it has no block-sparse "
            f"decode; only the platform's native kernel does), got {blocksparse_vert_stride}"
        )


def decode_into(
    out: torch.Tensor,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    scale: float,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    alibi_slopes: Optional[torch.Tensor],
    kv_cache_dtype: str,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """attn-core decode written into ``out [num_seqs, num_heads, head_size]``."""
    attn_core.paged_decode(
        query,
        key_cache,
        value_cache,
        block_tables,
        seq_lens,
        max_seq_len,
        scale,
        alibi_slopes=alibi_slopes,
        kv_cache_dtype=kv_cache_dtype,
        k_scale=k_scale,
        v_scale=v_scale,
        out=out,
    )


# --- vLLM 0.6.3 upstream conventions --------------------------------------------------------


def upstream_paged_attention_v1(
    out: torch.Tensor,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    num_kv_heads: int,
    scale: float,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    max_seq_len: int,
    alibi_slopes: Optional[torch.Tensor],
    kv_cache_dtype: str,
    k_scale: float,
    v_scale: float,
    tp_rank: int = 0,
    blocksparse_local_blocks: int = 0,
    blocksparse_vert_stride: int = 0,
    blocksparse_block_size: int = 64,
    blocksparse_head_sliding_step: int = 0,
) -> None:
    _refuse_blocksparse(blocksparse_vert_stride)
    _check_num_kv_heads(num_kv_heads, key_cache)
    _check_block_size(block_size, value_cache)
    decode_into(
        out,
        query,
        key_cache,
        value_cache,
        scale,
        block_tables,
        seq_lens,
        max_seq_len,
        alibi_slopes,
        kv_cache_dtype,
        k_scale,
        v_scale,
    )


def upstream_paged_attention_v2(
    out: torch.Tensor,
    exp_sum: torch.Tensor,
    max_logits: torch.Tensor,
    tmp_out: torch.Tensor,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    num_kv_heads: int,
    scale: float,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    max_seq_len: int,
    alibi_slopes: Optional[torch.Tensor],
    kv_cache_dtype: str,
    k_scale: float,
    v_scale: float,
    tp_rank: int = 0,
    blocksparse_local_blocks: int = 0,
    blocksparse_vert_stride: int = 0,
    blocksparse_block_size: int = 64,
    blocksparse_head_sliding_step: int = 0,
) -> None:
    upstream_paged_attention_v1(
        out,
        query,
        key_cache,
        value_cache,
        num_kv_heads,
        scale,
        block_tables,
        seq_lens,
        block_size,
        max_seq_len,
        alibi_slopes,
        kv_cache_dtype,
        k_scale,
        v_scale,
        tp_rank,
        blocksparse_local_blocks,
        blocksparse_vert_stride,
        blocksparse_block_size,
        blocksparse_head_sliding_step,
    )


def upstream_reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str,
    k_scale: float,
    v_scale: float,
) -> None:
    attn_core.write_to_paged_cache(
        key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale
    )


# --- the vendor fork's conventions ----------------------------------------------------------


def vendor_paged_attention_v1(
    output: torch.Tensor,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    head_mapping: torch.Tensor,
    scale: float,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    block_size: int,
    max_context_len: int,
    alibi_slopes: Optional[torch.Tensor],
    kv_cache_dtype: str,
) -> None:
    check_head_mapping(head_mapping, query, key_cache)
    _check_block_size(block_size, value_cache)
    decode_into(
        output,
        query,
        key_cache,
        value_cache,
        scale,
        block_tables,
        context_lens,
        max_context_len,
        alibi_slopes,
        kv_cache_dtype,
    )


def vendor_paged_attention_v2(
    out: torch.Tensor,
    exp_sums: torch.Tensor,
    max_logits: torch.Tensor,
    tmp_out: torch.Tensor,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    head_mapping: torch.Tensor,
    scale: float,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    block_size: int,
    max_context_len: int,
    alibi_slopes: Optional[torch.Tensor],
    kv_cache_dtype: str,
) -> None:
    vendor_paged_attention_v1(
        out,
        query,
        key_cache,
        value_cache,
        head_mapping,
        scale,
        block_tables,
        context_lens,
        block_size,
        max_context_len,
        alibi_slopes,
        kv_cache_dtype,
    )


def vendor_reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str,
) -> None:
    attn_core.write_to_paged_cache(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype)


REPLACEMENTS: dict[tuple[str, str], Callable[..., Any]] = {
    ("paged_attention_v1", "upstream"): upstream_paged_attention_v1,
    ("paged_attention_v2", "upstream"): upstream_paged_attention_v2,
    ("reshape_and_cache", "upstream"): upstream_reshape_and_cache,
    ("paged_attention_v1", "vendor"): vendor_paged_attention_v1,
    ("paged_attention_v2", "vendor"): vendor_paged_attention_v2,
    ("reshape_and_cache", "vendor"): vendor_reshape_and_cache,
}
