"""``python -m attn_core.native {status,build}``: the native kernel's state on this machine.

- ``status``: where the library comes from (prebuilt, cached build, built now) or why there is
  none, each kernel's registers, shared memory and occupancy as the driver reports them, and
  the verify-once registry's verdicts (fp16, head 256, block 16 checked for each group).
- ``build [--arch sm_90,...]``: build every head-slot library now, in parallel, without a GPU
  (the lab image's build step).
- ``facts [--write]``: each kernel's registers, shared memory and spills from the build logs;
  ``--write`` records them in ``kernel_facts.json`` for the simulator.

Exit codes: 0 fine; 1 a compiler was found but the build (or loading) failed; 2 bad usage;
3 no compiler (or no GPU for ``status``): the torch path runs, which is not an error unless
the caller requires the kernel (``|| [ $? -eq 3 ]`` accepts it in a Dockerfile).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from attn_core.core.settings import current_overrides
from attn_core.native.build import BuildError, build_all, build_key, default_cache_dir
from attn_core.native.toolchain import find_toolchain, parse_archs

OK, FAILED, USAGE, UNAVAILABLE = 0, 1, 2, 3
DTYPES = (("fp16", 1), ("bf16", 2), ("fp32", 0))  # names and attn_core.native.abi kinds


def _status(groups: tuple[int, ...]) -> int:
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
    rows = []
    for group in groups:
        lib, status = load_native(settings, torch.device("cuda"), group)
        state = "available" if lib else "unavailable"
        print(f"native decode, GQA group {group}: {state}: {status.detail}")
        for key in ("path", "toolchain", "platform"):
            if getattr(status, key):
                print(f"  {key}: {getattr(status, key)}")
        if lib is None:
            return FAILED if status.toolchain else UNAVAILABLE
        for bucket in abi.HEAD_BUCKETS:
            for name, kind in (
                ("fp16", abi.FLOAT16),
                ("bf16", abi.BFLOAT16),
                ("fp32", abi.FLOAT32),
            ):
                for which in ("partition", "merge"):
                    f = lib.kernel_info(which, kind, kind, bucket, group)
                    rows.append((which, group, bucket, name, f.num_regs, f.static_smem_bytes,
                                 f.local_bytes, f.blocks_per_sm))  # fmt: skip
    head = ("kernel", "group", "head bucket", "dtype", "registers", "smem bytes", "spill bytes",
            "blocks/SM")  # fmt: skip
    print(tabulate(rows, headers=head, tablefmt="github"))
    from attn_core.core import verify_once
    from attn_core.native.verify import verify_native

    for group in groups:  # Qwen3.6's head size in fp16: the configuration decode would check
        lib, _ = load_native(settings, torch.device("cuda"), group)
        if lib is not None:
            verify_native(lib, torch.device("cuda"), torch.float16, "auto", 256, 16, group)
    print("checked against the float64 reference (verify-once registry):")
    print("\n".join(verify_once.status_lines()) or "  none")
    return OK


def _build(archs: Optional[str]) -> int:
    settings = current_overrides().native
    if archs is not None:
        wanted = parse_archs("--arch", archs)
    else:
        wanted = parse_archs("ATTN_CORE_NATIVE_ARCH", settings.arch or "")
    toolchain, why = find_toolchain(settings.cuda_home, wanted or None)
    if toolchain is None:
        print(f"native kernel not built: {why}")
        return UNAVAILABLE
    cache = Path(settings.cache_dir) if settings.cache_dir else default_cache_dir()
    out_dir = cache / build_key(toolchain)
    try:
        seconds = build_all(toolchain, out_dir)
    except (BuildError, OSError) as exc:
        print(f"native kernel build FAILED: {exc}", file=sys.stderr)
        return FAILED
    print(f"native kernels: {out_dir} ({toolchain.kind} {','.join(toolchain.archs)}, "
          f"{seconds:.1f} s)")  # fmt: skip
    return OK


def _facts(write: bool) -> int:
    from tabulate import tabulate

    from attn_core.native import facts
    from attn_core.native.build import SLOTS, library_name, log_path, source_digest

    code = _build(None)
    if code != OK:
        return code
    settings = current_overrides().native
    toolchain, _ = find_toolchain(settings.cuda_home, (settings.arch or "sm_90",))
    assert toolchain is not None  # _build found it
    out_dir = (Path(settings.cache_dir) if settings.cache_dir else default_cache_dir()) / build_key(
        toolchain
    )
    logs = [log_path(out_dir / library_name(n)) for n in SLOTS]
    records = [r for log in logs for r in facts.parse_ptxas(log.read_text())]
    print(tabulate([r.__dict__ for r in records], headers="keys", tablefmt="github"))
    if write:
        compiler = f"{toolchain.kind} {toolchain.version}"
        path = facts.write_facts(logs, compiler, ",".join(toolchain.archs), source_digest())
        print(f"wrote {path}")
    return OK


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attn_core.native", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = parser.add_subparsers(dest="command", required=True)
    status = sub.add_parser("status", help="where the libraries come from, and their kernels")
    status.add_argument("--groups", default="6", help="GQA groups to load (default 6: Qwen3.6)")
    build = sub.add_parser("build", help="build the library now (no GPU needed)")
    build.add_argument("--arch", help="targets, comma-separated (sm_90, ivcore10, ...)")
    facts = sub.add_parser("facts", help="registers and shared memory per kernel (build logs)")
    facts.add_argument("--write", action="store_true", help="record them in kernel_facts.json")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on bad usage, 0 on --help
        return int(exc.code or 0)
    try:
        if args.command == "build":
            return _build(args.arch)
        if args.command == "facts":
            return _facts(args.write)
        parts = [g.strip() for g in args.groups.split(",") if g.strip()]
        if not parts or not all(g.isdigit() and int(g) >= 1 for g in parts):
            raise ValueError(f"--groups must list positive integers, got {args.groups!r}")
        return _status(tuple(int(g) for g in parts))
    except ValueError as exc:  # a bad ATTN_CORE_* / CUDA_HOME value
        print(f"error: {exc}", file=sys.stderr)
        return USAGE


if __name__ == "__main__":
    sys.exit(main())
