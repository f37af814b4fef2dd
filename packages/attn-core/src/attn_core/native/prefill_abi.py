"""The native prefill library's C ABI (``csrc/attn_prefill_abi.h``) mirrored for ctypes.

Field order and types must match the header exactly; :data:`ABI_VERSION` is compared with the
library's ``attn_prefill_abi_version()`` at load, so a stale build is refused, not misread.
"""

from __future__ import annotations

import ctypes

ABI_VERSION = 1

# attn::MmaKind: one library per matrix-tile implementation (csrc/attn_mma.cuh)
MMA_KINDS = {"fma": 0, "wmma": 1, "corex_wmma": 2}

# Tile configurations (csrc/paged_prefill.cu): 0 the large tile (opt-in shared memory), 1 the
# tile that fits BI-V100's 32 KiB per block.
CONFIG_LARGE, CONFIG_32K = 0, 1


class PrefillArgs(ctypes.Structure):
    _fields_ = [
        ("out", ctypes.c_void_p),
        ("query", ctypes.c_void_p),
        ("key", ctypes.c_void_p),
        ("value", ctypes.c_void_p),
        ("key_cache", ctypes.c_void_p),
        ("value_cache", ctypes.c_void_p),
        ("block_tables", ctypes.c_void_p),
        ("query_start_loc", ctypes.c_void_p),
        ("context_lens", ctypes.c_void_p),
        ("alibi_slopes", ctypes.c_void_p),
        ("part_out", ctypes.c_void_p),
        ("part_lse", ctypes.c_void_p),
        ("out_tok_stride", ctypes.c_int64),
        ("out_head_stride", ctypes.c_int64),
        ("q_tok_stride", ctypes.c_int64),
        ("q_head_stride", ctypes.c_int64),
        ("k_tok_stride", ctypes.c_int64),
        ("k_head_stride", ctypes.c_int64),
        ("v_tok_stride", ctypes.c_int64),
        ("v_head_stride", ctypes.c_int64),
        ("kc_block_stride", ctypes.c_int64),
        ("kc_head_stride", ctypes.c_int64),
        ("vc_block_stride", ctypes.c_int64),
        ("vc_head_stride", ctypes.c_int64),
        ("table_stride", ctypes.c_int64),
        ("num_seqs", ctypes.c_int32),
        ("num_tokens", ctypes.c_int32),
        ("num_heads", ctypes.c_int32),
        ("num_kv_heads", ctypes.c_int32),
        ("head_size", ctypes.c_int32),
        ("block_size", ctypes.c_int32),
        ("table_width", ctypes.c_int32),
        ("max_query_len", ctypes.c_int32),
        ("num_splits", ctypes.c_int32),
        ("sliding_window", ctypes.c_int32),
        ("query_kind", ctypes.c_int32),
        ("cache_kind", ctypes.c_int32),
        ("config", ctypes.c_int32),
        ("scale", ctypes.c_float),
        ("k_scale", ctypes.c_float),
        ("v_scale", ctypes.c_float),
    ]


class PrefillConfigInfo(ctypes.Structure):
    _fields_ = [
        ("rows", ctypes.c_int32),
        ("keys", ctypes.c_int32),
        ("threads", ctypes.c_int32),
        ("smem_bytes", ctypes.c_int32),
        ("num_regs", ctypes.c_int32),
        ("local_bytes", ctypes.c_int32),
        ("blocks_per_sm", ctypes.c_int32),
        ("available", ctypes.c_int32),
    ]


def declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Give the library's functions their C signatures."""
    lib.attn_prefill_abi_version.restype = ctypes.c_int
    lib.attn_prefill_abi_version.argtypes = []
    lib.attn_prefill_mma.restype = ctypes.c_int
    lib.attn_prefill_mma.argtypes = []
    lib.attn_prefill_platform.restype = ctypes.c_char_p
    lib.attn_prefill_platform.argtypes = []
    lib.attn_prefill_error_string.restype = ctypes.c_char_p
    lib.attn_prefill_error_string.argtypes = [ctypes.c_int]
    lib.attn_prefill.restype = ctypes.c_int
    lib.attn_prefill.argtypes = [ctypes.POINTER(PrefillArgs), ctypes.c_void_p]
    lib.attn_prefill_config_info.restype = ctypes.c_int
    lib.attn_prefill_config_info.argtypes = [
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.POINTER(PrefillConfigInfo),
    ]
    return lib
