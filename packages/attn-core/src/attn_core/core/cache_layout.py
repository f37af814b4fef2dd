"""vLLM 0.6.3's paged KV-cache layout, its dtypes, and reading tokens out of it.

Layout (one layer)::

    key_cache   [num_blocks, num_kv_heads, head_size // x, block_size, x]
    value_cache [num_blocks, num_kv_heads, head_size, block_size]
    x = 16 // key_cache.element_size()      # 16-byte vectors along head_size

Token ``t`` of a sequence lives in block ``block_tables[seq, t // block_size]`` at offset
``t % block_size``. fp8 caches are stored as ``uint8`` and reinterpreted as a float8 dtype, then
scaled by ``k_scale`` / ``v_scale`` (vLLM's convention: stored = real / scale).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attn_core.core.checks import check_tensor

# Head sizes vLLM 0.6.3's paged-attention kernels are instantiated for.
SUPPORTED_HEAD_SIZES = (64, 80, 96, 112, 120, 128, 192, 256)
SUPPORTED_BLOCK_SIZES = (8, 16, 32)
COMPUTE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")


def vector_width(element_size: int) -> int:
    """``x`` of the key layout: how many elements make one 16-byte vector."""
    return 16 // element_size


def fp8_dtype(kv_cache_dtype: str) -> torch.dtype:
    """The float8 dtype an fp8 cache holds; a clear error where torch has none (torch < 2.1)."""
    name = {"fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}.get(
        kv_cache_dtype
    )
    if name is None:
        raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}")
    dtype = getattr(torch, name, None)
    if dtype is None:
        raise ValueError(
            f"kv_cache_dtype={kv_cache_dtype!r} needs torch.{name}, "
            f"which torch {torch.__version__} does not have"
        )
    return dtype


@dataclass(frozen=True)
class CacheLayout:
    """Sizes read off a validated (key_cache, value_cache) pair."""

    num_blocks: int
    num_kv_heads: int
    head_size: int
    block_size: int
    x: int
    storage_dtype: torch.dtype  # what the cache tensors hold (uint8 for fp8)
    kv_cache_dtype: str  # "auto" or an fp8 name

    @property
    def is_fp8(self) -> bool:
        return self.kv_cache_dtype != "auto"


def validate_caches(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    kv_cache_dtype: str,
    *,
    compute_dtype: torch.dtype,
    device: torch.device,
    compute_name: str = "query",
) -> CacheLayout:
    """Check both caches against vLLM's layout and return their sizes.

    ``compute_dtype`` is the dtype of argument ``compute_name`` (the query's; the key's for
    cache writes): with ``kv_cache_dtype="auto"`` the caches must hold it.
    """
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}")
    if kv_cache_dtype == "auto":
        storage = compute_dtype
    else:
        fp8_dtype(kv_cache_dtype)  # raises where torch lacks float8
        storage = torch.uint8
    check_tensor("key_cache", key_cache, ndim=5, device=device)
    if key_cache.dtype != storage and not (
        kv_cache_dtype != "auto" and key_cache.dtype == fp8_dtype(kv_cache_dtype)
    ):
        raise ValueError(
            f"key_cache must be {storage} for kv_cache_dtype={kv_cache_dtype!r} and "
            f"{compute_name} dtype {compute_dtype}, got {key_cache.dtype}"
        )
    num_blocks, num_kv_heads, head_chunks, block_size, x = key_cache.shape
    if num_kv_heads < 1:  # every GQA group size divides by it
        raise ValueError(
            "key_cache's num_kv_heads (dimension 1) must be >= 1, got shape "
            f"{tuple(key_cache.shape)}"
        )
    want_x = vector_width(key_cache.element_size())
    if x != want_x:
        raise ValueError(
            f"key_cache's last dimension must be x = 16 // element_size = {want_x}, got {x}"
        )
    head_size = head_chunks * x
    if head_size not in SUPPORTED_HEAD_SIZES:
        raise ValueError(
            f"key_cache's head_size must be one of {SUPPORTED_HEAD_SIZES}, got {head_size} "
            f"(shape[2] * shape[4] = {head_chunks} * {x})"
        )
    if block_size not in SUPPORTED_BLOCK_SIZES:
        raise ValueError(
            f"key_cache's block_size must be one of {SUPPORTED_BLOCK_SIZES}, got {block_size} "
            "(shape[3])"
        )
    check_tensor(
        "value_cache",
        value_cache,
        shape=(num_blocks, num_kv_heads, head_size, block_size),
        dtype=key_cache.dtype,
        device=device,
    )
    return CacheLayout(
        num_blocks=num_blocks,
        num_kv_heads=num_kv_heads,
        head_size=head_size,
        block_size=block_size,
        x=x,
        storage_dtype=key_cache.dtype,
        kv_cache_dtype=kv_cache_dtype,
    )


def dequantize(
    stored: torch.Tensor, kv_cache_dtype: str, scale: float, out_dtype: torch.dtype
) -> torch.Tensor:
    """Turn cache elements into ``out_dtype`` values (identity for "auto" caches).

    Args:
        stored: any shape, the cache's storage dtype (uint8 or float8 for fp8 caches).
    """
    if kv_cache_dtype == "auto":
        return stored if stored.dtype == out_dtype else stored.to(out_dtype)
    f8 = fp8_dtype(kv_cache_dtype)
    values = stored.view(f8) if stored.dtype == torch.uint8 else stored
    values = values.to(out_dtype)
    return values * scale if scale != 1.0 else values


def quantize(
    values: torch.Tensor, kv_cache_dtype: str, scale: float, storage_dtype: torch.dtype
) -> torch.Tensor:
    """Inverse of :func:`dequantize`: values -> what the cache stores."""
    if kv_cache_dtype == "auto":
        return values.to(storage_dtype)
    f8 = fp8_dtype(kv_cache_dtype)
    scaled = values.float() / scale if scale != 1.0 else values.float()
    q = scaled.to(f8)
    return q.view(torch.uint8) if storage_dtype == torch.uint8 else q


def check_block_tables(
    block_tables: torch.Tensor, num_seqs: int, device: torch.device, name: str = "block_tables"
) -> int:
    """``block_tables [num_seqs, max_blocks]`` int32; returns ``max_blocks``."""
    check_tensor(name, block_tables, shape=(num_seqs, None), dtype=torch.int32, device=device)
    return block_tables.shape[1]
