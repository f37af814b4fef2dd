"""The gated delta rule one token at a time: the decode step and the token-by-token path.

One step for ``N`` sequences reads each state once for both products it needs: the old state
``S`` (decayed in place) is multiplied by ``[k; q]`` in one ``bmm``, and the output comes from
``o = S_dec^T q + (q . k) delta`` instead of reading the updated state a second time.
"""

from __future__ import annotations

import torch

from attn_core.linear.chunked import l2_normalise


def widen(x: torch.Tensor, num_value_heads: int) -> torch.Tensor:
    """``[N, H, K]`` at key heads -> ``[N * HV, K]``, each key head repeated for its group
    (a copy of N x HV x K elements: one token's keys, small beside the state)."""
    n, h, dk = x.shape
    grp = num_value_heads // h
    return x[:, :, None, :].expand(n, h, grp, dk).reshape(n * num_value_heads, dk)


def recurrent_step(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    l2norm: bool,
) -> torch.Tensor:
    """Advance ``state [N, HV, K, V]`` (fp32, contiguous; updated in place) by one token and
    return its output ``[N, HV, V]`` fp32.

    q, k: ``[N, H, K]``; v: ``[N, HV, V]``; g, beta: ``[N, HV]`` (any float dtype).
    """
    n, hv, dk, dv = state.shape
    qf, kf = q.float(), k.float()
    if l2norm:
        qf, kf = l2_normalise(qf), l2_normalise(kf)
    s = state.view(n * hv, dk, dv)
    kq = torch.stack([widen(kf, hv), widen(qf, hv) * scale], dim=1)  # [N * HV, 2, K]
    s.mul_(g.float().reshape(n * hv, 1, 1).exp())
    read = torch.bmm(kq, s)  # [N * HV, 2, V]: S^T k and S^T q of the decayed state
    delta = (v.float().reshape(n * hv, dv) - read[:, 0]).mul_(beta.float().reshape(n * hv, 1))
    s.baddbmm_(kq[:, 0, :, None], delta[:, None, :])
    qk = (kq[:, 0] * kq[:, 1]).sum(-1, keepdim=True)
    return torch.addcmul(read[:, 1], qk, delta).view(n, hv, dv)


def run_recurrent(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    l2norm: bool,
    out: torch.Tensor,
) -> None:
    """Tokens ``0 .. T-1`` of ``N`` equally long sequences in order.

    state: ``[N, HV, K, V]`` fp32, advanced in place; q, k: ``[N, T, H, K]``; v, out:
    ``[N, T, HV, V]``; g, beta: ``[N, T, HV]``.
    """
    for t in range(q.shape[1]):
        o = recurrent_step(state, q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], scale, l2norm)
        out[:, t] = o.to(out.dtype)
