"""The native backend of ``paged_decode``'s executor: one planned step's launches.

``run_native_decode`` launches the kernel(s) of a resolved
:class:`~attn_core.decode.plan_native.NativeDecodePlan` (which carries the loaded, verified library)
with the partials taken from the caller's :class:`~attn_core.core.workspace.Workspace`, so a steady
step looks nothing up, allocates nothing and can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch

from attn_core.core.workspace import Workspace
from attn_core.decode.inputs import DecodeInputs
from attn_core.decode.plan_native import NativeDecodePlan
from attn_core.native.launch import launch_decode, layout_supported


def run_native_decode(
    plan: NativeDecodePlan, inputs: DecodeInputs, out: torch.Tensor, workspace: Workspace
) -> None:
    """Write ``out`` ``[num_seqs, num_heads, head_size]`` with the plan's launches.

    ``inputs`` are the caller's validated ones; ``block_tables`` and ``seq_lens`` must be int32
    (vLLM's), contiguous in their last dimension.
    """
    if plan.library is None:
        raise ValueError(
            "plan must be resolved for this device (attn_core.decode_plan_for attaches the "
            "verified native library), got a NativeDecodePlan without one"
        )
    query = inputs.query
    why = layout_supported(query, inputs.key_cache, inputs.value_cache, out)
    if why:
        raise ValueError(f"native decode: {why}")
    split = plan.split
    part_out = part_lse = None
    if split.merged:
        num_seqs, num_heads, head_size = query.shape
        out_shape, lse_shape = split.partials_shapes(num_seqs, num_heads, head_size)
        part_out = workspace.take("native_part_out", out_shape, torch.float32, query.device)
        part_lse = workspace.take("native_part_lse", lse_shape, torch.float32, query.device)
    fp8 = inputs.layout.is_fp8
    launch_decode(
        plan.library,
        query=query,
        key_cache=inputs.key_cache,
        value_cache=inputs.value_cache,
        block_tables=inputs.block_tables,
        seq_lens=inputs.seq_lens,
        out=out,
        scale=inputs.scale * (inputs.k_scale if fp8 else 1.0),
        v_scale=inputs.v_scale if fp8 else 1.0,
        kv_cache_dtype=inputs.layout.kv_cache_dtype,
        num_partitions=split.num_partitions,
        partition_size=split.partition_size,
        alibi_slopes=inputs.alibi_slopes,
        part_out=part_out,
        part_lse=part_lse,
    )
