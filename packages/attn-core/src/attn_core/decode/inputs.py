"""One decode step's inputs, validated once and handed to whichever executor the plan names.

The executors (:mod:`attn_core.decode.torch_path`, :mod:`attn_core.decode.native_step`) and the
native launch take this one object instead of a dozen arguments each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from attn_core.core.cache_layout import CacheLayout


@dataclass(frozen=True)
class DecodeInputs:
    """Attributes:
    query: ``[num_seqs, num_heads, head_size]``.
    key_cache: ``[num_blocks, num_kv_heads, head_size // x, block_size, x]``.
    value_cache: ``[num_blocks, num_kv_heads, head_size, block_size]``.
    block_tables: ``[num_seqs, max_blocks]`` int32; seq_lens: ``[num_seqs]`` int32.
    layout: the caches' :class:`CacheLayout` (sizes, cache dtype).
    scale: the softmax scale (resolved: never None).
    k_scale / v_scale: fp8 cache scales as Python floats (1.0 for other caches' callers).
    alibi_slopes: ``[num_heads]`` float32 or None.
    """

    query: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    layout: CacheLayout
    scale: float
    k_scale: float
    v_scale: float
    alibi_slopes: Optional[torch.Tensor] = None
