"""Bytes, FLOPs and launches of one aten op, from shapes alone.

Bytes are what the op touches, not what its operands span: a view is charged for the elements
its sizes and strides address (a slice of the paged cache is charged the slice, a broadcast
operand is charged once), and a gather (``index_select``, ``index.Tensor``, ``gather``,
``embedding``) is charged the rows it reads (output size) plus its indices, never the source.
FLOPs: ``2*m*n*k`` per matrix product (``mm``, ``bmm``, ``addmm``, ``baddbmm``; ``baddbmm``/
``addmm`` add the accumulation), a few per element for ``exp``-heavy reductions, one per output
element otherwise. Views, allocations and metadata ops cost nothing and launch nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

aten = torch.ops.aten

# Classification is by overload packet, so ``bmm.out`` / ``index.Tensor_out`` count as their
# functional forms; an ``out=`` tensor is written, never charged as a read.
FREE = {
    aten._unsafe_view,
    aten.alias,
    aten.detach,
    aten.lift_fresh,
    aten.empty,
    aten.empty_strided,
    aten.empty_like,
    aten.new_empty,
    aten.new_empty_strided,
    aten.set_,
    aten.resize_,
}
GATHERS = {aten.index_select, aten.index, aten.gather, aten.embedding}
SCATTERS = {
    aten.index_put_,
    aten.index_put,
    aten.index_copy_,
    aten.index_copy,
    aten.scatter_,
    aten.scatter,
}
SYNCS = {aten._local_scalar_dense, aten.nonzero, aten.masked_select}
EXP_HEAVY = {aten._softmax, aten._log_softmax, aten.logsumexp, aten.exp, aten.exp_, aten.log}
COPIES = {aten.copy_, aten._to_copy, aten.clone}
MATMULS = {aten.mm, aten.bmm, aten.addmm, aten.baddbmm}
# Fused attention kernels (torch's SDPA backends): q [B, H, L, D], k/v [B, H, S, D].
FUSED_ATTENTION = {
    getattr(aten, name)
    for name in (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
    )
    if hasattr(aten, name)
}


@dataclass
class OpCost:
    bytes_read: int = 0
    bytes_written: int = 0
    flops: int = 0
    launches: int = 0
    syncs: int = 0
    # free | elementwise | reduction | gather | scatter | matmul | attention | copy | sync
    kind: str = "elementwise"
    half_inputs: bool = False  # fp16/bf16 operands: the tensor-core rate applies


def touched_elements(t: torch.Tensor) -> int:
    """Distinct elements a (possibly strided or broadcast) view addresses."""
    if t.numel() == 0:
        return 0
    count = 1
    for size, stride in zip(t.shape, t.stride(), strict=True):
        if stride != 0:
            count *= size
    try:
        span = t.untyped_storage().nbytes() // t.element_size()
    except (RuntimeError, NotImplementedError):
        return count
    return min(count, span) if span else count


def touched_bytes(t: torch.Tensor) -> int:
    return touched_elements(t) * t.element_size()


def _tensors(values: Sequence[Any]) -> list:
    found = []
    for v in values:
        if isinstance(v, torch.Tensor):
            found.append(v)
        elif isinstance(v, (list, tuple)):
            found.extend(x for x in v if isinstance(x, torch.Tensor))
    return found


HALF = (torch.float16, torch.bfloat16)


def _matrix_operand(func, args) -> torch.Tensor:
    """The left matrix (``addmm``/``baddbmm`` take the accumulator first)."""
    return args[1] if func.overloadpacket in (aten.addmm, aten.baddbmm) else args[0]


def _matmul_flops(func, args, outs) -> int:
    out = outs[0]
    packet = func.overloadpacket
    a = _matrix_operand(func, args)
    if packet in (aten.mm, aten.addmm):
        m, k = a.shape
        flops = 2 * m * k * out.shape[-1]
    else:  # bmm / baddbmm: [b, m, k] @ [b, k, n]
        b, m, k = a.shape
        flops = 2 * b * m * k * out.shape[-1]
    if packet in (aten.addmm, aten.baddbmm):
        flops += 2 * out.numel()
    return flops


def _copies_to_host(packet, ins: list, kwargs: dict) -> bool:
    """``.cpu()`` / ``.tolist()`` of a device tensor: the host waits for the device."""
    if packet is not aten._to_copy or not ins or kwargs.get("device") is None:
        return False
    return torch.device(kwargs["device"]).type == "cpu" and ins[0].device.type != "cpu"


def op_cost(func, args: Sequence[Any], kwargs: dict, outs: Sequence[torch.Tensor]) -> OpCost:
    """Cost of ``func(*args, **kwargs)`` that produced tensors ``outs``."""
    packet = func.overloadpacket
    ins = _tensors(list(args) + [v for k, v in kwargs.items() if k != "out"])
    if packet in FREE or getattr(func, "is_view", False):
        return OpCost(kind="free")
    if packet in SYNCS or _copies_to_host(packet, ins, kwargs):
        read = sum(touched_bytes(t) for t in ins)
        return OpCost(bytes_read=read, launches=1, syncs=1, kind="sync")
    written = sum(t.numel() * t.element_size() for t in outs)
    if written == 0 and not ins:
        return OpCost(kind="free")
    if packet in GATHERS:
        index = sum(touched_bytes(t) for t in ins[1:])
        return OpCost(bytes_read=written + index, bytes_written=written, launches=1, kind="gather")
    if packet in SCATTERS:
        src = sum(touched_bytes(t) for t in ins[1:])
        dst = max((t.numel() for t in ins[1:] if t.dtype.is_floating_point), default=0)
        dst *= ins[0].element_size()
        return OpCost(bytes_read=src, bytes_written=dst, launches=1, kind="scatter")
    read = sum(touched_bytes(t) for t in ins)
    if packet in COPIES:
        dst_read = touched_bytes(ins[0]) if packet is aten.copy_ else 0
        return OpCost(bytes_read=read - dst_read, bytes_written=written, launches=1, kind="copy")
    if packet in FUSED_ATTENTION:
        q, k = ins[0], ins[1]
        *batch, length, dim = q.shape
        keys = k.shape[-2]
        heads_batch = 1
        for b in batch:
            heads_batch *= b
        return OpCost(
            bytes_read=read,
            bytes_written=written,
            flops=4 * heads_batch * length * keys * dim,  # q.k and p.v; causal masks not halved
            launches=1,
            kind="attention",
            half_inputs=q.dtype in HALF,
        )
    if packet in MATMULS:
        return OpCost(
            bytes_read=read,
            bytes_written=written,
            flops=_matmul_flops(func, args, outs),
            launches=1,
            kind="matmul",
            half_inputs=_matrix_operand(func, args).dtype in HALF,
        )
    in_elems = max((t.numel() for t in ins), default=0)
    out_elems = max((t.numel() for t in outs), default=0)
    per = 5 if packet in EXP_HEAVY else 1
    return OpCost(
        bytes_read=read,
        bytes_written=written,
        flops=per * max(in_elems, out_elems),
        launches=1,
        kind="reduction" if in_elems > out_elems else "elementwise",
    )
