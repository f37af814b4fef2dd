"""The native backend of ``paged_decode``'s executor: one planned step's launches.

``run_native_decode`` launches the kernel(s) of a resolved
:class:`~attn_core.decode.plan_native.NativeDecodePlan` (which carries the loaded, verified library)
with the partials taken from the caller's :class:`~attn_core.core.workspace.Workspace`, so a steady
step looks nothing up, allocates nothing and can be captured in a CUDA graph. It returns the
:class:`~attn_core.native.decode.PreparedDecode` it launched from, which a steady-state caller
(:mod:`attn_core.runtime.decode_steady`) keeps and launches from directly.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from attn_core.core.workspace import Workspace
from attn_core.decode.inputs import DecodeInputs
from attn_core.decode.plan_native import NativeDecodePlan
from attn_core.native.decode import PreparedDecode, layout_supported


def run_native_decode(
    plan: NativeDecodePlan, inputs: DecodeInputs, out: torch.Tensor, workspace: Workspace
) -> PreparedDecode:
    """Write ``out`` ``[num_seqs, num_heads, head_size]`` with the plan's launches.

    ``inputs`` are the caller's validated ones; ``block_tables`` and ``seq_lens`` must be int32
    (vLLM's), contiguous in their last dimension.
    """
    prepared = prepare_native_decode(plan, inputs, out)
    sizes = partial_sizes(plan, inputs.query)
    part_out, part_lse = native_partials(sizes, inputs.query.device, workspace)
    prepared.launch(
        inputs.query, inputs.key_cache, inputs.value_cache, inputs.block_tables,
        inputs.seq_lens, out, inputs.alibi_slopes, part_out, part_lse,
    )  # fmt: skip
    return prepared


def prepare_native_decode(
    plan: NativeDecodePlan, inputs: DecodeInputs, out: torch.Tensor
) -> PreparedDecode:
    """The plan's launch template for tensors shaped and strided like ``inputs`` and ``out``."""
    if plan.library is None:
        raise ValueError(
            "plan must be resolved for this device (attn_core.decode_plan_for attaches the "
            "verified native library), got a NativeDecodePlan without one"
        )
    query = inputs.query
    why = layout_supported(query, inputs.key_cache, inputs.value_cache, out)
    if why:
        raise ValueError(f"native decode: {why}")
    fp8 = inputs.layout.is_fp8
    return PreparedDecode(
        plan.library, query, inputs.key_cache, inputs.value_cache, inputs.block_tables, out,
        scale=inputs.scale * (inputs.k_scale if fp8 else 1.0),
        v_scale=inputs.v_scale if fp8 else 1.0, kv_cache_dtype=inputs.layout.kv_cache_dtype,
        num_partitions=plan.split.num_partitions, partition_size=plan.split.partition_size,
    )  # fmt: skip


def partial_sizes(plan: NativeDecodePlan, query: torch.Tensor) -> tuple[int, int]:
    """Elements of the fp32 partials (``part_out``, ``part_lse``); ``(0, 0)`` with one
    partition. A steady-state caller keeps this per plan (it depends on sizes only)."""
    if not plan.split.merged:
        return 0, 0
    out_shape, lse_shape = plan.split.partials_shapes(*query.shape)
    return math.prod(out_shape), math.prod(lse_shape)


def native_partials(
    sizes: tuple[int, int], device: torch.device, workspace: Workspace
) -> tuple[Optional[int], Optional[int]]:
    """Addresses of the partials of :func:`partial_sizes` in ``workspace``, or
    ``(None, None)`` when there are none."""
    if not sizes[0]:
        return None, None
    part_out = workspace.flat("native_part_out", sizes[0], torch.float32, device)
    part_lse = workspace.flat("native_part_lse", sizes[1], torch.float32, device)
    return part_out.data_ptr(), part_lse.data_ptr()
