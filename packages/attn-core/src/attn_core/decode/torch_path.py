"""The torch path of paged decode: one planned step as a fixed set of batched torch ops.

:func:`run_torch_decode` executes a :class:`~attn_core.decode.plan.DecodePlan` (the step is
described in :mod:`attn_core.runtime.decode`'s docstring): group the queries per KV head, gather K
and V by whole blocks, score, mask, softmax (or partition and merge by log-sum-exp), write ``out``.
Scratch comes from the caller's :class:`~attn_core.core.workspace.Workspace`.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from attn_core.core.lse_merge import merge_lse
from attn_core.core.workspace import Workspace
from attn_core.decode.gather import block_ids, gather_keys, gather_values, to_compute
from attn_core.decode.inputs import DecodeInputs
from attn_core.decode.plan import DecodePlan

# Score of a masked slot: finite, so an all-masked partition's max/exp/sum stay finite, yet
# exp(-1e30 - m) is exactly 0 next to any real score.
MASKED_SCORE = -1e30


def run_torch_decode(
    plan: DecodePlan, inputs: DecodeInputs, out: torch.Tensor, ws: Workspace
) -> None:
    """Write ``out`` ``[num_seqs, num_heads, head_size]`` with ``plan``'s torch ops."""
    query, layout = inputs.query, inputs.layout
    num_seqs, _, head_size = query.shape
    kv_heads, group = layout.num_kv_heads, plan.group
    rows = kv_heads * num_seqs
    k_scale, v_scale = inputs.k_scale, inputs.v_scale
    if not layout.is_fp8:  # vLLM applies k_scale / v_scale to fp8 caches only
        k_scale = v_scale = 1.0
    score_scale = inputs.scale * k_scale  # fp8 keys are dequantised unscaled; k_scale rides on q
    # Grouped queries [kv_heads * S, group, D] in the score bmm's input dtype: row (h, s) holds
    # query heads h*group..+group. The scale is applied in fp32 only: folded into q where q is
    # fp32 for the bmm, else onto the fp32 scores. Folding it into a 2-byte q (once done for
    # power-of-two scales, where it is exact) overflows: fp16 q * 65536 is inf for |q| >= 1,
    # and the step returned NaN where the float64 reference is finite.
    qg = ws.take("q", (kv_heads, num_seqs, group, head_size), plan.score_input_dtype, query.device)
    by_head = query.reshape(num_seqs, kv_heads, group, head_size).transpose(0, 1)
    fold = qg.dtype == torch.float32
    if query.dtype == torch.float32:
        torch.mul(by_head, score_scale, out=qg)
    else:
        # torch.mul(fp16, s, out=fp32) computes in fp16 and overflows: copy, then scale in fp32
        qg.copy_(by_head)
        if fold:
            qg.mul_(score_scale)
    step = _Step(
        plan, ws, inputs, qg.view(rows, group, head_size),
        None if inputs.alibi_slopes is None else inputs.alibi_slopes.view(kv_heads, 1, group, 1),
        1.0 if fold else score_scale,
    )  # fmt: skip

    o: Optional[torch.Tensor]
    small: Optional[torch.Tensor]
    if not plan.streaming and plan.tier != "partitioned":
        o, small = _direct(step)
    else:
        o = lse = small = None
        for chunk in range(plan.num_chunks):  # 1 unless streaming (plan.streaming)
            part_o, part_lse, part_small = _partitioned(step, chunk * plan.chunk_tokens)
            if o is None:
                o, lse, small = part_o, part_lse, part_small
            else:
                assert lse is not None and part_lse is not None
                o, lse = merge_lse(torch.stack((o, part_o), 1), torch.stack((lse, part_lse), -1))
    assert o is not None and small is not None
    _write_out(out, o, small, inputs.seq_lens, plan, v_scale)


class _Step(NamedTuple):
    """What every phase of one torch step reads: the plan, scratch, inputs, grouped queries."""

    plan: DecodePlan
    ws: Workspace
    inputs: DecodeInputs
    qg: torch.Tensor  # [rows, G, D] in the score bmm's input dtype
    slopes: Optional[torch.Tensor]  # [kv_heads, 1, G, 1] or None
    post_scale: float  # applied to the scores when not folded into q


def _write_out(
    out: torch.Tensor,
    o: torch.Tensor,
    small: torch.Tensor,
    seq_lens: torch.Tensor,
    plan: DecodePlan,
    v_scale: float,
) -> None:
    """``out`` from ``o [rows, G, D]``; sequences shorter than a block take ``small``.

    ``out`` may have any strides (vLLM's ``empty_like`` of a strided query): it is written
    through a ``[kv_heads, S, G, D]`` view by one ``where`` (after a cast when dtypes differ).
    """
    num_seqs = seq_lens.shape[0]
    kv_heads = o.shape[0] // num_seqs
    shape = (kv_heads, num_seqs, plan.group, plan.head_size)
    dst = out.unflatten(1, (kv_heads, plan.group)).transpose(0, 1)
    if o.dtype != out.dtype:
        o = o.to(out.dtype)
    if small.dtype != out.dtype:
        small = small.to(out.dtype)
    short = (seq_lens < plan.block_size).view(1, num_seqs, 1, 1)
    torch.where(short, small.view(shape), o.view(shape), out=dst)
    if v_scale != 1.0:
        dst.mul_(v_scale)


def _gather_and_score(step: _Step, start: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scores [rows, G, C] fp32, values [D, kv_heads, S, C] in the bmm dtype)``."""
    plan, ws, inputs, qg = step.plan, step.ws, step.inputs, step.qg
    seq_lens, layout = inputs.seq_lens, inputs.layout
    rows, group, head_size = qg.shape
    num_seqs = seq_lens.shape[0]
    kv_heads = rows // num_seqs
    c, bs, device = plan.chunk_tokens, plan.block_size, qg.device
    # chunk-relative positions: slot i of this chunk is masked when i >= seq_len - start
    end = seq_lens if start == 0 else seq_lens - start
    pos = ws.arange(c, device)
    masked = pos[None, :] >= end[:, None]  # [S, C]
    ids = block_ids(inputs.block_tables, masked[:, ::bs], start // bs, c // bs, ws)
    keys = gather_keys(ws, inputs.key_cache, ids, layout, plan.gather_bytes)
    values = gather_values(ws, inputs.value_cache, ids, layout, plan.gather_bytes)
    _zero_value_tails(ws, values, end, plan, last=start + c >= plan.num_chunks * c)

    keys = keys.view(rows, c, head_size)
    if plan.scores_in_compute_dtype:
        keys = to_compute(ws, "k_c", keys, layout, plan.matmul_dtype)
        rounded = ws.take("scores_c", (rows, group, c), plan.matmul_dtype, device)
        torch.bmm(qg, keys.transpose(1, 2), out=rounded)
        scores = ws.take("scores", (rows, group, c), torch.float32, device)
        scores.copy_(rounded)
    elif plan.score_input_dtype != torch.float32:  # the device's bmm writes fp32 itself
        keys = to_compute(ws, "k_c", keys, layout, plan.score_input_dtype)
        scores = torch.bmm(qg, keys.transpose(1, 2), out_dtype=torch.float32)
    else:
        keys = to_compute(ws, "k_c", keys, layout, torch.float32)
        scores = ws.take("scores", (rows, group, c), torch.float32, device)
        torch.bmm(qg, keys.transpose(1, 2), out=scores)
    scores4 = scores.view(kv_heads, num_seqs, group, c)
    if step.post_scale != 1.0:
        scores4.mul_(step.post_scale)
    if step.slopes is not None:  # vLLM's bias: slope * (position - seq_len + 1)
        rel = pos[None, :] - (end[:, None] - 1)
        scores4.addcmul_(step.slopes, rel.view(1, num_seqs, 1, c).to(torch.float32))
    scores4.masked_fill_(masked.view(1, num_seqs, 1, c), MASKED_SCORE)
    values = to_compute(ws, "v_c", values, layout, plan.matmul_dtype)
    return scores, values


def _zero_value_tails(
    ws: Workspace, values: torch.Tensor, end: torch.Tensor, plan: DecodePlan, last: bool = True
) -> None:
    """Zero the ``block_size - 1`` gathered value slots after each sequence's last token.

    ``values [D, kv_heads, S, C]``; ``end [S]``: each sequence's first masked slot relative to
    the chunk (may be < 0 or >= C when streaming). Without streaming every such slot lies
    inside the row (``C >= max_seq_len + block_size - 1``) and past the end, so one
    ``index_put_`` of zeros does it. A streamed chunk may end before a sequence does: targets
    are clamped into the chunk and slots that hold real tokens are written back unchanged.
    The ``last`` chunk is not clamped above: the chunks cover ``max_seq_len + block_size - 1``
    slots, so a target past it means ``seq_lens > max_seq_len`` and fails (IndexError / device
    assert) rather than silently dropping the tokens no chunk covers.
    """
    num_seqs, c, bs = end.shape[0], plan.chunk_tokens, plan.block_size
    device = values.device
    step = ws.arange(bs - 1, device)
    seqs = ws.arange(num_seqs, device)[:, None]
    zero = ws.constant(
        ("zero", values.dtype), lambda d: torch.zeros((), dtype=values.dtype, device=d), device
    )
    if not plan.streaming:
        target = end[:, None] + step  # [S, BS - 1]
        torch.ops.aten.index_put_(values, [None, None, seqs, target], zero)
        return
    target = (end[:, None] + step).clamp_(0, None if last else c - 1)
    current = values[:, :, seqs, target]
    keep = target < end[:, None]  # a clamped target on a real token: write it back as it is
    torch.ops.aten.index_put_(values, [None, None, seqs, target], torch.where(keep, current, zero))


def _direct(step: _Step) -> tuple[torch.Tensor, torch.Tensor]:
    """single_tile / one_pass: ``(out [rows, G, D], first-block out [rows, G, D])``."""
    plan, ws = step.plan, step.ws
    scores, values = _gather_and_score(step, 0)
    rows, group, c = scores.shape
    probs = torch.softmax(scores, -1)
    if plan.matmul_dtype != torch.float32:
        cast = ws.take("probs", (rows, group, c), plan.matmul_dtype, probs.device)
        probs = cast.copy_(probs)
    v_rows = values.view(plan.head_size, rows, c).permute(1, 2, 0)  # [rows, C, D]
    o = torch.bmm(probs, v_rows)
    bs = plan.block_size
    return o, torch.bmm(probs[:, :, :bs], v_rows[:, :bs])


def _partitioned(
    step: _Step, start: int
) -> tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
    """One chunk: ``(normalised out [rows, G, D] fp32, lse [rows, G] if streaming, first-block
    out)``.

    Phase 1 on the small score tensor: per-partition max ``m``, ``exp(s - m)``, sum ``l``,
    probabilities normalised per partition (as vLLM V2 does: an unnormalised fp16 ``P . V``
    can reach ``partition_size * max|v|`` and overflow), one bmm for every partition's partial
    output. Phase 2 in fp32: partition weights ``softmax(m + log l)``, a weighted sum.
    """
    plan, ws = step.plan, step.ws
    scores, values = _gather_and_score(step, start)
    rows, group, c = scores.shape
    p, ps, head_size = plan.num_partitions, plan.partition_size, plan.head_size
    parts = scores.view(rows, group, p, ps)
    maxes = parts.amax(-1)  # [rows, G, P]
    parts.sub_(maxes.unsqueeze(-1)).exp_()
    sums = parts.sum(-1)  # >= 1: every partition's max contributes exp(0)
    probs = ws.take("probs", (rows, p, group, ps), plan.matmul_dtype, scores.device)
    torch.div(parts, sums.unsqueeze(-1), out=probs.transpose(1, 2))
    v_parts = values.view(head_size, rows * p, ps).permute(1, 2, 0)  # [rows * P, ps, D]
    partial = torch.bmm(probs.view(rows * p, group, ps), v_parts).view(rows, p, group, head_size)
    o, lse = merge_lse(partial, maxes + sums.log(), with_lse=plan.streaming)
    bs = plan.block_size
    v_rows = values.view(head_size, rows, c).permute(1, 2, 0)
    small = torch.bmm(probs[:, 0, :, :bs], v_rows[:, :bs])
    return o, lse, small
