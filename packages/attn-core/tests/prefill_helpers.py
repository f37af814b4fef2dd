"""Calling paged_prefix_prefill on a PrefillCase with a NaN-poisoned ``out``, and its reference."""

from __future__ import annotations

import math
from typing import Optional

import torch
from conftest import poisoned_like

from attn_core import paged_prefix_prefill
from attn_core.prefill.plan import PrefillPlan
from attn_core.reference import PrefillCase, alibi_bias, reference_prefix_prefill
from attn_core.reference import attention as _ref


def run_prefill(case: PrefillCase, plan: Optional[PrefillPlan] = None) -> torch.Tensor:
    out = poisoned_like(case.query)
    result = paged_prefix_prefill(*case.args(), **case.kwargs(), out=out, plan=plan)
    assert result is out
    return out


def reference(case: PrefillCase) -> torch.Tensor:
    """The shared float64 reference, per sequence.

    Sequences without context go through the reference's own dense attention: its
    ``tokens_from_cache`` cannot read zero tokens (reshape of an empty tensor; reported to the
    lead), and a context-free sequence needs nothing from the cache.
    """
    kw = case.reference_kwargs()
    starts = case.query_start_loc.tolist()
    out = torch.empty(case.query.shape, dtype=torch.float64)
    for s, ctx in enumerate(case.context_lens.tolist()):
        q0, q1 = starts[s], starts[s + 1]
        if q1 == q0:
            continue
        if ctx > 0:
            sub = dict(kw)
            sub.update(
                query=case.query[q0:q1],
                key=case.key[q0:q1],
                value=case.value[q0:q1],
                block_tables=case.block_tables[s : s + 1],
                query_start_loc=torch.tensor([0, q1 - q0]),
                context_lens=case.context_lens[s : s + 1],
            )
            out[q0:q1] = reference_prefix_prefill(**sub)
        else:
            out[q0:q1] = _causal_reference(case, q0, q1)
    return out


def _causal_reference(case: PrefillCase, q0: int, q1: int) -> torch.Tensor:
    n = q1 - q0
    pos = torch.arange(n)
    mask = pos[None, :] <= pos[:, None]
    if case.sliding_window:
        mask &= pos[None, :] > pos[:, None] - case.sliding_window
    bias = None
    if case.alibi_slopes is not None:
        bias = alibi_bias(case.alibi_slopes, pos, pos)
    scale = 1.0 / math.sqrt(case.query.shape[-1])
    return _ref._attend(
        case.query[q0:q1].cpu().double(),
        case.key[q0:q1].cpu().double(),
        case.value[q0:q1].cpu().double(),
        scale,
        mask,
        bias,
    )
