"""Paged decode attention on vLLM 0.6.3's cache layout: validate -> plan -> execute -> merge.

One query token per sequence attends to its paged context. Work is organised per KV head: the
``group`` query heads of a KV head form the rows of one batched matmul against that head's keys,
so K/V are read once per KV head and never repeated to query heads.

One step over ``C`` token slots (``C >= max_seq_len + block_size - 1``, so every sequence's row
holds at least ``block_size - 1`` masked slots after its last token):

1. ``masked = pos >= seq_lens`` (``[S, C]``); block ids, blocks past a sequence's end pointed
   at its first block (:func:`attn_core.decode.gather.block_ids`);
2. one ``index_select`` each for K (token-major) and V (D-major) by whole blocks;
3. the ``block_size - 1`` slots after each sequence's last token are zeroed in the gathered V
   (one small ``index_put_``): the cache's unused tail slots may hold inf/NaN and the
   ``P . V`` product would turn ``0 * NaN`` into NaN. Blocks past the end are copies of the
   first block, which is all real tokens unless the sequence is shorter than one block; those
   short sequences take their output from the first block alone (one ``[G, block]`` bmm and a
   ``where`` at the end);
4. scores ``[kv_heads * S, group, C]`` in fp32 by one bmm (the scale applied in fp32: folded
   into an fp32 q, else onto the scores; never into a 2-byte q, where it can overflow), ALiBi,
   masked slots set to ``-1e30`` (finite: an all-masked partition then yields finite
   statistics whose merge weight is exactly 0; whatever a masked key produced, inf and NaN
   included, is replaced);
5. ``single_tile`` / ``one_pass``: fp32 softmax, cast, one ``P . V`` bmm, written to ``out``;
   ``partitioned``: per-partition max / exp / sum on the score tensor, probabilities normalised
   per partition and cast, one bmm over every (row, partition), then a fp32 log-sum-exp merge
   (``softmax`` of ``max + log(sum)`` over partitions weights the partial outputs).

Ops per step: a fixed set per tier, independent of batch and context (no loop over sequences,
partitions or tiles; streaming repeats the set per chunk). This module is the one statement of
them: the simulator counts them by tracing this code (``python -m attn_sim report``,
*launches*) and ``gates.toml`` bounds the count per tier.

Nothing reads device values on the host, so a step can be captured in a CUDA graph;
``max_seq_len`` only sizes the step. Streaming (``num_chunks > 1``) repeats the partitioned
machinery per chunk and merges chunks by log-sum-exp.

This module is the entry point: validate, fetch the resolved plan (:mod:`attn_core.runtime.resolve`,
one cache lookup in the steady state), run it with its backend (:mod:`attn_core.decode.backends`:
the torch path, :mod:`attn_core.decode.torch_path`, or the native kernel,
:mod:`attn_core.decode.native_step`).
"""

from __future__ import annotations

from typing import Optional

import torch

from attn_core.core.cache_layout import (
    COMPUTE_DTYPES,
    CacheLayout,
    check_block_tables,
    validate_caches,
)
from attn_core.core.checks import (
    check_backend,
    check_heads,
    check_out,
    check_positive,
    check_positive_finite,
    check_tensor,
    check_type,
    resolve_scale,
    value_checks_enabled,
)
from attn_core.core.settings import DECODE_BACKENDS
from attn_core.core.shapes import AttentionShape
from attn_core.core.workspace import Workspace, check_workspace, default_workspace, is_capturing
from attn_core.decode.backends import backend_of
from attn_core.decode.bounds import check_decode_bounds, max_seq_len_bucket
from attn_core.decode.inputs import DecodeInputs
from attn_core.decode.plan import AnyDecodePlan, DecodeLengths
from attn_core.device.spec import DeviceSpec
from attn_core.runtime import decode_steady as steady
from attn_core.runtime.resolve import decode_plan_for, with_library


def paged_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    scale: Optional[float] = None,
    *,
    alibi_slopes: Optional[torch.Tensor] = None,
    kv_cache_dtype: str = "auto",
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    out: Optional[torch.Tensor] = None,
    workspace: Optional[Workspace] = None,
    device_spec: Optional[DeviceSpec] = None,
    plan: Optional[AnyDecodePlan] = None,
    backend: Optional[str] = None,
) -> torch.Tensor:
    """What vLLM 0.6.3's ``paged_attention_v1`` / ``v2`` compute.

    Args:
        query: ``[num_seqs, num_heads, head_size]`` fp16 / bf16 / fp32.
        key_cache: ``[num_blocks, num_kv_heads, head_size // x, block_size, x]``.
        value_cache: ``[num_blocks, num_kv_heads, head_size, block_size]``.
        block_tables: ``[num_seqs, max_blocks]`` int32.
        seq_lens: ``[num_seqs]`` int32, each in ``[1, max_seq_len]``.
        max_seq_len: upper bound on ``seq_lens`` (may exceed all of them; results stay exact),
            at most ``max_blocks * block_size`` (checked on every call).
        scale: score scale; ``None`` means ``1 / sqrt(head_size)``.
        alibi_slopes: ``[num_heads]`` float32 or ``None``.
        kv_cache_dtype: ``"auto"`` or ``"fp8"`` / ``"fp8_e4m3"`` / ``"fp8_e5m2"`` (caches uint8).
        out: ``[num_seqs, num_heads, head_size]`` in the query's dtype, written in place; any
            strides whose elements do not overlap (an expanded view is a ``ValueError``).
        workspace: scratch buffers (default: the thread's shared workspace); one thread's only
            (another thread using it raises ``RuntimeError``, see :mod:`attn_core.core.workspace`).
        device_spec: the profile to plan for (default: ``ATTN_CORE_DEVICE``, else detected).
        plan: a prebuilt plan (:func:`attn_core.plan_decode` / :func:`attn_core.
            decode_plan_for`; the simulator, benchmarks, tests); it must be for this call's
            shape, batch and dtype. Default: resolved here (:mod:`attn_core.runtime.resolve`) once
            per shape, ``max_seq_len`` bucket, ``backend`` and settings generation, then reused.
        backend: ``"torch"`` or ``"native"`` (wins over ``ATTN_CORE_DECODE_BACKEND``); None:
            the settings', else native where built and verified. A forced ``"native"`` that
            cannot serve the call raises ``ValueError`` naming why.
    Returns:
        ``[num_seqs, num_heads, head_size]`` in the query's dtype (``out`` if given).

    Every call checks shapes, dtypes, devices, finite positive scales and ``max_seq_len``
    against the table's capacity (``ValueError`` naming the argument). ``seq_lens`` and block-id
    values are read only with ``ATTN_CORE_CHECKS=1``; :mod:`attn_core.decode.bounds` lists what
    each bad value does without it (an error or an exact result, never another block's tokens).
    """
    sig = None
    if plan is None:
        sig = steady.signature(
            query, key_cache, value_cache, block_tables, seq_lens, out, alibi_slopes,
            kv_cache_dtype, scale, k_scale, v_scale, backend, device_spec,
        )  # fmt: skip
        known = steady.lookup(sig, max_seq_len)
        if known is not None:
            entry, bucket = known
            step = entry.steps.get(bucket)
            if step is not None:
                return _run_steady(entry, step, query, key_cache, value_cache, block_tables,
                                   seq_lens, max_seq_len, alibi_slopes, float(k_scale),
                                   float(v_scale), out, workspace)  # fmt: skip
    check_backend(backend, DECODE_BACKENDS)
    if device_spec is not None:
        check_type("device_spec", device_spec, DeviceSpec, "None or a DeviceSpec")
    layout = _validate(
        query,
        key_cache,
        value_cache,
        block_tables,
        seq_lens,
        max_seq_len,
        alibi_slopes,
        kv_cache_dtype,
        k_scale,
        v_scale,
        out,
    )
    scale = resolve_scale(scale, layout.head_size)
    ws = check_workspace(workspace) or default_workspace()
    if out is None:
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    if query.shape[0] == 0:  # an empty batch is a no-op, not an error
        return out
    if plan is None:
        # a new signature or bucket (the steady state's one cache missed): resolve now
        plan = plan_for(query, layout, block_tables.shape[1], max_seq_len, device_spec, backend)
    else:
        _check_plan(plan, query, layout, block_tables.shape[1], max_seq_len)
        plan = with_library(plan, query.device)
    checks = value_checks_enabled()
    if checks and not is_capturing(query.device):
        # reading values syncs, which a CUDA-graph capture forbids: capture checks nothing
        _check_values(layout, block_tables, seq_lens, max_seq_len)
    inputs = DecodeInputs(
        query, key_cache, value_cache, block_tables, seq_lens, layout, scale, float(k_scale),
        float(v_scale), alibi_slopes,
    )  # fmt: skip
    runner = backend_of(plan)
    prepared = runner.run(plan, inputs, out, ws)
    if sig is not None:  # validated and run: later calls of this signature and bucket skip both
        capacity = block_tables.shape[1] * layout.block_size
        entry = steady.SteadyEntry(layout, capacity, scale, checks)
        bucket = max_seq_len_bucket(max_seq_len, capacity)
        sizes = runner.partials(plan, query)
        steady.record(sig, entry, bucket, steady.SteadyStep(plan, prepared, sizes))
    return out


def _run_steady(
    entry: steady.SteadyEntry,
    step: steady.SteadyStep,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    alibi_slopes: Optional[torch.Tensor],
    k_scale: float,
    v_scale: float,
    out: Optional[torch.Tensor],
    workspace: Optional[Workspace],
) -> torch.Tensor:
    """A call whose signature the full path validated: only what differs per call is checked."""
    ws = check_workspace(workspace) or default_workspace()
    if out is None:
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    if entry.value_checks and not is_capturing(query.device):
        _check_values(entry.layout, block_tables, seq_lens, max_seq_len)
    plan = step.plan
    if step.prepared is not None:
        part_out, part_lse = steady.partial_addresses(step, query.device, ws)
        step.prepared.launch(
            query, key_cache, value_cache, block_tables, seq_lens, out, alibi_slopes, part_out,
            part_lse,
        )  # fmt: skip
        return out
    inputs = DecodeInputs(
        query, key_cache, value_cache, block_tables, seq_lens, entry.layout, entry.scale,
        k_scale, v_scale, alibi_slopes,
    )  # fmt: skip
    backend_of(plan).run(plan, inputs, out, ws)
    return out


# ---------------------------------------------------------------------------------- validate
def _validate(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    alibi_slopes: Optional[torch.Tensor],
    kv_cache_dtype: str,
    k_scale: float,
    v_scale: float,
    out: Optional[torch.Tensor],
) -> CacheLayout:
    check_tensor("query", query, ndim=3, dtype=COMPUTE_DTYPES)
    device = query.device
    layout = validate_caches(
        key_cache, value_cache, kv_cache_dtype, compute_dtype=query.dtype, device=device
    )
    num_seqs, num_heads, _ = query.shape
    check_tensor("query", query, shape=(None, None, layout.head_size))
    check_heads(query)
    if num_heads % layout.num_kv_heads:
        raise ValueError(
            f"query's num_heads must be divisible by num_kv_heads ({layout.num_kv_heads}), "
            f"got {num_heads}"
        )
    check_block_tables(block_tables, num_seqs, device)
    check_tensor("seq_lens", seq_lens, shape=(num_seqs,), dtype=torch.int32, device=device)
    check_positive("max_seq_len", max_seq_len)
    check_decode_bounds(layout, block_tables, num_seqs, max_seq_len)
    if alibi_slopes is not None:
        check_tensor(
            "alibi_slopes", alibi_slopes, shape=(num_heads,), dtype=torch.float32, device=device
        )
    check_positive_finite("k_scale", k_scale)
    check_positive_finite("v_scale", v_scale)
    if out is not None:  # any strides (vLLM's empty_like of a strided query), but no overlap
        check_out(out, query.shape, query.dtype, device)
    return layout


def _check_values(
    layout: CacheLayout, block_tables: torch.Tensor, seq_lens: torch.Tensor, max_seq_len: int
) -> None:
    """``ATTN_CORE_CHECKS=1``: value checks that read the device (they sync)."""
    lens = seq_lens.long()
    capacity = block_tables.shape[1] * layout.block_size
    lo, hi = int(lens.min()), int(lens.max())
    if lo < 1 or hi > capacity:
        raise ValueError(
            f"seq_lens must be in [1, {capacity}] (block_tables' capacity), got min {lo} max {hi}"
        )
    if hi > max_seq_len:
        raise ValueError(f"seq_lens must be <= max_seq_len ({max_seq_len}), got max {hi}")
    needed = (lens + layout.block_size - 1) // layout.block_size
    cols = torch.arange(block_tables.shape[1], device=lens.device)
    used = block_tables[cols[None, :] < needed[:, None]]
    lo_id, hi_id = int(used.min()), int(used.max())
    if lo_id < 0 or hi_id >= layout.num_blocks:
        raise ValueError(
            f"block_tables entries in use must be in [0, {layout.num_blocks - 1}], "
            f"got min {lo_id} max {hi_id}"
        )


def _check_plan(
    plan: AnyDecodePlan, query: torch.Tensor, layout: CacheLayout, max_blocks: int, max_seq_len: int
) -> None:
    """A caller's plan must be for this call: same sizes and dtypes, covering its context."""
    backend_of(plan)  # a plan of a registered backend
    cache_elem = 1 if layout.is_fp8 else query.element_size()
    want = (query.shape[0], query.shape[1], layout.num_kv_heads, layout.head_size,
            layout.block_size, query.dtype, cache_elem)  # fmt: skip
    got = (plan.num_seqs, plan.num_heads, plan.num_kv_heads, plan.head_size, plan.block_size,
           plan.compute_dtype, plan.cache_element_size)  # fmt: skip
    if want != got:
        raise ValueError(
            "plan must be for (num_seqs, num_heads, num_kv_heads, head_size, block_size, dtype, "
            f"cache element size) = {want}, got {got}"
        )
    context = min(max_seq_len, max_blocks * layout.block_size)
    if plan.context_tokens < context:
        raise ValueError(
            f"plan.context_tokens must cover min(max_seq_len, block_tables capacity) = "
            f"{context}, got {plan.context_tokens}"
        )


# -------------------------------------------------------------------------------------- plan
def plan_for(
    query: torch.Tensor,
    layout: CacheLayout,
    max_blocks: int,
    max_seq_len: int,
    device_spec: Optional[DeviceSpec] = None,
    backend: Optional[str] = None,
) -> AnyDecodePlan:
    """The resolved plan :func:`paged_decode` runs for these arguments: made for the
    ``max_seq_len`` bucket (:func:`attn_core.decode.bounds.max_seq_len_bucket`), so the steady
    state (:mod:`attn_core.runtime.decode_steady`, the one place plans are kept) keeps one
    plan per bucket, however ``max_seq_len`` grows inside it."""
    shape = AttentionShape(
        query.shape[1],
        layout.num_kv_heads,
        layout.head_size,
        layout.block_size,
        query.dtype,
        layout.kv_cache_dtype,
    )
    bucket = max_seq_len_bucket(max_seq_len, max_blocks * layout.block_size)
    lengths = DecodeLengths(query.shape[0], bucket, max_blocks)
    return decode_plan_for(shape, lengths, query.device, device_spec, backend=backend)
