"""``python -m attn_core.native {status,build,facts}``: the native kernels on this machine.

- ``status``: where the library comes from (prebuilt, cached build, built now) or why there is
  none, each kernel's registers, shared memory and occupancy as the driver reports them beside
  the ``kernel_facts.json`` record this device's plans are sized from (on a BI-V100: CoreX's
  build against its nvcc stand-in; differences marked and counted), and
  the verify-once registry's verdicts (fp16, head 256, block 16 checked for each group); the
  native prefill's MMA variants (library, tile resources, verdict for Qwen3.6's shape) and the
  prefill plan of an 8192-token chunk over 100K of context with its reason.
- ``build [--arch sm_90,...]``: build every kernel family's libraries now (decode: one per head
  slot count; prefill: one per matrix-tile layer the compiler has), in parallel, without a GPU
  (the lab image's build step), one line per library as it is done; without ``--arch``,
  ``ATTN_CORE_NATIVE_ARCH`` or every target the compiler supports.
- ``facts [--write]``: build as ``build`` does, then each kernel's registers, shared memory and
  spills from that build's logs; ``--write`` records them in ``kernel_facts.json``.

Builds go to ``ATTN_CORE_NATIVE_CACHE`` (default ``~/.cache/attn_core``)/<build key>.

Builds go through the build records (``<library>.json``: key, size, sha256): a library they
do not vouch for is rebuilt, and ``facts --write`` reads only logs they vouch for and never
writes fewer or implausible records over the file's.

Exit codes: 0 fine; 1 a compiler was found but the build (or loading) failed; 2 bad usage (an
argument or ATTN_CORE_* variable, named: a target the compiler cannot build, a cache that
cannot be created or written); 3 no compiler (or no GPU for ``status``): the torch path runs,
which is not an error unless the caller requires the kernel (``|| [ $? -eq 3 ]`` accepts it in
a Dockerfile); 130 / 143 stopped by SIGINT / SIGTERM (compilers killed, temporary files
removed).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Optional

from attn_core.core.settings import current_overrides, parse_archs, reload
from attn_core.native.build import (
    BuildError,
    Terminated,
    build_all,
    default_cache_dir,
    family_key,
    lock_timeout,
    stop_on_signals,
)
from attn_core.native.family import DECODE, FAMILIES
from attn_core.native.toolchain import Toolchain, find_toolchain, foreign_archs

OK, FAILED, USAGE, UNAVAILABLE = 0, 1, 2, 3
INTERRUPTED, TERMINATED = 130, 143  # the shell's 128 + SIGINT / SIGTERM


# The prefill call status plans: Qwen3.6's full-attention layer, an 8192-token chunk over 100K.
PREFILL_SHAPE = (24, 4, 256, 16)  # heads, KV heads, head size, block size
PREFILL_CHUNK, PREFILL_CONTEXT = 8192, 100_000


def _prefill_lines(device) -> list[str]:
    """The prefill section (a CLI is an entry point: it may reach the resolver)."""
    import torch

    from attn_core.core.shapes import AttentionShape
    from attn_core.runtime.prefill_status import status_lines

    shape = AttentionShape(*PREFILL_SHAPE, dtype=torch.float16)
    return status_lines(shape, device, PREFILL_CHUNK, PREFILL_CONTEXT)


def _status(groups: tuple[int, ...]) -> int:
    import torch
    from tabulate import tabulate

    from attn_core import detect_device_spec
    from attn_core.native.decode import COLUMNS, DIFFERS, DecodeLibrary, kernel_rows, variant_for
    from attn_core.native.loader import load_library
    from attn_core.native.split import record_toolchain

    settings = current_overrides().native
    if not torch.cuda.is_available():
        toolchain, why = find_toolchain(settings.cuda_home)
        found = f"{toolchain.kind} {toolchain.version}" if toolchain else why
        print(f"no CUDA device: the native kernel cannot run here (compiler: {found})")
        print("\n".join(_prefill_lines(torch.device("cpu"))))
        return UNAVAILABLE
    print("\n".join(_prefill_lines(torch.device("cuda"))))
    spec = detect_device_spec(torch.device("cuda"))
    rows: list[tuple] = []
    for group in groups:
        lib, status = load_library(
            DecodeLibrary, variant_for(group), settings, torch.device("cuda")
        )
        state = "available" if lib else "unavailable"
        print(f"native decode, GQA group {group}: {state}: {status.detail}")
        for key in ("path", "toolchain", "platform"):
            if getattr(status, key):
                print(f"  {key}: {getattr(status, key)}")
        if lib is None:
            return FAILED if status.toolchain else UNAVAILABLE
        rows += kernel_rows(lib, group, spec)
    head = (*COLUMNS[:-1], f"recorded ({record_toolchain(spec)}): registers / smem")
    print(tabulate(rows, headers=head, tablefmt="github"))
    differ = sum(1 for row in rows if row[-1].endswith(DIFFERS))
    if differ:
        print(f"{differ} kernels differ from the kernel_facts.json records this device's plans "
              f"are sized from ({record_toolchain(spec)}, {DIFFERS.strip()}): the splits assume "
              "the recorded registers and shared memory")  # fmt: skip
    else:  # said outright: the lab's first BI-V100 run is read for exactly this line
        print(f"all {len(rows)} kernels match the kernel_facts.json records this device's plans "
              f"are sized from ({record_toolchain(spec)})")  # fmt: skip
    from attn_core.core import verify_once
    from attn_core.core.shapes import AttentionShape
    from attn_core.native.loader import verify

    for group in groups:  # Qwen3.6's head size in fp16: the configuration decode would check
        lib, _ = load_library(DecodeLibrary, variant_for(group), settings, torch.device("cuda"))
        if lib is not None:
            shape = AttentionShape(2 * group, 2, 256, 16, torch.float16)
            verify(lib, torch.device("cuda"), shape)
    print("checked against the float64 reference (verify-once registry):")
    print("\n".join(verify_once.status_lines()) or "  none")
    return OK


def _cache_dir(settings) -> Path:
    """The build cache (``~`` expanded), created; ValueError naming ATTN_CORE_NATIVE_CACHE (or
    the default) when it is not, and cannot become, a writable directory: a usage error, found
    before any compiler runs (a read-only cache once failed later, as exit 1)."""
    if settings.cache_dir:
        cache, origin = Path(settings.cache_dir).expanduser(), "ATTN_CORE_NATIVE_CACHE"
    else:
        cache, origin = default_cache_dir(), "the default cache (set ATTN_CORE_NATIVE_CACHE)"
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ValueError(f"{origin} {cache} is a file, expected a directory") from None
    except OSError as exc:
        raise ValueError(f"{origin} {cache} cannot be created ({exc.strerror or exc})") from None
    try:
        with tempfile.TemporaryFile(dir=cache):
            pass
    except OSError as exc:
        raise ValueError(f"{origin} {cache} is not writable ({exc.strerror or exc})") from None
    return cache


def _build(archs: Optional[str]) -> tuple:
    """(exit code, the toolchain, the directory built into); the last two None unless a
    compiler was found."""
    settings = current_overrides().native
    # the one validator of targets (settings.parse_archs): --arch '' is refused like a bad
    # target, since an empty list would mean every target (a 19-minute build)
    if archs is not None:
        wanted, origin = parse_archs("--arch", archs), "--arch"
    else:  # validated when the settings were read
        wanted = parse_archs("ATTN_CORE_NATIVE_ARCH", settings.arch) if settings.arch else ()
        origin = "ATTN_CORE_NATIVE_ARCH"
    lock_timeout()  # a bad ATTN_CORE_NATIVE_LOCK_TIMEOUT is named before anything is built
    cache = _cache_dir(settings)
    found, _ = find_toolchain(settings.cuda_home)
    bad = foreign_archs(found.kind, wanted) if found is not None else []
    if found is not None and bad:
        raise ValueError(
            f"{origin} names {', '.join(bad)}, which the compiler found ({found.kind}, "
            f"{found.compiler}) cannot build"
        )
    toolchain, why = find_toolchain(settings.cuda_home, wanted or None)
    if toolchain is None:
        print(f"native kernel not built: {why}")
        return UNAVAILABLE, None, None
    print(f"building the native kernels ({toolchain.kind} {','.join(toolchain.archs)}) into "
          f"{cache}: each library takes minutes of CPU (ATTN_CORE_NATIVE_BUILD=0 skips it at "
          "install)", flush=True)  # fmt: skip
    try:
        seconds = build_all(
            toolchain, FAMILIES.values(), cache=cache, progress=lambda line: print(line, flush=True)
        )
    except (BuildError, OSError) as exc:
        print(f"native kernel build FAILED: {exc}", file=sys.stderr)
        return FAILED, toolchain, cache / family_key(toolchain, DECODE)
    for family in FAMILIES.values():
        print(f"native {family.name} kernels: {cache / family_key(toolchain, family)}")
    print(f"built in {seconds:.1f} s")
    return OK, toolchain, cache / family_key(toolchain, DECODE)


def _build_variant(
    toolchain: Toolchain, out_dir: Path, suffix: str, defines: tuple[str, ...]
) -> Optional[Path]:
    """Build every library with ``defines`` beside ``out_dir``; the directory, or None (said)."""
    variant_dir = out_dir.with_name(out_dir.name + suffix)
    try:
        build_all(toolchain, [DECODE], out_dir=variant_dir, defines=defines)
    except (BuildError, OSError) as exc:
        print(f"native kernel build ({suffix[1:]}) FAILED: {exc}", file=sys.stderr)
        return None
    return variant_dir


def _facts(write: bool) -> int:
    from tabulate import tabulate

    from attn_core.native import facts
    from attn_core.native.build import cached_damage, log_path, source_digest

    code, toolchain, out_dir = _build(None)
    if code != OK:
        return code
    # the CUDA-core build (nvcc's) and CoreX's stand-in: one build while their flags agree
    portable_dir = _build_variant(toolchain, out_dir, "-portable", facts.PORTABLE_DEFINES)
    corex_dir = portable_dir
    if portable_dir is not None and facts.COREX_DEFINES != facts.PORTABLE_DEFINES:
        corex_dir = _build_variant(toolchain, out_dir, "-corex", facts.COREX_DEFINES)
    if portable_dir is None or corex_dir is None:
        return FAILED
    builds_made = ((out_dir, ()), (portable_dir, facts.PORTABLE_DEFINES),
                   (corex_dir, facts.COREX_DEFINES))  # fmt: skip
    for folder, defines in builds_made:  # only logs a build record vouches for
        for variant in DECODE.variants:
            library = folder / DECODE.library_name(variant)
            broken = cached_damage(toolchain, library, DECODE, variant, defines=defines, log=True)
            if broken:
                print(f"native kernel facts: not recorded: {broken}", file=sys.stderr)
                return FAILED
    logs, portable, corex = (
        [log_path(d / DECODE.library_name(v)) for v in DECODE.variants]
        for d in (out_dir, portable_dir, corex_dir)
    )
    builds = [(logs, True, facts.NVCC), (portable, False, facts.NVCC), (corex, False, facts.COREX)]
    try:  # the logs of the builds just made, under their own keys
        texts = [(log.read_text(), mma, chain) for paths, mma, chain in builds for log in paths]
    except OSError as exc:
        print(f"native kernel facts: the build left no log {exc.filename}", file=sys.stderr)
        return FAILED
    records = [
        r
        for text, mma, chain in texts
        for r in facts.parse_ptxas(text, mma_built=mma, toolchain=chain)
    ]
    print(tabulate([r.__dict__ for r in records], headers="keys", tablefmt="github"))
    if write:
        refused = _refuse_facts(records)
        if refused:
            print(f"native kernel facts: {facts.FACTS_FILE} not written: {refused}",
                  file=sys.stderr)  # fmt: skip
            return FAILED
        compiler = f"{toolchain.kind} {toolchain.version}"
        archs = ",".join(toolchain.archs)
        path = facts.write_facts(logs, portable, corex, compiler, archs, source_digest())
        print(f"wrote {path}")
    return OK


MAX_REGISTERS = 255  # per thread, on every target: more is a log ptxas did not write
MAX_SMEM_BYTES = 256 * 1024  # above any target's shared memory per block


def _record_key(r) -> tuple:
    return (r.kernel, r.query, r.cache, r.head_bucket, r.slots, r.body, r.toolchain)


def _refuse_facts(records: list) -> str:
    """Why ``records`` (every build's) must not replace kernel_facts.json, or "": a value
    ptxas cannot report, or a kernel the file records that they lack (a build that did not
    fully succeed once replaced the file with one record of 99999 registers)."""
    from attn_core.native import facts

    odd = [r for r in records if not 0 <= r.registers <= MAX_REGISTERS
           or not 0 <= r.smem_bytes <= MAX_SMEM_BYTES or r.spill_bytes < 0]  # fmt: skip
    if odd:
        r = odd[0]
        return (f"{len(odd)} records outside what ptxas reports (e.g. {r.kernel} {r.query}/"
                f"{r.cache}: {r.registers} registers, {r.smem_bytes} bytes smem; registers "
                f"must be 0..{MAX_REGISTERS})")  # fmt: skip
    try:
        recorded = {_record_key(r) for r in facts.load_facts(facts.FACTS_FILE)["kernels"]}
    except (OSError, ValueError, KeyError, TypeError):
        recorded = set()  # no readable file: nothing to shrink
    lost = recorded - {_record_key(r) for r in records}
    if lost:
        return (f"these builds lack {len(lost)} of its {len(recorded)} records (e.g. "
                f"{sorted(lost)[0]}); records from a build that did not fully succeed never "
                "replace it (remove the file first to drop kernels on purpose)")  # fmt: skip
    return ""


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attn_core.native", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = parser.add_subparsers(dest="command", required=True)
    status = sub.add_parser("status", help="where the libraries come from, and their kernels")
    status.add_argument("--groups", default="6", help="GQA groups to load (default 6: Qwen3.6)")
    build = sub.add_parser("build", help="build every family's libraries now (no GPU needed)")
    build.add_argument("--arch", help="targets, comma-separated (sm_90, ivcore10, ...)")
    facts = sub.add_parser("facts", help="registers and shared memory per kernel (build logs)")
    facts.add_argument("--write", action="store_true", help="record them in kernel_facts.json")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on bad usage, 0 on --help
        return int(exc.code or 0)
    try:
        with stop_on_signals():
            return _run(args)
    except ValueError as exc:  # a bad ATTN_CORE_* / CUDA_HOME value
        print(f"error: {exc}", file=sys.stderr)
        return USAGE
    except KeyboardInterrupt:  # build_all killed the compilers and removed its temporary files
        print(f"{args.command} interrupted (SIGINT): stopped, nothing half-built kept",
              file=sys.stderr)  # fmt: skip
        return INTERRUPTED
    except Terminated:
        print(f"{args.command} terminated (SIGTERM): stopped, nothing half-built kept",
              file=sys.stderr)  # fmt: skip
        return TERMINATED


def _run(args: argparse.Namespace) -> int:
    reload()  # a process start reads the environment: a bad ATTN_CORE_* is exit 2 here
    if args.command == "build":
        return _build(args.arch)[0]
    if args.command == "facts":
        return _facts(args.write)
    parts = [g.strip() for g in args.groups.split(",") if g.strip()]
    if not parts or not all(g.isdigit() and int(g) >= 1 for g in parts):
        raise ValueError(f"--groups must list positive integers, got {args.groups!r}")
    return _status(tuple(int(g) for g in parts))


if __name__ == "__main__":
    sys.exit(main())
