"""The attention shape a plan is made for: one layer's heads, head size, block size and dtypes.

One class for the whole repository: engine-patch's ``status``, the simulator's workloads and
designs and the HIL suites describe the model they plan or test for with it. Under tensor
parallelism it is one rank's slice (Qwen3.6 at TP 4: 6 query heads, 1 KV head).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attn_core.core.cache_layout import (
    COMPUTE_DTYPES,
    KV_CACHE_DTYPES,
    SUPPORTED_BLOCK_SIZES,
    SUPPORTED_HEAD_SIZES,
    vector_width,
)

DTYPE_NAMES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
# Bytes per element of the compute dtypes, without allocating a tensor to ask (the decode entry
# point builds a shape on every call).
_ELEMENT_SIZES = {torch.float16: 2, torch.bfloat16: 2, torch.float32: 4}


def dtype_from_name(name: str) -> torch.dtype:
    """``"float16"`` -> ``torch.float16``; a clear error for anything else."""
    try:
        return DTYPE_NAMES[name]
    except KeyError:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_NAMES)}, got {name!r}") from None


def _positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class AttentionShape:
    """One attention layer as attn-core sees it.

    Attributes:
        num_heads: query heads.
        num_kv_heads: KV heads; ``num_heads`` must be a multiple (GQA group = the ratio).
        head_size: one of :data:`attn_core.core.cache_layout.SUPPORTED_HEAD_SIZES`.
        block_size: tokens per cache block, one of ``SUPPORTED_BLOCK_SIZES``.
        dtype: the query / compute dtype (fp16, bf16 or fp32).
        kv_cache_dtype: ``"auto"`` (the cache holds ``dtype``) or an fp8 name.
    """

    num_heads: int = 24
    num_kv_heads: int = 4
    head_size: int = 256
    block_size: int = 16
    dtype: torch.dtype = torch.float16
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        for name in ("num_heads", "num_kv_heads", "head_size", "block_size"):
            _positive(name, getattr(self, name))
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads must be a multiple of num_kv_heads ({self.num_kv_heads}), "
                f"got {self.num_heads}"
            )
        if self.head_size not in SUPPORTED_HEAD_SIZES:
            raise ValueError(
                f"head_size must be one of {SUPPORTED_HEAD_SIZES}, got {self.head_size}"
            )
        if self.block_size not in SUPPORTED_BLOCK_SIZES:
            raise ValueError(
                f"block_size must be one of {SUPPORTED_BLOCK_SIZES}, got {self.block_size}"
            )
        if self.dtype not in COMPUTE_DTYPES:
            raise ValueError(f"dtype must be one of {COMPUTE_DTYPES}, got {self.dtype}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}"
            )
        if self.head_size % self.x:
            raise ValueError(
                f"head_size {self.head_size} is not a multiple of the key layout's vector "
                f"width x = {self.x} for a {self.cache_element_size}-byte cache element"
            )

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.num_heads // self.num_kv_heads

    @property
    def element_size(self) -> int:
        """Bytes of one query / compute element."""
        return _ELEMENT_SIZES[self.dtype]

    @property
    def cache_element_size(self) -> int:
        """Bytes of one cache element (1 for fp8)."""
        return 1 if self.kv_cache_dtype != "auto" else self.element_size

    @property
    def x(self) -> int:
        """The key layout's vector width: ``16 // cache_element_size``."""
        return vector_width(self.cache_element_size)

    def kv_bytes(self, tokens: int) -> int:
        """Bytes of K and V for ``tokens`` cached tokens of one sequence."""
        return 2 * self.num_kv_heads * tokens * self.head_size * self.cache_element_size


QWEN36 = AttentionShape()  # 24 / 4 heads, head 256, block 16, fp16: the platform's target model
