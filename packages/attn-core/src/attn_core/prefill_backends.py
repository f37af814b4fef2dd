"""Fused prefill backends as data, and the one-time check against the reference.

A fused backend supplies one primitive, ``attend(q, k, v, scale, causal) -> (out, lse)``:

    q   [t, heads, hs]          the chunk's queries (a tile of them)
    k/v [kv_heads, n, hs]       keys/values, head-major (GQA by broadcast inside the kernel)
    out [heads, t, hs] fp32     softmax-normalised attention over these n keys
    lse [heads, t] fp32         log-sum-exp of the scaled scores, to merge parts

``causal=True`` is only asked for square blocks (n == t, top-left == bottom-right). The driver
in :mod:`attn_core.prefill_fused` splits a chunk's bottom-right causal attention over
``[context ; chunk]`` into non-causal parts (the context, earlier chunk tokens) and one square
causal part, and merges them by log-sum-exp.

A backend is used only after :func:`ensure_verified` matched it against the float64 reference
on this device, dtype and head size (cached per process). ``ATTN_CORE_PREFILL_BACKEND`` forces
a backend; a forced one that is unavailable or fails the check raises instead of falling back.
Triton is never used: on Iluvatar only the vendor's flash library is a candidate.
"""

from __future__ import annotations

import dataclasses
import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

import torch

AttendFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, float, bool], tuple[torch.Tensor, torch.Tensor]
]


@dataclass(frozen=True)
class FusedBackend:
    """One fused prefill kernel: where it may run and how to call it."""

    name: str
    description: str
    available: Callable[[torch.device, torch.dtype], Optional[str]]  # None, or why not
    attend: AttendFn


def is_iluvatar(device: torch.device) -> bool:
    """Whether ``device`` is an Iluvatar CoreX GPU (which exposes itself as ``cuda``)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    if getattr(torch.version, "corex", None):
        return True
    return "iluvatar" in torch.cuda.get_device_name(device).lower()


# --- torch SDPA's flash kernel (NVIDIA) ----------------------------------------------------


def _sdpa_available(device: torch.device, dtype: torch.dtype) -> Optional[str]:
    if device.type != "cuda" or not torch.cuda.is_available():
        return "needs a CUDA device"
    if is_iluvatar(device):
        return "not used on Iluvatar (its SDPA path is not the verified NVIDIA kernel)"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"flash kernels take fp16/bf16, got {dtype}"
    if not hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention"):
        return f"torch {torch.__version__} has no flash attention op"
    return None


def _sdpa_attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    # The private op is the one that returns the log-sum-exp (public SDPA does not); it has had
    # this signature from torch 2.1 through 2.x, and the reference check catches any drift.
    t, heads, hs = q.shape
    kvh = k.shape[0]
    group = heads // kvh
    if causal:
        # Square causal block: expand the block's K/V to every query head (block-sized copy).
        qh = q.transpose(0, 1).unsqueeze(0)  # [1, heads, t, hs]
        kh = k.unsqueeze(1).expand(kvh, group, *k.shape[1:]).reshape(1, heads, -1, hs)
        vh = v.unsqueeze(1).expand(kvh, group, *v.shape[1:]).reshape(1, heads, -1, hs)
    else:
        # Non-causal: fold the group into the query axis, [1, kvh, group * t, hs], so K/V are
        # read once per KV head with no copy and no GQA support needed from the kernel.
        qh = q.view(t, kvh, group, hs).permute(1, 2, 0, 3).reshape(1, kvh, group * t, hs)
        kh, vh = k.unsqueeze(0), v.unsqueeze(0)
    out, lse = _flash_with_lse(qh.contiguous(), kh, vh, causal, scale)
    return out.reshape(heads, t, hs).float(), lse.reshape(heads, t).float()


def _flash_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[1, H, L, D]`` inputs -> (out ``[1, H, Lq, D]``, natural-log lse ``[1, H, Lq]``)."""
    res = torch.ops.aten._scaled_dot_product_flash_attention(
        q, k, v, 0.0, causal, False, scale=scale
    )
    return res[0], res[1]


# --- the vendor's flash-attn library (BI-V100) ---------------------------------------------

_VENDOR_MODULE = "flash_attn"


def _vendor_available(device: torch.device, dtype: torch.dtype) -> Optional[str]:
    if not is_iluvatar(device):
        return "only used on Iluvatar CoreX devices"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"flash kernels take fp16/bf16, got {dtype}"
    try:
        mod = importlib.import_module(_VENDOR_MODULE)
    except ImportError as exc:
        return f"{_VENDOR_MODULE} not importable ({exc})"
    if not hasattr(mod, "flash_attn_func"):
        return f"{_VENDOR_MODULE} has no flash_attn_func"
    return None


def _vendor_attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    flash_attn_func = importlib.import_module(_VENDOR_MODULE).flash_attn_func
    # flash-attn layout [batch, tokens, heads, hs]; it broadcasts KV heads over query heads.
    res = flash_attn_func(
        q.unsqueeze(0),
        k.transpose(0, 1).unsqueeze(0),
        v.transpose(0, 1).unsqueeze(0),
        softmax_scale=scale,
        causal=causal,
        return_attn_probs=True,
    )
    out, lse = res[0], res[1]
    return out[0].transpose(0, 1).float(), lse[0].float()


BACKENDS: dict[str, FusedBackend] = {
    b.name: b
    for b in (
        FusedBackend("sdpa", "torch's flash SDPA kernel (NVIDIA)", _sdpa_available, _sdpa_attend),
        FusedBackend(
            "vendor_flash",
            "the vendor's flash_attn library (Iluvatar CoreX)",
            _vendor_available,
            _vendor_attend,
        ),
    )
}


def fused_backend_for(device: torch.device, dtype: torch.dtype, head_size: int) -> Optional[str]:
    """The fused backend the plan should use here, verified; None means the torch path."""
    for name in ("vendor_flash", "sdpa"):
        backend = BACKENDS[name]
        if backend.available(device, dtype) is None and _verify(name, device, dtype, head_size):
            return name
    return None


def ensure_verified(name: str, device: torch.device, dtype: torch.dtype, head_size: int) -> None:
    """Raise ``RuntimeError`` unless backend ``name`` is available and matched the reference."""
    backend = BACKENDS[name]
    why = backend.available(device, dtype)
    if why is not None:
        raise RuntimeError(f"prefill backend {name!r} is not available: {why}")
    if not _verify(name, device, dtype, head_size):
        raise RuntimeError(
            f"prefill backend {name!r} did not match the reference on {device} for {dtype}, "
            f"head_size {head_size}: {_VERDICTS[(name, str(device), dtype, head_size)][1]}"
        )


def verification_report() -> dict[str, str]:
    """What the one-time checks found in this process, for status tools and the bench."""
    return {
        f"{name} {dev} {dtype} hs={hs}": ("ok" if ok else "failed: ") + detail
        for (name, dev, dtype, hs), (ok, detail) in _VERDICTS.items()
    }


_VERDICTS: dict[tuple, tuple[bool, str]] = {}
_LOCK = threading.Lock()
# Max |error| against the float64 reference a fused kernel may show on the check case: a few
# output ulps at these magnitudes (outputs are averages of N(0, 1) values, |out| < 1).
_CHECK_ATOL = {torch.float16: 2e-2, torch.bfloat16: 5e-2}


def _verify(name: str, device: torch.device, dtype: torch.dtype, head_size: int) -> bool:
    key = (name, str(device), dtype, head_size)
    with _LOCK:
        if key not in _VERDICTS:
            _VERDICTS[key] = _run_check(name, device, dtype, head_size)
        return _VERDICTS[key][0]


def _run_check(
    name: str, device: torch.device, dtype: torch.dtype, head_size: int
) -> tuple[bool, str]:
    """Run the backend on a small GQA case (context + chunk, streaming split) vs the reference."""
    from attn_core.plan_prefill import plan_prefill  # runtime imports: they import this module
    from attn_core.prefill import _prefill
    from attn_core.prefill_case import make_prefill_case
    from attn_core.testing import reference_prefix_prefill

    # Three sequences, one of them a single token; the query tile of 8 and 32-token streamed
    # context chunks make every part and merge path run. (Every sequence has context: the shared
    # reference cannot read a zero-token context yet.)
    case = make_prefill_case(
        [(37, 21), (5, 9), (80, 1)], 4, 2, head_size, block_size=16, dtype=dtype, device=device
    )
    plan = plan_prefill(
        4,
        2,
        head_size,
        dtype,
        case.max_query_len,
        max_context_len=80,
        device=device,
        backend=name,
        stream=True,
        query_tile=8,
    )
    plan = dataclasses.replace(plan, stream_chunk=32)
    try:
        got = _prefill(*case.args(), scale=None, out=None, plan=plan, verify=False, **case.kwargs())
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as exc:  # any failure of an optional kernel means "not usable here"
        return False, f"raised {type(exc).__name__}: {exc}"
    want = reference_prefix_prefill(**case.reference_kwargs())
    err = float((got.double().cpu() - want).abs().max())
    ok = bool(err <= _CHECK_ATOL.get(dtype, 1e-3))
    return ok, f"max abs error {err:.2e} (tolerance {_CHECK_ATOL.get(dtype, 1e-3):.0e})"
