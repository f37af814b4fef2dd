"""engine-patch: what the vLLM plugin does in this process, attn-core's plans for the model
shape, and a numeric self-test on the device against attn-core's float64 reference.

    engine-patch [status] [--json] [shape, model, batch, context and device options]
    python -m engine_patch [status] ...
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import textwrap
import traceback
from collections.abc import Iterator
from typing import Any, NoReturn, Optional

import torch

from attn_core.core.shapes import DTYPE_NAMES
from engine_patch import invocation, settings
from engine_patch.exit_codes import EXIT_CONFIG, EXIT_INTERNAL, ConfigurationError, help_text
from engine_patch.status import CONTEXTS, collect, render

COMMANDS = ("status",)  # `status` is also what a command line without a command runs
ENVIRONMENT = (
    "environment: ENGINE_PATCH_FORCE (a boolean), ENGINE_PATCH_V1_MAX_SEQ_LEN, "
    "ENGINE_PATCH_PLATFORM,\n  ENGINE_PATCH_LINEAR_OPS (module:attr=convention,...), the "
    "ENGINE_PATCH_* shape variables above,\n  ATTN_CORE_* (see the README of each package)"
)


class UsageError(ConfigurationError):
    """What argparse cannot parse (exit 2, as every configuration error)."""


class _Parser(argparse.ArgumentParser):
    """Raises instead of printing and exiting, so that ``main`` reports a bad command line the
    way it reports every error (as JSON under ``--json``)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


# Bounds of the numbers status plans for (it allocates nothing for them; the bounds keep a typo
# from planning for days): a batch past vLLM's largest max_num_seqs default (1024) by 64x, a
# context of 16M tokens (attn-core's own bound on plan overrides), a tensor-parallel size past
# any one host's GPUs.
MAX_NUM_SEQS = 65536
MAX_CONTEXT = 1 << 24
MAX_TP = 1024


def _bounded_int(text: str, maximum: Optional[int]) -> int:
    """An integer >= 1, and <= ``maximum`` unless that is None."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1 or (maximum is not None and value > maximum):
        bound = "" if maximum is None else f" and <= {maximum}"
        raise argparse.ArgumentTypeError(f"must be an integer >= 1{bound}, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    """An integer >= 1; the shape's own bounds are checked with its origin (invocation)."""
    return _bounded_int(text, None)


def _num_seqs(text: str) -> int:
    return _bounded_int(text, MAX_NUM_SEQS)


def _tp(text: str) -> int:
    return _bounded_int(text, MAX_TP)


def _contexts(text: str) -> tuple[int, ...]:
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"must name at least one context length (comma-separated integers >= 1), got {text!r}"
        )
    items = text.split(",")
    for item in items:
        try:
            ok = 1 <= int(item) <= MAX_CONTEXT
        except ValueError:
            ok = False
        if not ok:
            raise argparse.ArgumentTypeError(
                f"must be comma-separated context lengths, each an integer >= 1 and "
                f"<= {MAX_CONTEXT}, got {text!r} "
                f"({item!r} is not)"
            )
    return tuple(int(item) for item in items)


def _device(text: str) -> torch.device:
    try:
        device: Optional[torch.device] = torch.device(text)
    except (RuntimeError, ValueError, TypeError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"must be cpu, cuda or cuda:N, got {text!r}")
    return device


def parser() -> argparse.ArgumentParser:
    """``engine-patch``'s parser; its ``--help`` shows the status options and the exit codes."""
    return _parsers()[0]


def _parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The top-level parser and the ``status`` parser."""
    top = _Parser(
        prog="engine-patch",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # `--json` is looked for before parsing (a parse error is JSON too)
    )
    sub = top.add_subparsers(dest="command", title="commands", metavar="{status}")
    status = sub.add_parser(
        "status",
        help="what is patched, the plans, a numeric self-test (the default command)",
        description="What is patched in this process, attn-core's plans, a numeric self-test.",
        epilog=f"{ENVIRONMENT}\n\n{help_text()}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    add = status.add_argument
    add("--json", action="store_true", help="print one JSON object (the report, or the error)")
    add("--heads", type=_positive_int, help="query heads (env ENGINE_PATCH_HEADS; 24)")
    add("--kv-heads", type=_positive_int, help="KV heads (ENGINE_PATCH_KV_HEADS; 4)")
    add("--head-size", type=_positive_int, help="head size (ENGINE_PATCH_HEAD_SIZE; 256)")
    add("--dtype", choices=sorted(DTYPE_NAMES), help="(ENGINE_PATCH_DTYPE; float16)")
    add("--block-size", type=_positive_int, help="(ENGINE_PATCH_BLOCK_SIZE; 16)")
    add("--model", help="checkpoint dir: take heads and head size from its config.json")
    add("--tp", type=_tp, help="tensor-parallel size for --model (default 1)")
    add("--num-seqs", type=_num_seqs, default=1, help="decode batch for the plans (1)")
    add(
        "--contexts",
        type=_contexts,
        default=CONTEXTS,
        help=f"comma-separated context lengths to plan for ({','.join(map(str, CONTEXTS))})",
    )
    add("--device", type=_device, help="cpu, cuda or cuda:N (default: cuda if available)")
    add("--no-self-test", action="store_true", help="skip the numeric check")
    top.epilog = "the status command (run when no command is given):\n\n" + textwrap.indent(
        status.format_help(), "  "
    )
    return top, status


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Keep stdout for the JSON alone: vLLM logs INFO lines to stdout while it loads."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no real fd 1 (embedded interpreters): the Python-level switch suffices
        saved = None
    if saved is not None:
        os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)


def _report(run: invocation.Invocation, as_json: bool) -> dict[str, Any]:
    quiet = _stdout_to_stderr() if as_json else contextlib.nullcontext()
    try:
        with quiet:
            return collect(
                run.shape,
                run.device,
                num_seqs=run.num_seqs,
                contexts=run.contexts,
                self_test=run.self_test,
                layer_plan=run.layer_plan,
            )
    except ValueError as exc:
        # Every input was checked; what attn-core's planner can still refuse is a combination
        # its ATTN_CORE_* overrides allow one by one (a partition size the block size does not
        # divide). With none set, the refusal is engine-patch's own failure.
        overrides = settings.attn_core_overrides_set()
        if not overrides:
            raise
        raise ConfigurationError(
            f"attn-core's plan refused the overrides in effect ({', '.join(overrides)}): {exc}"
        ) from None


def _fail(kind: str, message: str, code: int, as_json: bool, usage: str = "") -> int:
    """Report an error: a line on stderr, and with ``--json`` one JSON object on stdout."""
    label = {"usage": "error", "configuration": "configuration error"}.get(kind, f"{kind} error")
    print(f"{usage}engine-patch: {label}: {message} (exit {code})", file=sys.stderr)
    if as_json:
        error = {"kind": kind, "message": message, "exit_code": code}
        print(json.dumps({"exit_code": code, "error": error}, indent=2))
    return code


def _internal(exc: Exception) -> str:
    """The exception and its innermost frame, in one line."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}; " if frames else ""
    return f"{type(exc).__name__}: {exc} ({where}please report it with the command line)"


def main(argv: Optional[list[str]] = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in (*COMMANDS, "-h", "--help"):
        argv = ["status", *argv]
    as_json = "--json" in argv
    top, status = _parsers()
    try:
        try:
            args = top.parse_args(argv)
        except SystemExit as done:  # --help was printed
            return int(done.code or 0)
        report = _report(invocation.from_args(args), as_json)
    except UsageError as exc:
        return _fail("usage", str(exc), EXIT_CONFIG, as_json, status.format_usage())
    except ConfigurationError as exc:
        return _fail("configuration", str(exc), EXIT_CONFIG, as_json)
    except Exception as exc:  # a bug: one line that says where, never a traceback
        return _fail("internal", _internal(exc), EXIT_INTERNAL, as_json)
    print(json.dumps(report, indent=2, default=str) if as_json else render(report))
    return report["exit_code"]


if __name__ == "__main__":
    sys.exit(main())
