"""Scratch buffers reused across calls, so a steady decode step allocates nothing new.

A :class:`Workspace` hands out views of named flat buffers, one per (name, dtype, device). A
buffer is replaced only when a call needs more elements than it holds; it then grows with
1/8 slack, so a context that grows token by token reallocates every 12.5 % of growth rather than
every block. ``allocations`` counts buffers created (tests read it to prove reuse).

CUDA graphs: a captured graph keeps the addresses of the buffers it used. Once a capture has
been seen, a buffer that grows is retired (kept alive) instead of freed, so replaying an older
graph never writes into memory the allocator gave to someone else.

Threads: a Workspace belongs to one thread at a time. Its buffers are reused by every call, so
two threads calling through one Workspace overwrite each other's scratch (observed: wrong
outputs, max abs error 50.8, and IndexErrors). Instead of a lock (which would serialise the
threads and still let two CUDA streams share buffers), the first entry-point call that uses a
Workspace binds it to its thread (:meth:`Workspace.claim`, via :func:`check_workspace`); a call
from any other thread raises ``RuntimeError`` naming the workspace and both threads.
:meth:`Workspace.release` unbinds it for a deliberate hand-over. ``workspace=None`` in decode uses
:func:`default_workspace`, one per thread, so threads that pass nothing are always safe.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Optional

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
        # (thread ident, thread name) of the owning thread; None until the first claim
        self._owner: Optional[tuple[int, str]] = None
        self._owner_lock = threading.Lock()
        self._buffers: dict[tuple[str, torch.dtype, str], torch.Tensor] = {}
        self._constants: dict[tuple[Hashable, str], torch.Tensor] = {}
        self._retired: list[torch.Tensor] = []
        self._graph_seen = False
        self.allocations = 0
        # bumped whenever a named buffer is made, replaced or dropped: a caller that kept a
        # buffer's address may reuse it while this is unchanged (the steady decode call does)
        self.generation = 0

    def claim(self) -> None:
        """Bind this workspace to the calling thread, or raise if another thread owns it.

        The entry points call this once per call (:func:`check_workspace`); the steady-state
        cost is one ``get_ident`` and a comparison. The lock only guards the first claim, so
        two threads racing for an unowned workspace cannot both win.
        """
        me = threading.get_ident()
        owner = self._owner
        if owner is not None and owner[0] == me:
            return
        with self._owner_lock:
            if self._owner is None:
                self._owner = (me, threading.current_thread().name)
                return
            owner = self._owner
        if owner[0] != me:
            raise RuntimeError(
                f"workspace (Workspace at {id(self):#x}) belongs to thread {owner[1]!r} "
                f"(ident {owner[0]}) and was used from thread "
                f"{threading.current_thread().name!r} (ident {me}): its buffers are reused by "
                "every call, so two threads would overwrite each other's scratch. Give each "
                "thread its own Workspace (decode's workspace=None uses a per-thread default), "
                "or call release() on the owning thread before handing it over."
            )

    def release(self) -> None:
        """Unbind from the owning thread; the next thread that uses the workspace owns it.

        Call it from the owner once its calls are done (on CUDA: once the work they queued has
        finished, or the next owner's stream may overwrite buffers still being read).
        """
        with self._owner_lock:
            self._owner = None

    @property
    def owner(self) -> Optional[tuple[int, str]]:
        """``(thread ident, thread name)`` of the owning thread, or None."""
        return self._owner

    def take(
        self, name: str, shape: Sequence[int], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """A contiguous ``shape`` view of buffer ``name`` (contents undefined)."""
        numel = math.prod(shape)
        return self.flat(name, numel, dtype, device)[:numel].view(shape)

    def flat(self, name: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """Buffer ``name`` itself, at least ``numel`` elements (contents undefined): for a
        caller that needs only its address (the native launch), without making a view."""
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
            self.generation += 1
        return buf

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
        self.generation += 1


def check_workspace(workspace: object) -> Optional[Workspace]:
    """The entry points' ``workspace`` argument: None or a :class:`Workspace` this thread may
    use (claimed for it; see the module docstring). Returns it unchanged."""
    if workspace is None:
        return None
    if not isinstance(workspace, Workspace):
        raise ValueError(
            "workspace must be an attn_core Workspace "
            "(attn_core.core.workspace.Workspace) or None, "
            f"got {_type_name(workspace)}"
        )
    workspace.claim()
    return workspace


def _type_name(value: object) -> str:
    kind = type(value)
    return (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )


_local = threading.local()


def default_workspace() -> Workspace:
    """The calling thread's shared workspace."""
    ws = getattr(_local, "workspace", None)
    if ws is None:
        ws = _local.workspace = Workspace()
    return ws
