"""``python -m attn_core.native {status,build}``: the native kernel's state on this machine.

- ``status``: where the library comes from (prebuilt, cached build, built now) or why there is
  none, and each kernel's registers, shared memory and occupancy as the driver reports them.
- ``build [--arch sm_90,...]``: build now, without a GPU (the lab image's build step).

Exit codes: 0 fine; 1 a compiler was found but the build (or loading) failed; 2 bad usage;
3 no compiler (or no GPU for ``status``): the torch path runs, which is not an error unless
the caller requires the kernel (``|| [ $? -eq 3 ]`` accepts it in a Dockerfile).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from attn_core.native.build import BuildError, build_key, build_library, default_cache_dir
from attn_core.native.toolchain import find_toolchain
from attn_core.settings import current_overrides

OK, FAILED, USAGE, UNAVAILABLE = 0, 1, 2, 3


def _status() -> int:
    import torch
    from tabulate import tabulate

    from attn_core.native import abi
    from attn_core.native.library import load_native

    settings = current_overrides().native
    if not torch.cuda.is_available():
        toolchain, why = find_toolchain(settings.cuda_home)
        found = f"{toolchain.kind} {toolchain.version}" if toolchain else why
        print(f"no CUDA device: the native kernel cannot run here (compiler: {found})")
        return UNAVAILABLE
    lib, status = load_native(settings, torch.device("cuda"))
    print(f"native decode: {'available' if lib else 'unavailable'}: {status.detail}")
    for key in ("path", "toolchain", "platform"):
        if getattr(status, key):
            print(f"  {key}: {getattr(status, key)}")
    if lib is None:
        return FAILED if status.toolchain else UNAVAILABLE
    rows = []
    for bucket in abi.HEAD_BUCKETS:
        for name, kind in (("fp16", abi.FLOAT16), ("bf16", abi.BFLOAT16), ("fp32", abi.FLOAT32)):
            for which in ("partition", "merge"):
                f = lib.kernel_info(which, kind, kind, bucket)
                rows.append((which, bucket, name, f.num_regs, f.static_smem_bytes,
                             f.local_bytes, f.blocks_per_sm))  # fmt: skip
    head = ("kernel", "head bucket", "dtype", "registers", "smem bytes", "spill bytes",
            "blocks/SM")  # fmt: skip
    print(tabulate(rows, headers=head, tablefmt="github"))
    return OK


def _build(archs: Optional[str]) -> int:
    settings = current_overrides().native
    wanted = tuple(a.strip() for a in (archs or settings.arch or "").split(",") if a.strip())
    toolchain, why = find_toolchain(settings.cuda_home, wanted or None)
    if toolchain is None:
        print(f"native kernel not built: {why}")
        return UNAVAILABLE
    cache = Path(settings.cache_dir) if settings.cache_dir else default_cache_dir()
    out_dir = cache / build_key(toolchain)
    try:
        path, seconds = build_library(toolchain, out_dir, log=out_dir / "build.log")
    except (BuildError, OSError) as exc:
        print(f"native kernel build FAILED: {exc}", file=sys.stderr)
        return FAILED
    how = f"built in {seconds:.1f} s" if seconds else "already built"
    print(f"native kernel: {path} ({toolchain.kind} {','.join(toolchain.archs)}, {how})")
    return OK


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attn_core.native", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("status", help="where the library comes from, and its kernels")
    build = sub.add_parser("build", help="build the library now (no GPU needed)")
    build.add_argument("--arch", help="targets, comma-separated (sm_90, ivcore10, ...)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on bad usage, 0 on --help
        return int(exc.code or 0)
    try:
        return _status() if args.command == "status" else _build(args.arch)
    except ValueError as exc:  # a bad ATTN_CORE_* / CUDA_HOME value
        print(f"error: {exc}", file=sys.stderr)
        return USAGE


if __name__ == "__main__":
    sys.exit(main())
