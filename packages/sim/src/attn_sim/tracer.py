"""Record every aten op a function issues, on meta tensors, with what each op would cost.

``trace(fn, *args, **kwargs)`` runs ``fn`` under a :class:`TorchDispatchMode`. Big tensors are
``meta`` (shapes, strides and dtypes, no memory), so a 1M-token context costs nothing. Small
index tensors the code may read on the host (``.item()``, ``.tolist()``, ``.cpu()``) can carry a
*shadow*: a real CPU copy given through ``shadows={meta_tensor: cpu_tensor}``. Any op whose tensor
inputs all have shadows also runs on the shadows, so derived values (``seq_lens.max()``,
``cumsum``, ``nonzero``) stay known; a host read of a meta tensor without a shadow raises
:class:`HostReadError` naming the op, which tells the caller which input to shadow.

Memory: an op whose output does not share storage with an input allocated that storage; its
bytes are live until the output tensor is freed. ``Trace.peak_bytes`` is the highest total of
such live bytes during the call (transient memory), ``Trace.retained_bytes`` what was still live
at the end (outputs and workspaces that stayed).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.weak import WeakTensorKeyDictionary

from attn_sim.op_rules import OpCost, op_cost

aten = torch.ops.aten
SHADOW_MAX_NUMEL = 1 << 20  # derived values bigger than this are not shadowed (keeps CPU cheap)


class HostReadError(RuntimeError):
    """The traced code read a device value that has no CPU shadow."""


@dataclass
class OpRecord:
    name: str
    in_shapes: tuple[tuple[int, ...], ...]
    in_dtypes: tuple[str, ...]
    out_shapes: tuple[tuple[int, ...], ...]
    out_dtypes: tuple[str, ...]
    cost: OpCost
    allocated: int  # bytes of new storage this op created


@dataclass
class Trace:
    ops: list[OpRecord] = field(default_factory=list)
    peak_bytes: int = 0
    retained_bytes: int = 0

    @property
    def launches(self) -> int:
        return sum(op.cost.launches for op in self.ops)

    @property
    def syncs(self) -> int:
        return sum(op.cost.syncs for op in self.ops)

    @property
    def bytes(self) -> int:
        return sum(op.cost.bytes_read + op.cost.bytes_written for op in self.ops)

    @property
    def flops(self) -> int:
        return sum(op.cost.flops for op in self.ops)

    def kernels(self) -> list[OpRecord]:
        """Ops that launch something."""
        return [op for op in self.ops if op.cost.launches]


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(s) for s in t.shape)


def _storage_key(t: torch.Tensor) -> Optional[int]:
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        return None


class _Recorder(TorchDispatchMode):
    def __init__(self, trace: Trace):
        super().__init__()
        self.trace = trace
        # meta tensor -> its CPU shadow, held weakly so a shadowed tensor is freed (and its
        # bytes leave the live count) like any other
        self.shadows = WeakTensorKeyDictionary()
        self.live = 0

    # shadows -------------------------------------------------------------------------------
    def _shadow_of(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if value.device.type != "meta":
                return value
            return self.shadows.get(value)
        return value

    def _all_shadowed(self, args, kwargs) -> bool:
        flat, _ = tree_flatten((args, kwargs))
        metas = [v for v in flat if isinstance(v, torch.Tensor) and v.device.type == "meta"]
        return bool(metas) and all(v in self.shadows for v in metas)

    def add_shadow(self, meta: torch.Tensor, cpu: torch.Tensor) -> None:
        self.shadows[meta] = cpu

    # dispatch ------------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        shadow_out = None
        if self._all_shadowed(args, kwargs):
            cpu_args, cpu_kwargs = tree_map(self._shadow_of, (args, kwargs))
            cpu_kwargs = _to_cpu_kwargs(cpu_kwargs)
            shadow_out = func(*cpu_args, **cpu_kwargs)
        host_read = _host_read(func, args, kwargs)
        if host_read:
            self._record(func, args, kwargs, [])
            if shadow_out is None:
                raise HostReadError(f"traced code {host_read}; give that input a CPU shadow")
            return shadow_out
        try:
            out = func(*args, **kwargs)
        except (NotImplementedError, RuntimeError):
            if shadow_out is None:
                raise
            out = tree_map(_meta_like, shadow_out)  # data-dependent shape: take it from the shadow
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        self._record(func, args, kwargs, outs)
        if shadow_out is not None:
            cpu_outs = [t for t in tree_flatten(shadow_out)[0] if isinstance(t, torch.Tensor)]
            for meta, cpu in zip(outs, cpu_outs, strict=False):
                if cpu.numel() <= SHADOW_MAX_NUMEL:
                    self.add_shadow(meta, cpu)
        return out

    def _record(self, func, args, kwargs, outs) -> None:
        flat_in = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        cost = op_cost(func, args, kwargs, outs)
        in_keys = {_storage_key(t) for t in flat_in}
        allocated = 0
        seen = set()
        for t in outs:
            key = _storage_key(t)
            if (
                key is None
                or key in in_keys
                or key in seen
                or cost.kind == "free"
                and (func not in _ALLOCATORS)
            ):
                continue
            seen.add(key)
            nbytes = t.untyped_storage().nbytes()
            allocated += nbytes
            self._alloc(t, nbytes)
        self.trace.ops.append(
            OpRecord(
                name=str(func.overloadpacket.__name__) + "." + func._overloadname,
                in_shapes=tuple(_shape(t) for t in flat_in),
                in_dtypes=tuple(str(t.dtype).replace("torch.", "") for t in flat_in),
                out_shapes=tuple(_shape(t) for t in outs),
                out_dtypes=tuple(str(t.dtype).replace("torch.", "") for t in outs),
                cost=cost,
                allocated=allocated,
            )
        )

    def _alloc(self, t: torch.Tensor, nbytes: int) -> None:
        self.live += nbytes
        self.trace.peak_bytes = max(self.trace.peak_bytes, self.live)
        weakref.finalize(t, self._free, nbytes)

    def _free(self, nbytes: int) -> None:
        self.live -= nbytes


_ALLOCATORS = {
    aten.empty.memory_format,
    aten.empty_strided.default,
    aten.empty_like.default,
    aten.new_empty.default,
    aten.new_empty_strided.default,
}


def _target_device(kwargs: dict) -> Optional[str]:
    dev = kwargs.get("device")
    return None if dev is None else torch.device(dev).type


def _host_read(func, args: tuple, kwargs: dict) -> Optional[str]:
    """What ``func`` does that needs a meta tensor's values on the host, in words; None when
    it needs none."""
    if func is aten._local_scalar_dense.default:
        return (
            f"read a value of a meta tensor of shape {_shape(args[0])} (.item()/.tolist()/.cpu())"
        )
    if func is aten._to_copy.default and _target_device(kwargs) == "cpu":
        return f"copied a meta tensor of shape {_shape(args[0])} to the host"
    return None


def _to_cpu_kwargs(kwargs: dict) -> dict:
    if "device" in kwargs and kwargs["device"] is not None:
        if torch.device(kwargs["device"]).type == "meta":
            return {**kwargs, "device": torch.device("cpu")}
    return kwargs


def _meta_like(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
    return v


def trace(
    fn: Callable[..., Any],
    *args: Any,
    shadows: Optional[dict[torch.Tensor, torch.Tensor]] = None,
    **kwargs: Any,
) -> tuple[Trace, Any]:
    """Run ``fn(*args, **kwargs)`` under the recorder; returns ``(trace, result)``.

    Args:
        shadows: ``{meta_tensor: cpu_tensor}`` host copies of small inputs whose values the code
            may read (lengths, offsets). Values must match the meta tensor's shape and dtype.
    """
    record = Trace()
    recorder = _Recorder(record)
    for meta, cpu in (shadows or {}).items():
        if meta.shape != cpu.shape or meta.dtype != cpu.dtype:
            raise ValueError(
                f"shadows must match their tensors, got {tuple(cpu.shape)} {cpu.dtype} for "
                f"{tuple(meta.shape)} {meta.dtype}"
            )
        recorder.add_shadow(meta, cpu)
    with recorder:
        result = fn(*args, **kwargs)
    record.retained_bytes = recorder.live
    return record, result
