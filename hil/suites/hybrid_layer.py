"""One Gated DeltaNet layer of the hybrid model, as the suites run it: its shape and random
inputs for a prompt (chunked prefill) and for decode steps against a state pool.

Keys are l2-normalised in the kernel (``use_qk_l2norm_in_kernel=True``, as the model runs),
so ``beta`` in (0, 1) keeps the delta rule stable. Each value head gets its own decay scale,
from ``g ~ -1`` (forgets within a few tokens) down to ``g ~ -1e-5`` (remembers ~100K tokens):
a long prompt then still shapes the final state, which a long-context check needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass(frozen=True)
class LinearLayerShape:
    """Key heads H, value heads HV (a multiple of H), key and value head sizes K and V."""

    num_heads: int
    num_value_heads: int
    head_k: int
    head_v: int

    def describe(self) -> str:
        return (f"{self.num_heads} key / {self.num_value_heads} value heads, "
                f"head {self.head_k} x {self.head_v}")  # fmt: skip


NATIVE_SERVES = "loaded and matched the float64 reference on this device"

# the hybrid model's linear-attention layers (16 key heads, 32 value heads, heads of 128)
HYBRID_LAYER = LinearLayerShape(16, 32, 128, 128)


@dataclass
class LayerInputs:
    """q, k: ``[B, T, H, K]``; v: ``[B, T, HV, V]`` (the run's dtype); g (fp32, log decay
    <= 0), beta: ``[B, T, HV]``."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor

    def token(self, t: int) -> LayerInputs:
        """Token ``t`` of every row as decode-step inputs: ``[B, H, K]``, ``[B, HV, V]``,
        ``[B, HV]``."""
        return LayerInputs(*(x[:, t].contiguous() for x in (self.q, self.k, self.v, self.g,
                                                             self.beta)))  # fmt: skip


def head_decay_scales(num_value_heads: int) -> torch.Tensor:
    """``[HV]`` typical ``-g`` per value head, log-spaced from 1 down to 1e-5."""
    return torch.logspace(0, -5, num_value_heads, dtype=torch.float64).float()


def layer_inputs(
    rows: int, tokens: int, shape: LinearLayerShape, dtype: torch.dtype, device, seed: int
) -> LayerInputs:
    """Random inputs of ``rows`` sequences of ``tokens`` tokens each (see the module doc)."""
    gen = torch.Generator().manual_seed(seed)
    h, hv, dk, dv = shape.num_heads, shape.num_value_heads, shape.head_k, shape.head_v

    def rand(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=gen)

    decay = head_decay_scales(hv) * torch.exp(0.3 * rand(rows, tokens, hv))
    beta = torch.rand(rows, tokens, hv, generator=gen)
    parts = (rand(rows, tokens, h, dk), rand(rows, tokens, h, dk), rand(rows, tokens, hv, dv))
    q, k, v = (x.to(dtype).to(device) for x in parts)
    return LayerInputs(q, k, v, (-decay).to(device), beta.to(dtype).to(device))


def served(device: torch.device, shape: LinearLayerShape, dtype: torch.dtype,
           unsupported: Optional[str]) -> dict:  # fmt: skip
    """``{"backend": "native" | "torch", "detail": why}`` for a call that default
    ``backend=None`` routes (``unsupported``: why the kernels cannot read its layout, or None)."""
    from attn_core.core.settings import current_overrides
    from attn_core.native.gated_delta import VARIANT, GatedDeltaLibrary, LinearShape
    from attn_core.native.loader import native_ready

    device = torch.device(device)
    lib, why = None, unsupported
    if device.type != "cuda":  # the first reason, as attn_core.linear.backend gives it
        why = f"needs a CUDA device, got {device.type}"
    if why is None:
        key = LinearShape(shape.num_heads, shape.num_value_heads, shape.head_k, shape.head_v, dtype)
        lib, why = native_ready(GatedDeltaLibrary, VARIANT, current_overrides().native, device,
                                key)  # fmt: skip
    return {"backend": "native" if lib is not None else "torch", "detail": why or NATIVE_SERVES}
