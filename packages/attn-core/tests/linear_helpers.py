"""Random inputs for the linear-attention tests, and their tolerances against the float64
reference (:mod:`attn_core.reference.gated_delta`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

# The reference reads the same rounded inputs, so these cover fp32 compute plus the output's
# rounding: fp32 chunked vs per-token order differs by ~1e-6 at |o| ~ 1; fp16 / bf16 round the
# output once (2^-11 / 2^-8 relative), at |o| up to ~4 here.
LINEAR_TOLERANCES = {
    torch.float32: {"atol": 5e-5, "rtol": 5e-5},
    torch.float16: {"atol": 3e-3, "rtol": 2e-3},
    torch.bfloat16: {"atol": 2.5e-2, "rtol": 1.6e-2},
}


def assert_linear_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert torch.isfinite(actual).all(), "output has NaN/inf (unwritten or poisoned elements)"
    torch.testing.assert_close(actual.double().cpu(), expected.double(), **LINEAR_TOLERANCES[dtype])


@dataclass
class LinearCase:
    """q, k: ``[B, T, H, K]``; v: ``[B, T, HV, V]``; g (fp32), beta: ``[B, T, HV]``;
    cu_seqlens ``[N + 1]`` or None; initial_state ``[N, HV, K, V]`` fp32 or None."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    cu_seqlens: Optional[torch.Tensor]
    initial_state: Optional[torch.Tensor]
    scale: Optional[float]
    l2norm: bool

    def kwargs(self) -> dict[str, Any]:
        return dict(
            q=self.q, k=self.k, v=self.v, g=self.g, beta=self.beta, scale=self.scale,
            initial_state=self.initial_state, cu_seqlens=self.cu_seqlens,
            use_qk_l2norm_in_kernel=self.l2norm,
        )  # fmt: skip

    def reference_kwargs(self) -> dict[str, Any]:
        kw = self.kwargs()
        kw["use_qk_l2norm"] = kw.pop("use_qk_l2norm_in_kernel")
        return kw


def make_linear_case(
    lengths: list[int],
    num_heads: int,
    num_value_heads: int,
    head_k: int,
    head_v: int,
    dtype: torch.dtype = torch.float32,
    *,
    varlen: bool = True,
    initial: bool = True,
    l2norm: bool = False,
    scale: Optional[float] = None,
    seed: int = 0,
    device: str = "cpu",
) -> LinearCase:
    """Sequences of ``lengths`` packed in one row (``varlen``) or as a batch of equal lengths.

    Without l2 normalisation keys get norm ~1 (``randn / sqrt(K)``): the delta rule is only
    stable for ``beta |k|^2 < 2``, as in the model, where keys are normalised. Decays mix mild
    and strong values (``g`` down to about -20) so the masked exponentials are exercised.
    """
    gen = torch.Generator().manual_seed(seed)
    if varlen:
        b, t = 1, sum(lengths)
    else:
        assert len(set(lengths)) == 1, lengths
        b, t = len(lengths), lengths[0]
    h, hv = num_heads, num_value_heads

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen)

    q = rand(b, t, h, head_k)
    k = rand(b, t, h, head_k) * (1.0 if l2norm else head_k**-0.5)
    v = rand(b, t, hv, head_v)
    g = -torch.exp(rand(b, t, hv) * 1.5 - 1.0)
    beta = torch.rand(b, t, hv, generator=gen)
    cu = None
    if varlen:
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    n = len(lengths)
    init = rand(n, hv, head_k, head_v) * 0.3 if initial else None
    dev = torch.device(device)
    return LinearCase(
        q.to(dtype).to(dev), k.to(dtype).to(dev), v.to(dtype).to(dev), g.to(dev),
        beta.to(dtype).to(dev), None if cu is None else cu.to(dev),
        None if init is None else init.to(dev), scale, l2norm,
    )  # fmt: skip
