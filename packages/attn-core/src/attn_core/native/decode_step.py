"""The native backend of ``paged_decode``'s executor: one planned step's launches.

``run_native_decode`` launches the kernel(s) with the partials taken from the caller's
:class:`~attn_core.workspace.Workspace`, so a steady step allocates nothing and can be captured
in a CUDA graph. Whether a plan may take the native backend is :mod:`.readiness`'s answer.
"""

from __future__ import annotations

from typing import Optional

import torch

from attn_core.native.launch import launch_decode, layout_supported
from attn_core.native.library import NativeLibrary
from attn_core.native.split import NativeSplit
from attn_core.workspace import Workspace


def run_native_decode(
    lib: NativeLibrary,
    split: NativeSplit,
    *,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    scale: float,
    k_scale: float,
    v_scale: float,
    kv_cache_dtype: str,
    workspace: Workspace,
    alibi_slopes: Optional[torch.Tensor] = None,
) -> None:
    """Write ``out`` ``[num_seqs, num_heads, head_size]`` with ``split``'s launches.

    Shapes, dtypes and devices are the caller's validated ones; ``block_tables`` and
    ``seq_lens`` must be int32 (vLLM's), contiguous in their last dimension.
    """
    why = layout_supported(query, key_cache, value_cache, out)
    if why:
        raise ValueError(f"native decode: {why}")
    num_seqs, num_heads, head_size = query.shape
    part_out = part_lse = None
    if split.merged:
        out_shape, lse_shape = split.partials_shapes(num_seqs, num_heads, head_size)
        part_out = workspace.take("native_part_out", out_shape, torch.float32, query.device)
        part_lse = workspace.take("native_part_lse", lse_shape, torch.float32, query.device)
    fp8 = kv_cache_dtype != "auto"
    launch_decode(
        lib,
        query=query,
        key_cache=key_cache,
        value_cache=value_cache,
        block_tables=block_tables,
        seq_lens=seq_lens,
        out=out,
        scale=scale * (k_scale if fp8 else 1.0),
        v_scale=v_scale if fp8 else 1.0,
        kv_cache_dtype=kv_cache_dtype,
        num_partitions=split.num_partitions,
        partition_size=split.partition_size,
        alibi_slopes=alibi_slopes,
        part_out=part_out,
        part_lse=part_lse,
    )
