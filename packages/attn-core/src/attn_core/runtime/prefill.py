"""Chunked prefill over a paged prefix: what vLLM 0.6.3's ``PagedAttention.forward_prefix`` does.

validate -> plan -> execute (torch, fused or native backend). The plan is resolved once
(:func:`prefill_plan_for`: profile, capabilities narrowed to verified fused backends and
native variants, overrides; then the pure :func:`attn_core.plan_prefill`) per shape, bucketed
lengths (:func:`attn_core.prefill.plan.lengths_bucket`), features, ``backend`` and
settings generation, then reused: vLLM calls once per layer per chunk, and a steady-state call
reads no environment and enters no resolver code (``tests/test_prefill_steady_state.py``).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from attn_core.core.checks import check_backend, check_out, check_type
from attn_core.core.settings import PREFILL_BACKENDS, generation
from attn_core.core.shapes import AttentionShape
from attn_core.core.workspace import Workspace, check_workspace
from attn_core.prefill.inputs import validate_prefill
from attn_core.prefill.plan import (
    AnyPrefillPlan,
    PrefillPlan,
    large_scale_dtypes,
)
from attn_core.prefill.problem import Problem, SeqSpan
from attn_core.prefill.runners import RUNNERS, PrefillCall, runner_of
from attn_core.prefill.verify import ensure_verified
from attn_core.runtime import resolve
from attn_core.runtime.resolve import prefill_plan_for as prefill_plan_for  # public here too


def paged_prefix_prefill(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    context_lens: torch.Tensor,
    max_query_len: int,
    scale: Optional[float] = None,
    *,
    alibi_slopes: Optional[torch.Tensor] = None,
    sliding_window: Optional[int] = None,
    kv_cache_dtype: str = "auto",
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    out: Optional[torch.Tensor] = None,
    plan: Optional[AnyPrefillPlan] = None,
    workspace: Optional[Workspace] = None,
    backend: Optional[str] = None,
) -> torch.Tensor:
    """Attention of a packed chunk of new tokens over each sequence's paged context and itself.

    Token ``i`` of sequence ``s`` (absolute position ``context_lens[s] + i``) attends to the
    sequence's ``context_lens[s]`` cached tokens and to the chunk's tokens ``<= i`` (causal,
    bottom-right aligned); with ``sliding_window = w > 0`` only to keys at positions
    ``> position - w``; with ALiBi the bias is ``slope[h] * (key_pos - query_pos)`` (vLLM's
    xformers prefill). Query heads ``h`` use KV head ``h // (heads // kv_heads)``.

    Args:
        query: ``[num_tokens, num_heads, head_size]`` fp16/bf16/fp32, the chunk's queries.
        key, value: ``[num_tokens, num_kv_heads, head_size]``, the chunk's own K/V (not read from
            the cache).
        key_cache: ``[num_blocks, num_kv_heads, head_size // x, block_size, x]``.
        value_cache: ``[num_blocks, num_kv_heads, head_size, block_size]``.
        block_tables: ``[num_seqs, max_blocks]`` int32.
        query_start_loc: ``[num_seqs + 1]`` int32/int64, prefix sums of the query lengths.
        seq_lens: ``[num_seqs]``, ``context_lens + query lengths``.
        context_lens: ``[num_seqs]``, cached tokens per sequence (0: plain causal attention).
        max_query_len: the longest query length (sizes the tiles).
        scale: softmax scale; None means ``1/sqrt(head_size)``. Applied in fp32 on every
            backend (a scale > 1 is a planner input: the torch plan scores in fp32, see
            :func:`attn_core.prefill.plan.large_scale_dtypes`; a caller's plan gets the same).
        alibi_slopes: ``[num_heads]`` float32 or None.
        sliding_window: None, 0 or -1 (none), or the window in tokens.
        kv_cache_dtype / k_scale / v_scale: cache storage ("auto" or fp8) and its scales.
        out: optional ``[num_tokens, num_heads, head_size]`` in query's dtype, contiguous,
            written in place.
        plan: a prebuilt :class:`PrefillPlan` (bench sweeps, tests); default plans this call.
        workspace: reusable scratch for the torch backend's tile buffers (steady-state calls
            then allocate only the gathered context); None allocates them per call. One
            thread's only: another thread using it raises ``RuntimeError``.
        backend: ``"torch"``, ``"sdpa"``, ``"vendor_flash"`` or ``"native"`` (wins over
            ``ATTN_CORE_PREFILL_BACKEND``); a forced fused or native backend that is unavailable
            or did not match the reference raises instead of falling back.

    Host syncs: one. ``query_start_loc``, ``seq_lens`` and ``context_lens`` are read to the
    host together once per call; per-sequence slicing and tile counts need them. Nothing else
    reads device values (block-table entries are used on the device).

    Returns:
        ``out``: ``[num_tokens, num_heads, head_size]`` in query's dtype.
    """
    check_backend(backend, PREFILL_BACKENDS)
    if plan is not None:
        expected = "None or an attn_core PrefillPlan or NativePrefillPlan"
        check_type("plan", plan, tuple({r.plan_type for r in RUNNERS.values()}), expected)
    problem, spans = validate_prefill(
        query, key, value, key_cache, value_cache, block_tables, query_start_loc, seq_lens,
        context_lens, max_query_len, scale, alibi_slopes, sliding_window, kv_cache_dtype, k_scale,
        v_scale,
    )  # fmt: skip
    out = _check_out(out, query)
    workspace = check_workspace(workspace)
    if query.shape[0] == 0:  # no new token (an empty batch): a no-op, as decode's
        return out
    if plan is None:
        plan = _resolved_plan(problem, spans, block_tables.shape[1], max_query_len, backend)
    else:
        plan = _caller_plan(plan, query, problem, max_query_len)
    lengths = (query_start_loc, seq_lens, context_lens)
    call = PrefillCall(
        problem, spans, lengths, max_query_len, _max_context(spans), out, workspace
    )  # fmt: skip
    runner_of(plan).run(plan, call)
    return out


# ---------------------------------------------------------------------------------------- plan
_PLANS: dict[tuple, AnyPrefillPlan] = {}
# Resolving one prefill plan took 65-70 us on the CPU (bench/prefill_resolve.py:
# prefill_plan_for alone, torch path; a small call ~0.6-1 ms, of which 100-150 us went to the
# plan), ~180 function calls; vLLM calls once per layer per chunk, 64 layers, so ~4.5 ms per
# chunk resolved the same plan again. One plan per (shapes, bucketed lengths, features), the
# only place prefill keeps plans; cleared when full (4096 keys are far more buckets than one
# model's chunks reach).
_MAX_PLANS = 4096


def _resolved_plan(
    problem: Problem,
    spans: list[SeqSpan],
    max_blocks: int,
    max_query_len: int,
    backend: Optional[str],
) -> AnyPrefillPlan:
    """The plan :func:`paged_prefix_prefill` runs when the caller passes none, from the one
    plan cache: one dict lookup on values the call already has (no environment, no
    resolution). A new call key looks the same dict up under its lengths bucketed up
    (:func:`attn_core.runtime.resolve.prefill_lengths_bucket`, so the chunks of a growing
    context share a plan) and only a new bucket is resolved and, for a fused backend, checked
    against the reference once per process."""
    query, layout = problem.query, problem.layout
    max_context = _max_context(spans)
    alibi, large_scale = problem.alibi_slopes is not None, problem.scale > 1.0
    features = (query.dtype, query.device, layout.num_kv_heads, layout.block_size,
                layout.kv_cache_dtype, alibi, problem.window, large_scale, backend,
                generation())  # fmt: skip
    key = (query.shape, max_blocks, max_query_len, max_context, len(spans), *features)
    plan = _PLANS.get(key)
    if plan is not None:
        return plan
    lengths = resolve.prefill_lengths_bucket(
        max_query_len, max_context, len(spans), query.shape[0], max_blocks * layout.block_size
    )
    bucket_key = (query.shape[1:], lengths, *features)
    plan = _PLANS.get(bucket_key)
    if plan is None:
        shape = AttentionShape(
            query.shape[1], layout.num_kv_heads, query.shape[2], layout.block_size, query.dtype,
            layout.kv_cache_dtype,
        )  # fmt: skip
        plan = resolve.prefill_plan_for(
            shape, lengths, query.device, alibi=alibi, sliding_window=problem.window,
            large_scale=large_scale, backend=backend,
        )  # fmt: skip
        _ensure_fused_verified(plan, query)
        _keep(bucket_key, plan)
    _keep(key, plan)
    return plan


def _keep(key: tuple, plan: AnyPrefillPlan) -> None:
    if len(_PLANS) >= _MAX_PLANS:
        _PLANS.clear()
    _PLANS[key] = plan


def _ensure_fused_verified(plan: AnyPrefillPlan, query: torch.Tensor) -> None:
    """A fused backend's reference check (once per process; a failed check raises here).
    Meta tensors (the simulator's traces) run no kernel, so there is nothing to verify."""
    verify = runner_of(plan).verify
    if verify is not None and query.device.type != "meta":
        verify(plan.backend, query.device, query.dtype, query.shape[2])


def _fit_scale(plan: PrefillPlan, scale: float) -> PrefillPlan:
    """A caller's torch plan made without ``large_scale`` for a call whose ``scale > 1``: the
    planner's fp32-score dtypes (:func:`attn_core.prefill.plan.large_scale_dtypes`), so the
    2-byte score tile cannot overflow. Plans this module resolves already have them."""
    if plan.backend != "torch" or scale <= 1.0 or plan.score_dtype == torch.float32:
        return plan
    matmul, score, pv = large_scale_dtypes(plan.matmul_dtype, plan.score_dtype, plan.pv_dtype)
    return dataclasses.replace(plan, matmul_dtype=matmul, score_dtype=score, pv_dtype=pv)


def verify_prefill_backend(
    name: str, device: torch.device, dtype: torch.dtype, head_size: int
) -> None:
    """Check fused backend ``name`` against the float64 reference here (once per process);
    ``ValueError`` if it is unavailable or does not match. For registration-time checks and
    benchmarks; :func:`paged_prefix_prefill` does the same lazily."""
    ensure_verified(name, torch.device(device), dtype, head_size)


def _max_context(spans: list[SeqSpan]) -> int:
    return max((s.ctx for s in spans), default=0)


def _caller_plan(
    plan: AnyPrefillPlan, query: torch.Tensor, problem: Problem, max_query_len: int
) -> AnyPrefillPlan:
    """A caller's plan checked against the call and made ready to run: a fused backend checked
    against the reference (once per process), a native plan given its verified library (once
    per plan and device), a torch plan's score dtypes fitted to a scale > 1."""
    _check_plan(plan, query, problem, max_query_len)
    _ensure_fused_verified(plan, query)
    if runner_of(plan).needs_library and getattr(plan, "library", None) is None:
        return resolve.with_prefill_library(plan, query.device)  # type: ignore[arg-type]
    return _fit_scale(plan, problem.scale)  # type: ignore[arg-type]


def _check_out(out: Optional[torch.Tensor], query: torch.Tensor) -> torch.Tensor:
    if out is None:
        return torch.empty_like(query)
    return check_out(out, query.shape, query.dtype, query.device, contiguous=True)


def _check_plan(
    plan: AnyPrefillPlan, query: torch.Tensor, problem: Problem, max_query_len: int
) -> None:
    heads, head_size = query.shape[1], query.shape[2]
    want = (heads, problem.layout.num_kv_heads, head_size, query.dtype)
    got = (plan.num_heads, plan.num_kv_heads, plan.head_size, plan.dtype)
    if want != got:
        raise ValueError(
            f"plan must be for (num_heads, num_kv_heads, head_size, dtype) = {want}, got {got}"
        )
    runner = runner_of(plan)
    if runner.cache_bound:
        cache = (problem.layout.block_size, problem.layout.kv_cache_dtype)
        planned = (getattr(plan, "block_size", None), getattr(plan, "kv_cache_dtype", None))
        if cache != planned:
            raise ValueError(
                f"plan must be for (block_size, kv_cache_dtype) = {cache}, got {planned}"
            )
    if not runner.features:
        if problem.alibi_slopes is not None or problem.window > 0:
            raise ValueError(
                f"plan.backend {plan.backend!r} supports neither alibi_slopes nor sliding_window; "
                "use the torch backend"
            )
