"""The platform's own attention ops: whether each exists and works, and how far V1 reaches.

An op counts as *present* when the ``_custom_ops`` function exists and, for the upstream
convention, the compiled ``torch.ops`` kernel it calls is registered (the vLLM 0.6.3 wheel on
a CPU-only torch has none: its extensions are built for torch 2.4 + CUDA). A present op counts
as *working* until a call raises ``NotImplementedError`` - the vendor's ``paged_attention_v2``
does exactly that - or until its body is only such a raise. A present, working op is kept
unless ``ENGINE_PATCH_FORCE=1``.

V1 reach: vLLM's V1 kernel keeps every score of a sequence in shared memory
(``padded_max_seq_len * 4`` bytes, plus the query vector and a reduction scratch), so the
longest sequence it can serve is fixed by the block's shared-memory budget. With the BI-V100
profile's 32 KiB (the vendor's vLLM limit) and head 256 fp16 that is 8048 tokens (block 16);
upstream vLLM switches to V2 above 8192 for the same reason.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

import torch

from attn_core import DeviceSpec
from engine_patch.signatures import UPSTREAM, flavour_of

# Compiled kernels behind the upstream ``_custom_ops`` functions: (torch.ops namespace, name).
TORCH_OPS = {
    "paged_attention_v1": ("_C", "paged_attention_v1"),
    "paged_attention_v2": ("_C", "paged_attention_v2"),
    "reshape_and_cache": ("_C_cache_ops", "reshape_and_cache"),
}
# vLLM's paged-attention kernels launch 128 threads per block (NUM_THREADS in the launcher).
V1_THREADS = 128


@dataclass
class NativeOp:
    """One ``_custom_ops`` function as found at registration.

    Attributes:
        name: the op (``paged_attention_v1``, ...).
        fn: the installed function (None when ``_custom_ops`` lacks it).
        flavour: its calling convention (``upstream`` / ``vendor``), None when missing.
        present: it exists and its kernel is registered.
        detail: why it counts as present or not, in words.
        failure: set when a call raised ``NotImplementedError``; it is not used again.
    """

    name: str
    fn: Optional[Callable]
    flavour: Optional[str]
    present: bool
    detail: str
    failure: Optional[str] = None

    @property
    def works(self) -> bool:
        return self.present and self.failure is None


def _kernel_registered(namespace: str, op: str) -> bool:
    try:
        return hasattr(getattr(torch.ops, namespace), op)
    except (AttributeError, RuntimeError):
        return False


def _is_not_implemented_stub(fn: Callable) -> bool:
    """True when the function body only raises ``NotImplementedError``."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    return code is not None and set(code.co_names) == {"NotImplementedError"}


def probe(name: str, custom_ops: object) -> NativeOp:
    """Find ``custom_ops.<name>`` and decide whether the platform really has it."""
    fn = getattr(custom_ops, name, None)
    if fn is None:
        return NativeOp(name, None, None, False, f"_custom_ops has no {name}")
    flavour = flavour_of(name, fn)
    if _is_not_implemented_stub(fn):
        return NativeOp(name, fn, flavour, False, "only raises NotImplementedError")
    if flavour == UPSTREAM:
        namespace, op = TORCH_OPS[name]
        if not _kernel_registered(namespace, op):
            return NativeOp(
                name, fn, flavour, False, f"torch.ops.{namespace}.{op} is not registered"
            )
        return NativeOp(name, fn, flavour, True, f"torch.ops.{namespace}.{op}")
    return NativeOp(name, fn, flavour, True, f"{fn.__module__}.{fn.__qualname__}")


def v1_shared_mem_bytes(
    max_seq_len: int, block_size: int, head_size: int, elem: int, warp_size: int
) -> int:
    """Shared memory one V1 block needs (dynamic logits/outputs + static query and scratch)."""
    num_warps = max(1, V1_THREADS // warp_size)
    padded = -(-max_seq_len // block_size) * block_size
    outputs = (num_warps // 2) * head_size * 4
    return max(padded * 4, outputs) + _v1_static_bytes(head_size, elem, num_warps)


def _v1_static_bytes(head_size: int, elem: int, num_warps: int) -> int:
    """``q_vecs`` (one query head) and ``red_smem`` (2 floats per warp)."""
    return head_size * elem + 2 * num_warps * 4


def v1_max_seq_len(spec: DeviceSpec, block_size: int, head_size: int, elem: int) -> int:
    """Longest ``max_seq_len`` whose V1 launch fits ``spec.shared_mem_per_block``."""
    num_warps = max(1, V1_THREADS // spec.warp_size)
    free = spec.shared_mem_per_block - _v1_static_bytes(head_size, elem, num_warps)
    if (num_warps // 2) * head_size * 4 > free:
        return 0
    return max(0, (free // 4) // block_size * block_size)
