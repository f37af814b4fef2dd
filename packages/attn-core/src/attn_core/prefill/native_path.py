"""Running a native prefill plan: the plan's launch, its partials from the workspace.

The plan (:class:`attn_core.prefill.plan_native.NativePrefillPlan`) carries the verified library,
the tile configuration and the split; the entry point (:func:`attn_core.paged_prefix_prefill`)
validated the call. This module only checks the call fits the plan and the kernel can read the
tensors' strides, takes the fp32 partials of a split call from the workspace (at most
``plan.workspace_bytes``) and launches (:func:`attn_core.native.prefill.launch_prefill`). No
host read: the lengths stay on the device (the kernel derives each sequence's from
``query_start_loc`` and ``context_lens``).
"""

from __future__ import annotations

import torch

from attn_core.core.workspace import Workspace
from attn_core.native import abi
from attn_core.native.prefill import launch_prefill, layout_supported
from attn_core.prefill.plan_native import NativePrefillPlan
from attn_core.prefill.problem import Problem


def run_native_prefill(
    plan: NativePrefillPlan,
    problem: Problem,
    lengths: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    max_query_len: int,
    max_context_len: int,
    out: torch.Tensor,
    workspace: Workspace,
) -> None:
    """Attend the chunk with ``plan``'s kernel; writes ``out`` in place.

    Args:
        lengths: ``(query_start_loc [num_seqs + 1], seq_lens [num_seqs], context_lens
            [num_seqs])`` on the device.
        max_query_len / max_context_len: the call's longest chunk and context (the plan must
            have been made for at least these).
        workspace: where the split's partials live.
    """
    if plan.library is None:
        raise ValueError("plan.library is None: resolve the native plan before running it")
    query = problem.query
    num_tokens, num_heads, head_size = query.shape
    num_seqs = lengths[2].shape[0]
    fits = (
        num_tokens <= plan.num_tokens and num_seqs <= plan.num_seqs
        and max_query_len <= plan.max_query_len and max_context_len <= plan.max_context_len
    )  # fmt: skip
    if not fits:
        raise ValueError(
            "plan must be made for at least this call's (num_tokens, num_seqs, max_query_len, "
            f"max_context_len) = {(num_tokens, num_seqs, max_query_len, max_context_len)}, got "
            f"{(plan.num_tokens, plan.num_seqs, plan.max_query_len, plan.max_context_len)}"
        )
    why = layout_supported(problem)
    if why:
        raise ValueError(f"native prefill: {why}")
    part_out = part_lse = None
    if plan.num_splits > 1:
        o_shape, l_shape = abi.partials_shapes(num_tokens, num_heads, plan.num_splits, head_size)
        part_out = workspace.take("native_prefill_part_out", o_shape, torch.float32, query.device)
        part_lse = workspace.take("native_prefill_part_lse", l_shape, torch.float32, query.device)
    query_start_loc, _, context_lens = lengths
    alibi = problem.alibi_slopes
    launch_prefill(
        plan.library, plan.launch, query, problem.key, problem.value, problem.key_cache,
        problem.value_cache, problem.block_tables, query_start_loc.to(torch.int32).contiguous(),
        context_lens.to(torch.int32).contiguous(), out, max_query_len=max_query_len,
        scale=problem.scale, alibi_slopes=alibi.contiguous() if alibi is not None else None,
        sliding_window=problem.window, kv_cache_dtype=problem.layout.kv_cache_dtype,
        k_scale=problem.k_scale, v_scale=problem.v_scale, part_out=part_out, part_lse=part_lse,
    )  # fmt: skip
