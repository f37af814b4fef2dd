"""Log-sum-exp merge of attention partitions, in fp32, weighting on the output side.

A partition ``p`` of one query row reports its normalised output ``o_p = sum_t e_t v_t / l_p``
(``e_t = exp(s_t - m_p)``, ``m_p`` its max score, ``l_p = sum_t e_t``) and its log-sum-exp
``lse_p = m_p + log(l_p)``. The attention output over all partitions is
``sum_p w_p o_p`` with ``w_p = exp(lse_p - LSE) = softmax_p(lse)``, and the merged row's own
log-sum-exp is ``LSE = logsumexp_p(lse)``: merged rows merge again the same way, which is what
streaming over chunks relies on.

Decode gives masked slots a large finite negative score, so an all-masked partition has a
finite, hugely negative ``lse`` and weight exactly 0 (never ``-inf - -inf = NaN``).
"""

from __future__ import annotations

from typing import Optional

import torch


def merge_lse(
    out: torch.Tensor, lse: torch.Tensor, *, with_lse: bool = True
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Merge partitions.

    Args:
        out: ``[N, P, G, D]`` normalised partial outputs (any float dtype).
        lse: ``[N, G, P]`` fp32 log-sum-exp of each partition's scores.
        with_lse: also return the merged log-sum-exp (only a further merge needs it).
    Returns:
        ``(out [N, G, D] fp32, lse [N, G] fp32 or None)``.
    """
    weights = torch.softmax(lse, -1).transpose(1, 2).unsqueeze(-1)  # [N, P, G, 1]
    merged = (out * weights).sum(1)  # fp16/bf16 partials promote to fp32
    return merged, torch.logsumexp(lse, -1) if with_lse else None
