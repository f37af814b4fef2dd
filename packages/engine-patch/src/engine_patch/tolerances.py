"""(atol, rtol) against attn-core's float64 reference, per dtype; one place for the numbers.

Decode as attn-core's own tests (fp16 probabilities round to fp16); prefix as FlashInfer's
prefill tests (scores rounded to 2 bytes before exp). A result passes when
``|got - ref| <= atol + rtol * |ref|`` everywhere, as ``torch.testing.assert_close``.
"""

from __future__ import annotations

import torch

DECODE_TOL = {
    torch.float16: (2.5e-3, 5e-3),
    torch.bfloat16: (2e-2, 3e-2),
    torch.float32: (2e-5, 2e-5),
}
PREFIX_TOL = {
    torch.float16: (2e-2, 2e-2),
    torch.bfloat16: (2e-2, 2e-2),
    torch.float32: (1e-4, 1e-4),
}


def excess(got: torch.Tensor, ref: torch.Tensor, rtol: float) -> tuple[float, float]:
    """``(max |got - ref|, max(|got - ref| - rtol |ref|))``; the second must stay <= atol."""
    diff = (got.detach().double().cpu() - ref).abs()
    return float(diff.max()), float((diff - rtol * ref.abs()).max())
