"""``engine-patch status [--json] [shape flags]``, also ``python -m engine_patch status``."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from typing import Optional

import torch

from engine_patch.settings import DTYPES, ModelShape
from engine_patch.status import CONTEXTS, collect, render


def _shape_from(args: argparse.Namespace) -> ModelShape:
    env = ModelShape.from_env()
    if args.model:
        env = _shape_from_config(args.model, env, args.tp)
    return ModelShape(
        num_heads=args.heads or env.num_heads,
        num_kv_heads=args.kv_heads or env.num_kv_heads,
        head_size=args.head_size or env.head_size,
        dtype=args.dtype or env.dtype,
        block_size=args.block_size or env.block_size,
    )


def _shape_from_config(path: str, base: ModelShape, tp: int) -> ModelShape:
    """One tensor-parallel rank's attention shape from a checkpoint's ``config.json``."""
    from transformers import AutoConfig

    from engine_patch.qwen3_5_moe import register_qwen3_5_moe

    register_qwen3_5_moe()
    config = AutoConfig.from_pretrained(path)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    kv = getattr(text, "num_key_value_heads", heads)
    head = getattr(text, "head_dim", None) or text.hidden_size // heads
    if heads % tp:
        raise ValueError(f"--tp must divide num_attention_heads ({heads}), got {tp}")
    return ModelShape(heads // tp, max(1, kv // tp), head, base.dtype, base.block_size)


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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="engine-patch", description=__doc__)
    sub = parser.add_subparsers(dest="command")
    status = sub.add_parser("status", help="what is patched, the plans, a numeric self-test")
    status.add_argument("--json", action="store_true", help="print the report as JSON")
    status.add_argument("--heads", type=int, help="query heads (env ENGINE_PATCH_HEADS; 24)")
    status.add_argument("--kv-heads", type=int, help="KV heads (ENGINE_PATCH_KV_HEADS; 4)")
    status.add_argument("--head-size", type=int, help="head size (ENGINE_PATCH_HEAD_SIZE; 256)")
    status.add_argument("--dtype", choices=sorted(DTYPES), help="(ENGINE_PATCH_DTYPE; float16)")
    status.add_argument("--block-size", type=int, help="(ENGINE_PATCH_BLOCK_SIZE; 16)")
    status.add_argument("--model", help="checkpoint dir: take the shape from its config.json")
    status.add_argument("--tp", type=int, default=1, help="tensor-parallel size for --model")
    status.add_argument("--num-seqs", type=int, default=1, help="decode batch for the plans")
    status.add_argument(
        "--contexts",
        default=",".join(str(c) for c in CONTEXTS),
        help="comma-separated context lengths to plan for",
    )
    status.add_argument("--device", help="default: cuda if available, else cpu")
    status.add_argument("--no-self-test", action="store_true", help="skip the numeric check")
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    parser = _parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("status", "-h", "--help"):
        argv = ["status", *argv]  # status is the only command: `engine-patch --json` works too
    args = parser.parse_args(argv)
    try:
        shape = _shape_from(args)
        contexts = [int(c) for c in args.contexts.split(",") if c.strip()]
    except ValueError as exc:
        parser.error(str(exc))
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    quiet = _stdout_to_stderr() if args.json else contextlib.nullcontext()
    with quiet:
        report = collect(
            shape,
            device,
            num_seqs=args.num_seqs,
            contexts=contexts,
            self_test=not args.no_self_test,
        )
    print(json.dumps(report, indent=2, default=str) if args.json else render(report))
    return report["exit_code"]


if __name__ == "__main__":
    sys.exit(main())
