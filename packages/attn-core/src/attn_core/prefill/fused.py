"""Driving a fused backend: bottom-right causal attention as merged fused-kernel parts.

For a query tile ``[a, b)`` of a chunk with ``ctx`` cached tokens, the keys it may see are the
context (all of it), the chunk's tokens ``[0, a)`` (all of them) and ``[a, b)`` (causally). The
first two are non-causal kernel calls, the last a square causal one; their outputs merge by
log-sum-exp in fp32. With streaming, the context part is itself several calls, one per gathered
chunk. Query tiles bound the fp32 merge state to ``plan.query_tile`` tokens.
"""

from __future__ import annotations

from typing import Optional

import torch

from attn_core.prefill.backends import BACKENDS
from attn_core.prefill.gather import new_tokens_head_major
from attn_core.prefill.plan import PrefillPlan
from attn_core.prefill.problem import Problem, gather_span


def run_fused_prefill(plan: PrefillPlan, problem: Problem, spans: list, out: torch.Tensor) -> None:
    """Attend every span's new tokens with ``plan.backend``; writes ``out`` in place."""
    attend = BACKENDS[plan.backend].attend
    dtype = problem.query.dtype
    for span in spans:
        if span.query_len == 0:
            continue
        new_k, new_v = new_tokens_head_major(
            problem.key[span.q0 : span.q1], problem.value[span.q0 : span.q1], dtype
        )
        contexts = []
        if span.ctx > 0:
            step = plan.stream_chunk or span.ctx
            contexts = [(c0, min(c0 + step, span.ctx)) for c0 in range(0, span.ctx, step)]
        whole = None
        if len(contexts) == 1:
            whole = gather_span(problem, span, 0, span.ctx, dtype, sum_column=False)
        for a in range(0, span.query_len, plan.query_tile):
            b = min(a + plan.query_tile, span.query_len)
            q = problem.query[span.q0 + a : span.q0 + b]
            merged = _Merge()
            for c0, c1 in contexts:
                if whole is not None:
                    keys, values = whole
                else:
                    keys, values = gather_span(problem, span, c0, c1, dtype, sum_column=False)
                merged.add(*attend(q, keys, values, problem.scale, False))
            if a > 0:
                merged.add(*attend(q, new_k[:, :a], new_v[:, :a], problem.scale, False))
            merged.add(*attend(q, new_k[:, a:b], new_v[:, a:b], problem.scale, True))
            out[span.q0 + a : span.q0 + b].copy_(merged.result().transpose(0, 1))


class _Merge:
    """Running log-sum-exp merge of normalised parts: out ``[heads, t, hs]``, lse ``[heads, t]``."""

    def __init__(self) -> None:
        self.out: Optional[torch.Tensor] = None
        self.lse: Optional[torch.Tensor] = None

    def add(self, out: torch.Tensor, lse: torch.Tensor) -> None:
        if self.out is None or self.lse is None:
            self.out, self.lse = out, lse
            return
        new_lse = torch.logaddexp(self.lse, lse)
        self.out.mul_((self.lse - new_lse).exp_().unsqueeze(-1))
        self.out.add_(out * (lse - new_lse).exp_().unsqueeze(-1))
        self.lse = new_lse

    def result(self) -> torch.Tensor:
        if self.out is None:
            raise RuntimeError("no part was merged")  # every query tile has its causal part
        return self.out
