"""Argument types of the bench/ scripts: each raises :class:`argparse.ArgumentTypeError`, so
argparse names the argument and exits 2 before anything is measured (a benchmark that runs for
minutes must not end in "permission denied", nor ignore what it was asked)."""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile

import torch


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def positive_ints(text: str) -> list[int]:
    """``"300,120"``: comma-separated integers >= 1, at least one."""
    items = [t.strip() for t in text.split(",")]
    try:
        values = [int(t) for t in items]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"must be comma-separated integers >= 1, got {text!r}")
    return values


def native_archs(text: str) -> tuple[str, ...]:
    """``--arch``: native build targets (``sm_90`` or ``sm_80,sm_90``), attn-core's one
    validator of them."""
    from attn_core.core.settings import parse_archs

    try:
        return parse_archs("--arch", text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def batches(text: str) -> list[tuple[int, int]]:
    """``"8x16384,2x1024"``: comma-separated ``NxL`` (N sequences of L tokens, both >= 1);
    empty for none."""
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        count, _, length = item.partition("x")
        if not (count.isdigit() and length.isdigit() and int(count) >= 1 and int(length) >= 1):
            raise argparse.ArgumentTypeError(f"must be comma-separated NxL (8x16384), got {item!r}")
        out.append((int(count), int(length)))
    return out


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def device(text: str) -> torch.device:
    """``cpu``, ``cuda`` or ``cuda:N`` that this machine has."""
    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"must be cpu, cuda or cuda:N, got {text!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text!r}: torch sees no CUDA device here; use cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(
            f"must be cuda:0 .. cuda:{torch.cuda.device_count() - 1} here, got {text!r}"
        )
    return dev


def writable_dir(text: str) -> str:
    """A directory this process can write into, created if missing (a probe file is written
    and removed, which also catches read-only filesystems when running as root)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"must name a directory, got {text!r}")
    try:
        os.makedirs(text, exist_ok=True)
        with tempfile.TemporaryFile(dir=text):
            pass
    except (OSError, ValueError) as err:
        why = getattr(err, "strerror", None) or err
        raise argparse.ArgumentTypeError(f"cannot write into {text!r} ({why})") from None
    return text


def not_a_benchmark(doc: str, used_by: str) -> None:
    """``__main__`` of a bench/ module that a benchmark imports and that is none itself: it
    takes no argument (argparse refuses any, exit 2) and says on stderr which script uses it."""
    argparse.ArgumentParser(description=doc.split("\n\n")[0]).parse_args()
    print(f"nothing to run here: {used_by}", file=sys.stderr)
