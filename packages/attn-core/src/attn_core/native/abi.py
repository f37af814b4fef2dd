"""The native library's C ABI (``csrc/attn_decode_abi.h``) mirrored for ctypes.

Field order and types must match the header exactly; :data:`ABI_VERSION` is compared with the
library's ``attn_native_abi_version()`` at load, so a stale build is refused, not misread.
"""

from __future__ import annotations

import ctypes

import torch

ABI_VERSION = 4

# attn::ElemKind
FLOAT32, FLOAT16, BFLOAT16, FP8_E4M3, FP8_E5M2 = range(5)
QUERY_KINDS = {torch.float32: FLOAT32, torch.float16: FLOAT16, torch.bfloat16: BFLOAT16}
FP8_KINDS = {"fp8": FP8_E4M3, "fp8_e4m3": FP8_E4M3, "fp8_e5m2": FP8_E5M2}
HEAD_BUCKETS = (64, 128, 256)  # the kernel's shared-memory sizes; head_size <= bucket


def cache_kind(query_dtype: torch.dtype, kv_cache_dtype: str) -> int:
    """The cache's element kind: the query's for ``"auto"``, else the fp8 format."""
    return QUERY_KINDS[query_dtype] if kv_cache_dtype == "auto" else FP8_KINDS[kv_cache_dtype]


GROUP_MAX = 8  # query heads one block serves at most (kGroupMax)


def group_slots(group: int) -> int:
    """Head slots of the kernel serving a GQA group, as ``csrc/paged_decode.cu`` computes them:
    the group itself up to 8, else the group spread evenly over ``ceil(group / 8)`` blocks."""
    if group < 1:
        raise ValueError(f"group must be >= 1, got {group}")
    blocks = -(-group // GROUP_MAX)
    return -(-group // blocks)


def head_bucket(head_size: int) -> int:
    """The smallest kernel head bucket that holds ``head_size``."""
    for bucket in HEAD_BUCKETS:
        if head_size <= bucket:
            return bucket
    raise ValueError(f"head_size must be <= {HEAD_BUCKETS[-1]}, got {head_size}")


class DecodeArgs(ctypes.Structure):
    _fields_ = [
        ("out", ctypes.c_void_p),
        ("query", ctypes.c_void_p),
        ("key_cache", ctypes.c_void_p),
        ("value_cache", ctypes.c_void_p),
        ("block_tables", ctypes.c_void_p),
        ("seq_lens", ctypes.c_void_p),
        ("alibi_slopes", ctypes.c_void_p),
        ("part_out", ctypes.c_void_p),
        ("part_lse", ctypes.c_void_p),
        ("out_seq_stride", ctypes.c_int64),
        ("out_head_stride", ctypes.c_int64),
        ("q_seq_stride", ctypes.c_int64),
        ("q_head_stride", ctypes.c_int64),
        ("k_block_stride", ctypes.c_int64),
        ("k_head_stride", ctypes.c_int64),
        ("v_block_stride", ctypes.c_int64),
        ("v_head_stride", ctypes.c_int64),
        ("table_stride", ctypes.c_int64),
        ("num_seqs", ctypes.c_int32),
        ("num_heads", ctypes.c_int32),
        ("num_kv_heads", ctypes.c_int32),
        ("head_size", ctypes.c_int32),
        ("block_size", ctypes.c_int32),
        ("table_width", ctypes.c_int32),
        ("num_partitions", ctypes.c_int32),
        ("partition_size", ctypes.c_int32),
        ("query_kind", ctypes.c_int32),
        ("cache_kind", ctypes.c_int32),
        ("scale", ctypes.c_float),
        ("v_scale", ctypes.c_float),
    ]


class KernelInfo(ctypes.Structure):
    _fields_ = [
        ("num_regs", ctypes.c_int32),
        ("smem_bytes", ctypes.c_int32),
        ("local_bytes", ctypes.c_int32),
        ("max_threads_per_block", ctypes.c_int32),
        ("threads_per_block", ctypes.c_int32),
        ("blocks_per_sm", ctypes.c_int32),
        ("binary_version", ctypes.c_int32),
        ("ptx_version", ctypes.c_int32),
    ]


def declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Give the library's functions their C signatures."""
    lib.attn_native_abi_version.restype = ctypes.c_int
    lib.attn_native_abi_version.argtypes = []
    lib.attn_native_group_slots.restype = ctypes.c_int
    lib.attn_native_group_slots.argtypes = []
    lib.attn_native_platform.restype = ctypes.c_char_p
    lib.attn_native_platform.argtypes = []
    lib.attn_native_error_string.restype = ctypes.c_char_p
    lib.attn_native_error_string.argtypes = [ctypes.c_int]
    lib.attn_native_decode.restype = ctypes.c_int
    lib.attn_native_decode.argtypes = [ctypes.POINTER(DecodeArgs), ctypes.c_void_p]
    lib.attn_native_kernel_info.restype = ctypes.c_int
    lib.attn_native_kernel_info.argtypes = [
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.POINTER(KernelInfo),
    ]
    return lib
