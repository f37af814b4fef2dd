"""A stand-in vLLM with the vendor fork's signatures (and an upstream variant), as modules.

The vendor's BI-V100 build is not installable here, so these modules give engine-patch what
matters about it: ``_custom_ops`` functions with the fork's documented parameters, a V1 that
computes (through the float64 reference, recording its calls) and a V2 that raises
``NotImplementedError`` as the platform's does; a ``PagedAttention`` with fork-style
``forward_decode`` / ``forward_prefix``; a selector with ``which_attn_to_use`` and a cached
``get_attn_backend``; a Triton ``context_attention_fwd``; a plugin loader.
"""

from __future__ import annotations

import enum
import functools
import sys
import types
from typing import Optional

import torch
from ep_helpers import forget_vllm

from attn_core.reference import reference_decode

CALLS: list[str] = []


class Backend(enum.Enum):
    FLASH_ATTN = enum.auto()
    XFORMERS = enum.auto()
    ROCM_FLASH = enum.auto()


def vendor_ops(v2: str = "raises") -> types.ModuleType:
    """The fork's ``_custom_ops``; ``v2``: "raises" (as on BI-V100), "works" or "wrong"."""
    ops = types.ModuleType("vllm._custom_ops")

    def paged_attention_v1(
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
        CALLS.append("native_v1")
        ref = reference_decode(
            query, key_cache, value_cache, block_tables, context_lens, scale, alibi_slopes
        )
        output.copy_(ref.to(output.dtype))

    def paged_attention_v2(
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
        CALLS.append("native_v2")
        if v2 == "raises":
            raise NotImplementedError("paged_attention_v2 is not supported on this platform")
        ref = reference_decode(
            query, key_cache, value_cache, block_tables, context_lens, scale, alibi_slopes
        )
        out.copy_(ref.to(out.dtype) * (0.5 if v2 == "wrong" else 1.0))

    def reshape_and_cache(
        key: torch.Tensor,
        value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        kv_cache_dtype: str,
    ) -> None:
        raise NotImplementedError

    ops.paged_attention_v1 = paged_attention_v1
    ops.paged_attention_v2 = paged_attention_v2
    ops.reshape_and_cache = reshape_and_cache
    return ops


class VendorPagedAttention:
    """Fork-style: ``head_mapping``/``context_lens`` names, V1 only (V2 is missing there)."""

    @staticmethod
    def write_to_paged_cache(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype):
        sys.modules["vllm._custom_ops"].reshape_and_cache(
            key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype
        )

    @staticmethod
    def forward_decode(
        query,
        key_cache,
        value_cache,
        block_tables,
        context_lens,
        max_context_len,
        kv_cache_dtype,
        head_mapping,
        scale,
        alibi_slopes,
    ):
        raise AssertionError("the original forward_decode must not run once patched")

    @staticmethod
    def forward_prefix(
        query,
        key,
        value,
        kv_cache_dtype,
        key_cache,
        value_cache,
        block_tables,
        query_start_loc,
        seq_lens_tensor,
        context_lens,
        max_query_len,
        alibi_slopes,
        sliding_window,
        k_scale,
        v_scale,
    ):
        context_attention_fwd()


def context_attention_fwd(*args, **kwargs):
    CALLS.append("triton_context_attention_fwd")


def install(monkeypatch, *, plugins=None, ops: Optional[types.ModuleType] = None) -> dict:
    """Put the fake vLLM into ``sys.modules`` for one test (``monkeypatch`` undoes it)."""
    CALLS.clear()
    forget_vllm(monkeypatch)
    mods = {
        name: types.ModuleType(name)
        for name in (
            "vllm",
            "vllm.attention",
            "vllm.attention.ops",
            "vllm.attention.ops.paged_attn",
            "vllm.attention.ops.prefix_prefill",
            "vllm.attention.selector",
            "vllm.attention.layer",
            "vllm.plugins",
        )
    }
    mods["vllm._custom_ops"] = ops if ops is not None else vendor_ops()
    paged = mods["vllm.attention.ops.paged_attn"]
    paged.PagedAttention = type("PagedAttention", (VendorPagedAttention,), {})
    paged.PagedAttention.forward_decode = VendorPagedAttention.__dict__["forward_decode"]
    paged.PagedAttention.forward_prefix = VendorPagedAttention.__dict__["forward_prefix"]
    paged.context_attention_fwd = context_attention_fwd
    mods["vllm.attention.ops.prefix_prefill"].context_attention_fwd = context_attention_fwd
    selector = mods["vllm.attention.selector"]
    selector._Backend = Backend
    selector.chosen = Backend.XFORMERS

    def which_attn_to_use(head_size, sliding_window, dtype, kv_cache_dtype, block_size, free):
        return selector.chosen

    @functools.cache
    def get_attn_backend(
        head_size,
        sliding_window,
        dtype,
        kv_cache_dtype,
        block_size,
        is_attention_free,
        is_blocksparse=False,
    ):
        return selector.which_attn_to_use(
            head_size, sliding_window, dtype, kv_cache_dtype, block_size, is_attention_free
        )

    selector.which_attn_to_use = which_attn_to_use
    selector.get_attn_backend = get_attn_backend
    mods["vllm.attention.layer"].get_attn_backend = get_attn_backend  # imported by name
    mods["vllm.plugins"].load_general_plugins = plugins or (lambda: None)
    for name, module in mods.items():
        monkeypatch.setitem(sys.modules, name, module)
    return mods
