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

FREE = {
    aten._unsafe_view.default,
    aten.alias.default,
    aten.detach.default,
    aten.lift_fresh.default,
    aten.empty.memory_format,
    aten.empty_strided.default,
    aten.empty_like.default,
    aten.new_empty.default,
    aten.new_empty_strided.default,
    aten.set_.source_Tensor,
    aten.resize_.default,
}
GATHERS = {
    aten.index_select.default,
    aten.index.Tensor,
    aten.gather.default,
    aten.embedding.default,
}
SCATTERS = {
    aten.index_put_.default,
    aten.index_put.default,
    aten.index_copy_.default,
    aten.index_copy.default,
    aten.scatter_.src,
    aten.scatter.src,
    aten.scatter_.value,
    aten.scatter.value,
}
SYNCS = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default}
EXP_HEAVY = {
    aten._softmax.default,
    aten._log_softmax.default,
    aten.logsumexp.default,
    aten.exp.default,
    aten.exp_.default,
    aten.log.default,
}


@dataclass
class OpCost:
    bytes_read: int = 0
    bytes_written: int = 0
    flops: int = 0
    launches: int = 0
    syncs: int = 0
    kind: str = "elementwise"  # free | elementwise | reduction | gather | scatter | matmul | copy


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


def _matmul_flops(func, args, outs) -> int:
    out = outs[0]
    if func in (aten.mm.default, aten.addmm.default):
        a = args[-2]
        m, k = a.shape
        flops = 2 * m * k * out.shape[-1]
    else:  # bmm / baddbmm: [b, m, k] @ [b, k, n]
        a = args[-2]
        b, m, k = a.shape
        flops = 2 * b * m * k * out.shape[-1]
    if func in (aten.addmm.default, aten.baddbmm.default):
        flops += 2 * out.numel()
    return flops


MATMULS = {aten.mm.default, aten.bmm.default, aten.addmm.default, aten.baddbmm.default}


def op_cost(func, args: Sequence[Any], kwargs: dict, outs: Sequence[torch.Tensor]) -> OpCost:
    """Cost of ``func(*args, **kwargs)`` that produced tensors ``outs``."""
    ins = _tensors(list(args) + list(kwargs.values()))
    if func in FREE or getattr(func, "is_view", False):
        return OpCost(kind="free")
    if func in SYNCS:
        read = sum(touched_bytes(t) for t in ins)
        return OpCost(bytes_read=read, launches=1, syncs=1, kind="sync")
    written = sum(t.numel() * t.element_size() for t in outs)
    if written == 0 and not ins:
        return OpCost(kind="free")
    if func in GATHERS:
        index = sum(touched_bytes(t) for t in ins[1:])
        return OpCost(bytes_read=written + index, bytes_written=written, launches=1, kind="gather")
    if func in SCATTERS:
        src = sum(touched_bytes(t) for t in ins[1:])
        dst = max((t.numel() for t in ins[1:] if t.dtype.is_floating_point), default=0)
        dst *= ins[0].element_size()
        return OpCost(bytes_read=src, bytes_written=dst, launches=1, kind="scatter")
    read = sum(touched_bytes(t) for t in ins)
    if func in (aten.copy_.default, aten._to_copy.default, aten.clone.default):
        return OpCost(
            bytes_read=read - (touched_bytes(ins[0]) if func == aten.copy_.default else 0),
            bytes_written=written,
            launches=1,
            kind="copy",
        )
    if func in MATMULS:
        return OpCost(
            bytes_read=read,
            bytes_written=written,
            flops=_matmul_flops(func, args, outs),
            launches=1,
            kind="matmul",
        )
    in_elems = max((t.numel() for t in ins), default=0)
    out_elems = max((t.numel() for t in outs), default=0)
    reduction = in_elems > out_elems
    per = 5 if func in EXP_HEAVY else 1
    return OpCost(
        bytes_read=read,
        bytes_written=written,
        flops=per * max(in_elems, out_elems),
        launches=1,
        kind="reduction" if reduction else "elementwise",
    )
