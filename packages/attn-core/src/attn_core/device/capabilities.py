"""What a device's torch can do for one compute dtype: the facts a plan depends on besides sizes.

One frozen :class:`Capabilities` per (device, dtype). :func:`probe_capabilities` finds them on
a real device by running two tiny bmms (cached per process); :func:`profile_capabilities`
states them for a :class:`DeviceSpec` profile without probing, as that device's torch would
answer, so the simulator plans exactly what the device would run.

``fused_prefill`` lists the fused prefill backends that are *available* (importable, the right
device); whether one matched the float64 reference is :mod:`attn_core.prefill.verify`'s step,
above the planner, which narrows the list before a plan is made.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Optional

import torch

from attn_core.device.iluvatar import is_iluvatar
from attn_core.device.spec import DeviceSpec

# Fused prefill backends in order of preference: the vendor's kernel where it exists (Iluvatar),
# else torch's flash SDPA (NVIDIA). The kernels themselves are attn_core.prefill.backends'.
FUSED_ORDER = ("vendor_flash", "sdpa")
VENDOR_MODULE = "flash_attn"


@dataclass(frozen=True)
class Capabilities:
    """What the planners may assume of the device for one compute dtype.

    Attributes:
        device_type: ``"cuda"`` (any GPU, Iluvatar included), ``"cpu"`` or ``"meta"``. CPU
            prefill plans keep fp32 matmuls (the fast ones there).
        bmm_writes_fp32: ``torch.bmm(a, b, out_dtype=torch.float32)`` works for this dtype
            (recent torch on CUDA; not torch 2.1, not the CPU). True for fp32 itself. Decode
            then skips the fp32 key copy; bf16 prefill takes fp32 scores.
        half_matmul: bmm runs in this dtype at all (torch 2.1's CPU has no fp16 bmm; decode
            then runs its matmuls in fp32).
        fused_prefill: fused prefill backends available here, in order of preference.
        native_decode: the native decode kernel is built and verified here (set by the
            resolver, :mod:`attn_core.runtime.resolve`, from
            :func:`attn_core.native.loader.native_ready`).
        native_decode_why: why not, in words ("needs a CUDA device, got cpu", "not built:
            ..."); empty when ``native_decode``.
        native_prefill: the native prefill kernel's MMA variants that loaded and matched the
            float64 reference here for the call's configuration (set by the resolver).
        native_prefill_why: why none (or why a variant is missing), in words.
    """

    device_type: str = "cuda"
    bmm_writes_fp32: bool = False
    half_matmul: bool = True
    fused_prefill: tuple[str, ...] = ()
    native_decode: bool = False
    native_decode_why: str = ""
    native_prefill: tuple[str, ...] = ()
    native_prefill_why: str = ""

    def __post_init__(self) -> None:
        unknown = [name for name in self.fused_prefill if name not in FUSED_ORDER]
        if unknown:
            raise ValueError(
                f"Capabilities.fused_prefill must name backends of {FUSED_ORDER}, got {unknown}"
            )


@functools.lru_cache(maxsize=32)
def probe_capabilities(device: torch.device, dtype: torch.dtype) -> Capabilities:
    """The capabilities of ``device`` for ``dtype``, found by running tiny ops (once each)."""
    device = torch.device(device)
    fused = tuple(n for n in FUSED_ORDER if fused_unavailable_reason(n, device, dtype) is None)
    return Capabilities(
        device_type=device.type,
        bmm_writes_fp32=_bmm_writes_fp32(device, dtype),
        half_matmul=_bmm_runs(device, dtype),
        fused_prefill=fused,
    )


# Which torch each built-in profile runs under: the vendor ships torch 2.1 for the BI-V100,
# whose bmm has no ``out_dtype``; the NVIDIA profiles run current torch, whose CUDA bmm writes
# fp32 from fp16/bf16 inputs. Fused prefill: the vendor's flash library on Iluvatar, torch's
# flash SDPA on NVIDIA.
_ILUVATAR_PREFIX = "bi-v100"


def profile_capabilities(spec: DeviceSpec, dtype: torch.dtype) -> Capabilities:
    """The capabilities a ``spec`` device would report for ``dtype``, without probing.

    Profiles named ``bi-v100*`` (calibrated ones too, ``bi-v100+calibrated``) are Iluvatar
    CoreX devices on the vendor's torch 2.1; every other profile is an NVIDIA GPU on current
    torch.
    """
    iluvatar = spec.name.startswith(_ILUVATAR_PREFIX)
    half = dtype in (torch.float16, torch.bfloat16)
    fused = ("vendor_flash",) if iluvatar else ("sdpa",)
    return Capabilities(
        device_type="cuda",
        bmm_writes_fp32=dtype == torch.float32 or not iluvatar,
        half_matmul=True,
        fused_prefill=fused if half else (),
    )


def _bmm_writes_fp32(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``bmm(a, b, out_dtype=float32, out=...)`` runs here and writes the right values.

    The one meaning for decode and prefill alike (decode used to check only the output dtype,
    prefill the values as well; a probe that runs but writes wrong values must count as no).
    """
    if dtype == torch.float32:
        return True
    if device.type != "cuda":
        return False
    try:
        a = torch.ones(1, 2, 8, dtype=dtype, device=device)
        out = torch.empty(1, 2, 2, dtype=torch.float32, device=device)
        torch.bmm(a, a.transpose(1, 2), out_dtype=torch.float32, out=out)
        return bool(out.eq(8.0).all())
    except (TypeError, RuntimeError, NotImplementedError):
        return False


def _bmm_runs(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``torch.bmm`` runs in ``dtype`` here ("baddbmm_with_gemm" not implemented for
    'Half' on torch 2.1's CPU)."""
    if device.type == "meta":
        return True
    try:
        a = torch.ones(1, 2, 8, dtype=dtype, device=device)
        torch.bmm(a, a.transpose(1, 2))
        return True
    except (TypeError, RuntimeError, NotImplementedError):
        return False


def fused_unavailable_reason(name: str, device: torch.device, dtype: torch.dtype) -> Optional[str]:
    """None where fused backend ``name`` can run on ``device`` for ``dtype``, else why not."""
    if name == "sdpa":
        return _sdpa_unavailable(device, dtype)
    if name == "vendor_flash":
        return _vendor_unavailable(device, dtype)
    raise ValueError(f"fused prefill backend must be one of {FUSED_ORDER}, got {name!r}")


def _sdpa_unavailable(device: torch.device, dtype: torch.dtype) -> Optional[str]:
    if device.type != "cuda" or not torch.cuda.is_available():
        return "needs a CUDA device"
    if is_iluvatar(device):
        return "not used on Iluvatar (its SDPA path is not the verified NVIDIA kernel)"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"flash kernels take fp16/bf16, got {dtype}"
    if not hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention"):
        return f"torch {torch.__version__} has no flash attention op"
    return None


def _vendor_unavailable(device: torch.device, dtype: torch.dtype) -> Optional[str]:
    if not is_iluvatar(device):
        return "only used on Iluvatar CoreX devices"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"flash kernels take fp16/bf16, got {dtype}"
    try:
        mod = importlib.import_module(VENDOR_MODULE)
    except ImportError as exc:
        return f"{VENDOR_MODULE} not importable ({exc})"
    if not hasattr(mod, "flash_attn_func"):
        return f"{VENDOR_MODULE} has no flash_attn_func"
    return None
