"""Log-sum-exp merge of attention partitions, in fp32, normalising on the output side.

A partition ``p`` of one query row reports ``m_p = max_t s_t`` (``-inf`` if it saw no key),
``l_p = sum_t exp(s_t - m_p)`` and the unnormalised output ``o_p = sum_t exp(s_t - m_p) v_t``.
Their merge is ``M = max_p m_p``, ``w_p = exp(m_p - M)``, ``L = sum_p w_p l_p``,
``O = sum_p w_p o_p``; the attention output is ``O / L``. Merged triples merge again the same
way, which is what streaming over chunks relies on.
"""

from __future__ import annotations

import math

import torch


def safe_max(m: torch.Tensor) -> torch.Tensor:
    """``m`` with ``-inf`` replaced by 0, so ``exp(s - m)`` of an empty row is 0, not NaN."""
    return m.masked_fill(m == -math.inf, 0.0)


def merge_partitions(
    out: torch.Tensor,
    maxes: torch.Tensor,
    sums: torch.Tensor,
    dim: int = 1,
    *,
    normalised: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Merge partitions along ``dim``.

    Args:
        out: ``[N, P, G, D]`` partial outputs (any float dtype): unnormalised, or with
            ``normalised=True`` already divided by their own ``sums`` (vLLM V2's ``tmp_out``).
        maxes: ``[N, P, G]`` fp32 partition maxima (``-inf`` for empty partitions).
        sums: ``[N, P, G]`` fp32 exp-sums relative to ``maxes``.
    Returns:
        ``(out [N, G, D], max [N, G], sum [N, G])`` in fp32, the merged triple (unnormalised).
    """
    merged_max = maxes.amax(dim)
    weights = torch.exp(maxes - safe_max(merged_max).unsqueeze(dim))  # [N, P, G]
    weighted_sums = weights * sums
    merged_sum = weighted_sums.sum(dim)
    out_weights = weighted_sums if normalised else weights
    # fp16/bf16 partials promote to fp32 in the product
    merged_out = (out * out_weights.unsqueeze(-1)).sum(dim)
    return merged_out, merged_max, merged_sum


def merge_two(
    a: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Merge two ``(out [N, G, D], max [N, G], sum [N, G])`` triples (streaming's step)."""
    return merge_partitions(
        torch.stack([a[0], b[0]], 1), torch.stack([a[1], b[1]], 1), torch.stack([a[2], b[2]], 1)
    )


def normalise(out: torch.Tensor, sums: torch.Tensor) -> torch.Tensor:
    """``out [N, G, D] / sums [N, G]``: the attention output in fp32."""
    return out / sums.unsqueeze(-1)
