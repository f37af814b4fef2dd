"""The depthwise causal convolution before the gated delta rule (width W, 4 in the model).

``out[d, t] = sum_j weight[d, j] * x[d, t - (W - 1) + j]``: ``weight[:, W - 1]`` multiplies the
current token. A sequence's inputs before its first token come from its conv state, the
previous ``W - 1`` inputs oldest first (zeros without one). The state is the first ``W - 1``
positions of the cache's last axis; any further positions are neither read nor written.

Prefill lays every sequence out as ``[window | tokens]`` in one buffer and runs one grouped
``conv1d`` over it: outputs whose taps would cross into the previous block are never read. All
index arithmetic is on the device from shapes, so prefill never syncs for it either.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def _activate(x: torch.Tensor, activation: Optional[str]) -> torch.Tensor:
    return F.silu(x) if activation in ("silu", "swish") else x


def conv_varlen(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    query_start_loc: torch.Tensor,
    window: torch.Tensor,
    activation: Optional[str],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every sequence of ``x [dim, total]`` (offsets ``query_start_loc [N + 1]``) after its
    ``window [N, dim, W - 1]`` (fp32; zeros where a sequence has none).

    Returns ``(out [dim, total] fp32, new windows [N, dim, W - 1] fp32)``.
    """
    dim, total = x.shape
    n, width = window.shape[0], weight.shape[1]
    lag = width - 1
    dev = x.device
    starts = query_start_loc.to(dev, torch.int64)
    tok = torch.arange(total, device=dev)
    seq = torch.searchsorted(starts[1:], tok, right=True)  # sequence of each token
    x_pos = tok + lag * (seq + 1)  # token positions in the [window | tokens] layout
    block = starts[:-1] + lag * torch.arange(n, device=dev)  # each block's first position
    w_pos = (block[:, None] + torch.arange(lag, device=dev)[None, :]).reshape(-1)
    ext = torch.empty(dim, total + n * lag, device=dev)
    ext.index_copy_(1, x_pos, x.float())
    ext.index_copy_(1, w_pos, window.permute(1, 0, 2).reshape(dim, n * lag))
    conv = F.conv1d(ext[None], weight.float()[:, None, :], groups=dim)[0]
    out = conv.index_select(1, x_pos - lag)
    if bias is not None:
        out = out + bias.float()[:, None]
    ends = starts[1:] + lag * (torch.arange(n, device=dev) + 1)  # one past each block
    tail = (ends[:, None] - lag + torch.arange(lag, device=dev)[None, :]).reshape(-1)
    new = ext.index_select(1, tail).view(dim, n, lag).permute(1, 0, 2)
    return _activate(out, activation), new


def conv_step(
    x: torch.Tensor,
    window: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    activation: Optional[str],
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [N, dim, L]`` after ``window [N, dim, W - 1]``: ``(out [N, dim, L], new window)``,
    fp32."""
    dim, lag = x.shape[1], weight.shape[1] - 1
    full = torch.cat([window.float(), x.float()], dim=-1)
    out = F.conv1d(full, weight.float()[:, None, :], bias=None, groups=dim)
    if bias is not None:
        out = out + bias.float()[None, :, None]
    return _activate(out, activation), full[..., full.shape[-1] - lag :]
