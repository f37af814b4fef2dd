"""Scratch buffers reused across calls, so a steady decode step allocates nothing new.

A :class:`Workspace` hands out views of named flat buffers, one per (name, dtype, device). A
buffer is replaced only when a call needs more elements than it holds; it then grows with
1/8 slack, so a context that grows token by token reallocates every 12.5 % of growth rather than
every block. ``allocations`` counts buffers created (tests read it to prove reuse).

CUDA graphs: a captured graph keeps the addresses of the buffers it used. Once a capture has
been seen, a buffer that grows is retired (kept alive) instead of freed, so replaying an older
graph never writes into memory the allocator gave to someone else.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Hashable, Sequence

import torch

GROWTH_SLACK = 8  # new capacity = needed + needed // GROWTH_SLACK


def is_capturing(device: torch.device) -> bool:
    """Whether the current CUDA stream is capturing a graph (never on other devices)."""
    if device.type != "cuda":
        return False
    check = getattr(torch.cuda, "is_current_stream_capturing", None)
    return bool(check and check())


class Workspace:
    def __init__(self) -> None:
        self._buffers: dict[tuple[str, torch.dtype, str], torch.Tensor] = {}
        self._constants: dict[tuple[Hashable, str], torch.Tensor] = {}
        self._retired: list[torch.Tensor] = []
        self._graph_seen = False
        self.allocations = 0

    def take(
        self, name: str, shape: Sequence[int], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """A contiguous ``shape`` view of buffer ``name`` (contents undefined)."""
        numel = math.prod(shape)
        key = (name, dtype, str(device))
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < numel:
            if is_capturing(device):
                self._graph_seen = True
            if buf is not None and self._graph_seen:
                self._retired.append(buf)
            # exact on first use (the transient-memory budget counts it); slack once growing
            capacity = numel if buf is None else numel + numel // GROWTH_SLACK
            buf = torch.empty(capacity, dtype=dtype, device=device)
            self._buffers[key] = buf
            self.allocations += 1
        return buf[:numel].view(shape)

    def constant(
        self,
        key: Hashable,
        make: Callable[[torch.device], torch.Tensor],
        device: torch.device,
    ) -> torch.Tensor:
        """A tensor that depends only on ``key`` (aranges, a zero): made once, on ``device``.

        Steady-state calls then launch nothing for it; ``make(device)`` builds it on the device
        itself (a host-to-device copy would be illegal inside a CUDA-graph capture).
        """
        full = (key, str(device))
        t = self._constants.get(full)
        if t is None:
            t = self._constants[full] = make(device)
            self.allocations += 1
        return t

    def arange(self, n: int, device: torch.device) -> torch.Tensor:
        """``arange(n)`` (int64) as a view of one growing buffer: no launch in steady state."""
        key = ("arange", str(device))
        buf = self._constants.get(key)
        if buf is None or buf.numel() < n:
            if buf is not None and (self._graph_seen or is_capturing(device)):
                self._graph_seen = True
                self._retired.append(buf)
            capacity = n if buf is None else n + n // GROWTH_SLACK
            buf = self._constants[key] = torch.arange(capacity, device=device)
            self.allocations += 1
        return buf[:n]

    @property
    def nbytes(self) -> int:
        """Bytes held, retired buffers included."""
        held = list(self._buffers.values()) + self._retired + list(self._constants.values())
        return sum(b.numel() * b.element_size() for b in held)

    def clear(self) -> None:
        """Drop every buffer (do not call while a captured graph that used them may replay)."""
        self._buffers.clear()
        self._retired.clear()
        self._constants.clear()


_local = threading.local()


def default_workspace() -> Workspace:
    """The calling thread's shared workspace."""
    ws = getattr(_local, "workspace", None)
    if ws is None:
        ws = _local.workspace = Workspace()
    return ws
