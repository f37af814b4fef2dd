"""One verify-once registry: a kernel is used only after it matched the float64 reference here.

Every optional kernel (attn-core's native decode, the fused prefill backends, engine-patch's
platform V2, the coming native prefill) registers a *kind* with a check callable; a verdict is
kept per ``(kind, device, config)`` for the process, where ``config`` is a tuple of whatever
selects the compiled code (dtype, head size, block size, GQA group, ...). The rules are the same
for every kind:

- a check runs at most once per key (a lock per key: two threads asking at once run it once;
  other keys are not held up);
- a check never runs while a CUDA graph is being captured (it synchronises): the answer is then
  a not-ok verdict saying so, which is *not* kept, so the first call after capture checks;
- a check that raises is a failed verdict naming the exception, never a crash of the caller;
- :func:`verdicts` lists every verdict (``python -m attn_core.native status``,
  ``engine-patch status``).

Adding a kind: ``register("native_prefill", check)`` where ``check(device, config, subject) ->
Verdict``; ``subject`` is what is checked (a loaded library, a platform op), passed through and
not part of the key, so ``config`` must name whatever tells two subjects apart (a library's
file name, an op's identity).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from attn_core.core.workspace import is_capturing


@dataclass(frozen=True)
class Verdict:
    """Whether a kernel matched the reference; ``detail`` says by how much or what went wrong."""

    ok: bool
    detail: str


Check = Callable[[torch.device, tuple, Any], Verdict]

_CHECKS: dict[str, Check] = {}
_VERDICTS: dict[tuple, Verdict] = {}
_KEY_LOCKS: dict[tuple, threading.Lock] = {}
_LOCK = threading.Lock()  # guards the three dicts, never held while a check runs


def max_error_verdict(
    outputs: Iterable[tuple[str, torch.Tensor]], want: torch.Tensor, tolerance: float
) -> Verdict:
    """A kernel's outputs against the float64 reference ``want`` (on the CPU): every one finite
    and its largest absolute error within ``tolerance``. ``outputs`` yields ``(label, output)``
    (label: the run, as a failure names it); each is waited for before it is read, so a lazy
    iterable runs one launch at a time."""
    worst = 0.0
    for label, got in outputs:
        torch.cuda.synchronize(got.device)
        if not bool(torch.isfinite(got).all()):
            return Verdict(False, f"non-finite output with {label}")
        worst = max(worst, float((got.double().cpu() - want).abs().max()))
    return Verdict(worst <= tolerance, f"max abs error {worst:.1e} (tolerance {tolerance:.0e})")


def register(kind: str, check: Check) -> None:
    """Register (or replace, e.g. on a module reload) the check of ``kind``."""
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"kind must be a non-empty str, got {kind!r}")
    with _LOCK:
        _CHECKS[kind] = check


def verdict(kind: str, device: torch.device, config: tuple, subject: Any = None) -> Verdict:
    """The kept verdict of ``(kind, device, config)``, checking it now if there is none."""
    key = (kind, str(device), config)
    found = _VERDICTS.get(key)
    if found is not None:
        return found
    if is_capturing(torch.device(device)):
        return Verdict(False, "not yet verified on this device, and a CUDA graph is being captured")
    with _LOCK:
        check = _CHECKS.get(kind)
        key_lock = _KEY_LOCKS.setdefault(key, threading.Lock())
    if check is None:
        raise ValueError(f"kind must be a registered verify kind {sorted(_CHECKS)}, got {kind!r}")
    with key_lock:
        found = _VERDICTS.get(key)
        if found is None:
            try:
                found = check(torch.device(device), config, subject)
            except Exception as exc:  # an optional kernel that fails is "not usable here"
                found = Verdict(False, f"raised {type(exc).__name__}: {exc}")
            with _LOCK:
                _VERDICTS[key] = found
    return found


def kept(kind: str, device: torch.device, config: tuple) -> Verdict | None:
    """The kept verdict, or None when none was made (never runs a check)."""
    return _VERDICTS.get((kind, str(device), config))


def verdicts() -> list[tuple[str, str, tuple, Verdict]]:
    """Every verdict of this process: ``(kind, device, config, verdict)``, sorted by kind."""
    with _LOCK:
        items = list(_VERDICTS.items())
    return sorted(((k, d, c, v) for (k, d, c), v in items), key=lambda r: (r[0], r[1], str(r[2])))


def forget(kind: str | None = None) -> None:
    """Drop kept verdicts (of ``kind``, or all): tests, and a rebuilt library."""
    with _LOCK:
        for key in [k for k in _VERDICTS if kind is None or k[0] == kind]:
            del _VERDICTS[key]


def status_lines() -> list[str]:
    """One line per verdict, for the ``status`` commands."""
    return [
        f"{kind} on {device} {config}: {'verified' if v.ok else 'NOT verified'} ({v.detail})"
        for kind, device, config, v in verdicts()
    ]
