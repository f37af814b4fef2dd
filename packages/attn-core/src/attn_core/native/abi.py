"""What every native library's C ABI shares, mirrored for ctypes.

Element kinds (``csrc/attn_platform.cuh``'s ``attn::ElemKind``), head buckets (the kernels'
shared-memory widths), the fp32 partials a split launch writes, the declaration of a library's
functions, and the CUDA stream a launch goes to. Each family's own structs live in its binding
(:mod:`.decode`, :mod:`.prefill`); their field order and types must match the family's header
exactly, and its ABI version is compared at load, so a stale build is refused, not misread.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import torch

# attn::ElemKind
FLOAT32, FLOAT16, BFLOAT16, FP8_E4M3, FP8_E5M2 = range(5)
QUERY_KINDS = {torch.float32: FLOAT32, torch.float16: FLOAT16, torch.bfloat16: BFLOAT16}
FP8_KINDS = {"fp8": FP8_E4M3, "fp8_e4m3": FP8_E4M3, "fp8_e5m2": FP8_E5M2}
HEAD_BUCKETS = (64, 128, 256)  # the kernels' shared-memory widths; head_size <= bucket
PARTIAL_BYTES = 4  # partial outputs and log-sum-exps are fp32


def cache_kind(query_dtype: torch.dtype, kv_cache_dtype: str) -> int:
    """The cache's element kind: the query's for ``"auto"``, else the fp8 format."""
    return QUERY_KINDS[query_dtype] if kv_cache_dtype == "auto" else FP8_KINDS[kv_cache_dtype]


def head_bucket(head_size: int) -> int:
    """The smallest kernel head bucket that holds ``head_size``."""
    for bucket in HEAD_BUCKETS:
        if head_size <= bucket:
            return bucket
    raise ValueError(f"head_size must be <= {HEAD_BUCKETS[-1]}, got {head_size}")


def partials_shapes(
    rows: int, num_heads: int, parts: int, head_size: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(part_out, part_lse)`` shapes, fp32, of a launch split into ``parts`` pieces (decode's
    partitions of a sequence's context, prefill's splits of a tile's keys): ``[rows, num_heads,
    parts, head_size]`` and ``[rows, num_heads, parts]``, a row being a sequence (decode) or a
    token (prefill). Every family's merge reads this one layout."""
    return (rows, num_heads, parts, head_size), (rows, num_heads, parts)


def partials_bytes(rows: int, num_heads: int, parts: int, head_size: int) -> int:
    """Bytes of :func:`partials_shapes`' buffers (0 for one piece: nothing to merge)."""
    return 0 if parts <= 1 else rows * num_heads * parts * (head_size + 1) * PARTIAL_BYTES


_C_TYPES = {
    "pointer": ctypes.c_void_p,
    "int64": ctypes.c_int64,
    "int32": ctypes.c_int32,
    "float32": ctypes.c_float,
}


def c_struct(name: str, *groups: tuple[str, str]) -> type[ctypes.Structure]:
    """The ctypes mirror of a C struct of a family's ABI header: ``groups`` are ``(type,
    "field field ...")`` in the header's order, ``type`` one of ``pointer``, ``int64``,
    ``int32``, ``float32``."""
    fields = [(field, _C_TYPES[kind]) for kind, names in groups for field in names.split()]
    return type(name, (ctypes.Structure,), {"_fields_": fields})


# ``<prefix>_abi_version``, ``<prefix>_platform`` and ``<prefix>_error_string``: every library
COMMON_FUNCTIONS = {
    "abi_version": (ctypes.c_int, []),
    "platform": (ctypes.c_char_p, []),
    "error_string": (ctypes.c_char_p, [ctypes.c_int]),
}


def declare(lib: ctypes.CDLL, prefix: str, functions: dict[str, tuple[Any, list]]) -> None:
    """Give ``lib``'s functions their C signatures: ``functions`` maps a C name to
    ``(restype, argtypes)``; :data:`COMMON_FUNCTIONS` are added under ``<prefix>_<name>``."""
    common = {f"{prefix}_{name}": sig for name, sig in COMMON_FUNCTIONS.items()}
    for name, (restype, argtypes) in {**common, **functions}.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


def current_stream(device: torch.device) -> int:
    """The current CUDA stream of ``device`` as a ``cudaStream_t`` int (what a graph capture
    records). torch's raw-stream accessor costs 0.13 us per call on the H200 host against 3.5 us
    for ``torch.cuda.current_stream(device).cuda_stream``; where a torch lacks it, the public
    API."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if _RAW_STREAM is not None:
        return int(_RAW_STREAM(index))
    return torch.cuda.current_stream(device).cuda_stream


_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


# What a family's kernel-info export fills (csrc/attn_kernel_info.h AttnKernelInfo, the one
# struct every family that reports its kernels to the simulator includes).
KernelInfo = c_struct(
    "KernelInfo",
    (
        "int32",
        "num_regs smem_bytes local_bytes max_threads_per_block threads_per_block "
        "blocks_per_sm binary_version ptx_version",
    ),
)


@dataclass(frozen=True)
class KernelFacts:
    """One compiled kernel as the driver reports it (what plans and the simulator price)."""

    num_regs: int
    smem_bytes: int
    local_bytes: int
    threads_per_block: int
    blocks_per_sm: int
