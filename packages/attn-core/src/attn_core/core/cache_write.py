"""Writing new tokens' K/V into the paged cache: what vLLM's ``reshape_and_cache`` does.

Slot ``s`` is token offset ``s % block_size`` of block ``s // block_size``; negative slots
(padding) are skipped. fp8 caches store ``value /
scale`` (:func:`attn_core.core.cache_layout.quantize`).

No host sync: a skipped token is not filtered out (boolean indexing would read the mask to the
host, breaking CUDA-graph capture of decode steps); it is redirected to re-write a valid token's
slot with that token's own data, or, when no token in the call is valid, slot 0 with what slot 0
already holds. Duplicate writes then carry identical bytes, so the result is deterministic.

A cache of zero blocks has no valid slot: the call is a no-op when every slot is negative (vLLM's
padding), and with ``ATTN_CORE_CHECKS=1`` a non-negative slot raises. Without checks a
non-negative slot there is skipped as well (there is no block to write it to, and telling it
apart would read ``slot_mapping``).
"""

from __future__ import annotations

import torch

from attn_core.core.cache_layout import COMPUTE_DTYPES, quantize, validate_caches
from attn_core.core.checks import check_positive_finite, check_tensor, value_checks_enabled


def write_to_paged_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str = "auto",
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Store ``key``/``value`` of each token at its slot, in place.

    Args:
        key, value: ``[num_tokens, num_kv_heads, head_size]`` fp16/bf16/fp32.
        key_cache: ``[num_blocks, num_kv_heads, head_size // x, block_size, x]``.
        value_cache: ``[num_blocks, num_kv_heads, head_size, block_size]``.
        slot_mapping: ``[num_tokens]`` int64 or int32; negative entries are skipped.
        kv_cache_dtype / k_scale / v_scale: "auto" (caches hold key's dtype) or an fp8 name.

    Always checked: shapes, dtypes, devices, ``k_scale`` / ``v_scale`` finite and > 0. With
    ``ATTN_CORE_CHECKS=1`` slots beyond the cache raise ``ValueError`` (a value check that
    syncs); otherwise they are an indexing error on the CPU and a device assert on a GPU.
    """
    check_tensor("key", key, ndim=3, dtype=COMPUTE_DTYPES)
    device = key.device
    layout = validate_caches(
        key_cache,
        value_cache,
        kv_cache_dtype,
        compute_dtype=key.dtype,
        device=device,
        compute_name="key",
    )
    num_tokens = key.shape[0]
    shape = (num_tokens, layout.num_kv_heads, layout.head_size)
    check_tensor("key", key, shape=shape)
    check_tensor("value", value, shape=shape, dtype=key.dtype, device=device)
    check_tensor(
        "slot_mapping",
        slot_mapping,
        shape=(num_tokens,),
        dtype=(torch.int64, torch.int32),
        device=device,
    )
    check_positive_finite("k_scale", k_scale)
    check_positive_finite("v_scale", v_scale)
    if num_tokens == 0:
        return
    capacity = layout.num_blocks * layout.block_size
    slots = slot_mapping.long()
    if value_checks_enabled() and bool((slots >= capacity).any()):
        raise ValueError(
            f"slot_mapping must be < num_blocks * block_size = {capacity} (negative: skipped), "
            f"got {int(slots.max())}"
        )
    if layout.num_blocks == 0:  # nothing can be written (see the module docstring)
        return
    k = quantize(key, kv_cache_dtype, float(k_scale), layout.storage_dtype)
    v = quantize(value, kv_cache_dtype, float(v_scale), layout.storage_dtype)
    # [tokens, kvh, hs] -> the layout's per-slot pieces: key [kvh, hs/x, x], value [kvh, hs].
    k = k.view(num_tokens, layout.num_kv_heads, layout.head_size // layout.x, layout.x)
    if layout.is_fp8 and key_cache.dtype != torch.uint8:
        # float8-typed caches: move bytes (torch.where/index_put lack float8 kernels on some
        # builds); uint8 views alias the same storage.
        key_cache, value_cache = key_cache.view(torch.uint8), value_cache.view(torch.uint8)
        k, v = k.view(torch.uint8), v.view(torch.uint8)
    slots, k, v = _redirect_skipped(slots, k, v, key_cache, value_cache)
    blocks, offsets = slots // layout.block_size, slots % layout.block_size
    key_cache[blocks, :, :, offsets, :] = k
    value_cache[blocks, :, :, offsets] = v


def _redirect_skipped(
    slots: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Point negative slots at a harmless duplicate write (see the module docstring)."""
    valid = slots >= 0
    any_valid = valid.any()
    donor = valid.int().argmax().view(1)  # first valid token (0 when none is)
    # Fallback when nothing is valid: slot 0, rewritten with its current contents.
    slot0_k = key_cache[0, :, :, 0, :].unsqueeze(0)
    slot0_v = value_cache[0, :, :, 0].unsqueeze(0)
    fill_slot = torch.where(any_valid, slots.index_select(0, donor), torch.zeros_like(donor))
    fill_k = torch.where(any_valid, k.index_select(0, donor), slot0_k)
    fill_v = torch.where(any_valid, v.index_select(0, donor), slot0_v)
    slots = torch.where(valid, slots, fill_slot)
    k = torch.where(valid.view(-1, 1, 1, 1), k, fill_k)
    v = torch.where(valid.view(-1, 1, 1), v, fill_v)
    return slots, k, v
