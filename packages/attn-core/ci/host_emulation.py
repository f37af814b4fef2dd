"""Build a native library whose kernels run on the host CPU (standard library only).

    python packages/attn-core/ci/host_emulation.py --library decode --slots 6 --out DIR
        [--compiler g++] [--asan]

CI has no GPU, so a kernel change that breaks the CUDA tests passes it. The CoreX source
configuration (``-D__ILUVATAR__``: the CUDA-core decode body and the prefill kernel's CUDA-core
tile layer, which the BI-V100 runs) is plain C++ plus ``__syncthreads``: attn_platform.cuh
forbids inline PTX and warp shuffles there. So the same source, compiled by the host C++
compiler against ``ci/host_cuda/`` (a CUDA runtime and cuda_fp16.h for the host; its
attn_host_emulator.h runs a grid one block at a time, each block's threads as fibers), is a
library with the same C ABI, which attn-core's loaders open and its launchers fill, on CPU
tensors (stream 0). ``tests/test_native_host_emulation.py`` and
``tests/test_native_prefill_host_emulation.py`` check them against the float64 reference.

``gated_delta_nvidia`` is the Gated DeltaNet source as nvcc builds it (no ``__ILUVATAR__``):
its 16-bit pair's inline PTX (ldmatrix, the m16n8k16 instruction) and shuffles call the host's
warp collectives instead (``ci/host_cuda/attn_emu_warp.h``, under ``ATTN_HOST_EMULATION``,
which the host cuda_runtime.h defines), its asynchronous copies the host's cuda_pipeline.h
(``tests/test_native_gated_delta_mma_host.py``).

What it checks: the kernel's logic (indexing, masking, the online softmax, partitions and the
merge, fp8 decoding, shared-memory traffic between barriers: each phase runs in thread order
and in reverse, and shared memory starts as NaN every block). What it cannot: what a device
compiler makes of the source (ci/clang_check.py, and the device's own CUDA tests), races
inside a warp's lockstep, or time.

The only changes to the source are textual and made on a copy: each ``k<<<grid, block, smem,
stream>>>(args)`` becomes ``::attn_emu::launch(k, grid, block, smem, stream, args)`` and each
``extern __shared__ T name[]`` a pointer to the launch's dynamic shared memory. A source with a
launch or declaration either rewrite misses fails the build here, not at run time.

Libraries are cached under ``--out`` by a hash of the sources, ``ci/host_cuda``, this file and
the compiler, so the CPU test sessions (current torch, torch 2.1) build each once.

Exit codes: 0 built (or cached); 1 no compiler, the build failed, or ``--out`` cannot be
written; 2 bad usage (argparse: the argument named).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "src" / "attn_core" / "native" / "csrc"
HOST_CUDA = Path(__file__).resolve().parent / "host_cuda"
# name -> (source, defines, file name): the decode library of one head-slot count, the prefill
# library's CUDA-core tile layer (CoreX's wmma layer needs CoreX's headers), the Gated DeltaNet
# library (decode, prefill and convolutions), and the Gated DeltaNet library as nvcc builds it
# (its 16-bit pair on the matrix unit: warp collectives in host_cuda/attn_emu_warp.h).
PREFILL_FMA = ("-D__ILUVATAR__", "-DATTN_PREFILL_MMA=0")
LIBRARIES = {
    "decode": ("paged_decode.cu", ("-D__ILUVATAR__",), "libattn_native_g{slots}.so"),
    "prefill": ("paged_prefill.cu", PREFILL_FMA, "libattn_prefill_fma.so"),
    "gated_delta": ("gated_delta.cu", ("-D__ILUVATAR__",), "libattn_gdn_fma.so"),
    "gated_delta_nvidia": ("gated_delta.cu", (), "libattn_gdn_fma.so"),
}
# -O1: one head-slot library builds in 33 s (clang 16, a 2-core CI machine) and the
# tests' calls then take 0.05-1.3 s each. -fno-strict-aliasing: the sources read vectors and
# halves through reinterpret_cast, as device code does, which a host optimiser may assume never
# happens. -w: what a host compiler thinks of device idioms is not this check's business
# (ci/clang_check.py gates clang's device diagnostics).
FLAGS = ("-x", "c++", "-std=c++17", "-O1", "-shared", "-fPIC", "-fno-strict-aliasing", "-w")
MAX_SLOTS = 8  # csrc/paged_decode.cu kGroupMax: head slots a decode block serves at most
# g++ first: one decode library in 6.5 s against clang 16's 33 s at -O1, same results;
# which compiler emulates does not matter to what the tests check (ci/clang_check.py is where
# clang, CoreX's compiler family, sees the device code).
COMPILERS = ("g++", "c++", "clang++-16", "clang++")

_LAUNCH = re.compile(r"([A-Za-z_][\w.]*)<<<([^;]*?)>>>\(")
_DYNAMIC_SHARED = re.compile(
    r"extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?([A-Za-z_][\w ]*?)\s+(\w+)\[\];"
)


class EmulationBuildError(RuntimeError):
    """The host build failed; the message holds the compiler's output."""


def rewrite_for_host(text: str) -> str:
    """``text`` (a .cu source) with its launches and dynamic shared memory made host calls.

    Raises:
        EmulationBuildError: a ``<<<`` or ``extern __shared__`` the rewrites did not take.
    """
    text = _LAUNCH.sub(lambda m: f"::attn_emu::launch({m.group(1)}, {m.group(2)}, ", text)
    text = _DYNAMIC_SHARED.sub(
        lambda m: (
            f"{m.group(1)}* {m.group(2)} = "
            f"reinterpret_cast<{m.group(1)}*>(::attn_emu::dynamic_shared());"
        ),
        text,
    )
    for left in ("<<<", "extern __shared__"):
        if left in text:
            line = text[: text.index(left)].count("\n") + 1
            raise EmulationBuildError(f"line {line}: a {left!r} the host rewrite does not take")
    return text


def find_compiler(preferred: str | None = None) -> str | None:
    """The host C++ compiler: ``preferred``, ``$CXX``, else the first of :data:`COMPILERS` on
    PATH."""
    for name in (preferred, os.environ.get("CXX"), *COMPILERS):
        if name and shutil.which(name):
            return name
    return None


@functools.cache  # read by the build key and the GCC check of every build
def _compiler_identity(compiler: str) -> str:
    out = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=False)
    return (out.stdout.splitlines() or [compiler])[0]


# --asan: AddressSanitizer around every load and store of the kernels (a read past a tensor the
# caller allocated reports the kernel's source line); the process that loads such a library needs
# the compiler's ASan runtime preloaded, and its C++ runtime after it (asan_preload).
ASAN_FLAGS = ("-fsanitize=address", "-fno-omit-frame-pointer", "-g1")


def asan_preload(compiler: str) -> list[Path] | None:
    """What to ``LD_PRELOAD``, in order, into a Python that loads ``compiler``'s ASan-built
    libraries: its ASan runtime (each compiler has its own; clang's would find GCC's libasan too,
    which its code cannot use), then the C++ runtime. Python does not link libstdc++, and ASan,
    initialised before it was loaded, cannot intercept its ``__cxa_throw``: torch 2.1's import
    then stopped at "CHECK failed: ... real___cxa_throw". None: no ASan runtime."""
    clang = "clang" in _compiler_identity(compiler)
    names = (f"libclang_rt.asan-{platform.machine()}.so" if clang else "libasan.so", "libstdc++.so")
    found = []
    for name in names:
        out = subprocess.run(
            [compiler, f"-print-file-name={name}"], capture_output=True, text=True, check=False
        )
        path = Path(out.stdout.strip())
        if out.returncode != 0 or not path.is_absolute() or not path.is_file():
            return None
        found.append(path.resolve())
    return found


def build_key(library: str, slots: int, compiler: str, asan: bool = False) -> str:
    """What a cached library depends on: the sources, the host headers, this file (its
    rewrites and flags), the compiler."""
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for path in sorted([*CSRC.iterdir(), *HOST_CUDA.iterdir()]):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    digest.update(
        repr((library, slots, FLAGS, gcc_flags(compiler), LIBRARIES[library], asan)).encode()
    )
    digest.update(_compiler_identity(compiler).encode())
    return digest.hexdigest()[:20]


def build(
    library: str,
    out_dir: Path,
    *,
    slots: int = 1,
    compiler: str | None = None,
    asan: bool = False,
) -> Path:
    """The host library ``library`` ("decode" for ``slots`` head slots, "prefill",
    "gated_delta" or "gated_delta_nvidia"), built
    into ``out_dir/<key>/`` unless it is there already (safe for concurrent callers: the
    file appears whole or not at all); ``asan``: instrumented by AddressSanitizer.

    Raises:
        EmulationBuildError: no host compiler, a rewrite left something, or the build failed.
    """
    if library not in LIBRARIES:
        raise ValueError(f"library must be one of {sorted(LIBRARIES)}, got {library!r}")
    if not 1 <= slots <= MAX_SLOTS:
        raise ValueError(f"slots must be 1-{MAX_SLOTS}, got {slots}")
    found = _compiler(compiler)
    source_name, defines, file_name = LIBRARIES[library]
    target = out_dir / build_key(library, slots, found, asan) / file_name.format(slots=slots)
    if not target.is_file():
        flags = (*defines, f"-DATTN_GROUP_SLOTS={slots}", *(ASAN_FLAGS if asan else ()))
        compile_library(CSRC, source_name, flags, target, found)
    return target


def compile_library(
    source_dir: Path, source_name: str, defines: tuple[str, ...], target: Path, compiler: str
) -> None:
    """``target`` from ``source_dir/source_name``: a rewritten copy of ``source_dir`` compiled
    against ``ci/host_cuda``, moved into place whole.

    Raises:
        EmulationBuildError: a rewrite left something, or the compiler failed.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(source_dir, src)
        for path in [*src.glob("*.cu"), *src.glob("*.cuh")]:
            path.write_text(rewrite_for_host(path.read_text()))
        partial = Path(tmp) / target.name
        command = [
            compiler, *FLAGS, *gcc_flags(compiler), *defines, f"-I{HOST_CUDA}", f"-I{src}",
            str(src / source_name), "-o", str(partial),
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise EmulationBuildError(
                f"{' '.join(command)}\nexited {done.returncode}:\n{done.stderr[-4000:]}"
            )
        os.replace(partial, target)


def gcc_flags(compiler: str) -> tuple[str, ...]:
    """-fno-gnu-unique under GCC: the host rewrite makes a kernel's shared arrays static locals
    of function templates, which GCC binds process-wide (STB_GNU_UNIQUE) whatever dlopen's
    RTLD_LOCAL says. Two libraries from one source then shared one array per kernel: a build
    whose chunk_pass had 32 value columns wrote its 16 KiB state slice into the default
    build's 8 KiB one, and both gave wrong results once both were loaded."""
    return () if "clang" in _compiler_identity(compiler).lower() else ("-fno-gnu-unique",)


def _compiler(preferred: str | None) -> str:
    found = find_compiler(preferred)
    if found is None:
        raise EmulationBuildError(f"no host C++ compiler (tried {preferred}, $CXX, {COMPILERS})")
    return found


def slot_count(text: str) -> int:
    """``--slots``: a whole number of head slots the kernel supports."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 1 <= value <= MAX_SLOTS:
        raise argparse.ArgumentTypeError(f"must be 1-{MAX_SLOTS}, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--library", choices=sorted(LIBRARIES), default="decode")
    parser.add_argument("--slots", type=slot_count, default=6, help="decode: head slots (1-8)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--compiler", help="host C++ compiler (default: g++, ...)")
    parser.add_argument("--asan", action="store_true", help="instrument with AddressSanitizer")
    args = parser.parse_args(argv)
    start = time.monotonic()
    try:
        compiler = _compiler(args.compiler)
        path = build(args.library, args.out, slots=args.slots, compiler=compiler, asan=args.asan)
    except EmulationBuildError as exc:
        print(exc, file=sys.stderr)
        return 1
    except OSError as exc:  # --out is a file, or not writable
        print(f"--out {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"{path} ({time.monotonic() - start:.1f} s)")
    if args.asan:
        preload = asan_preload(compiler)
        if preload is None:
            print(f"{compiler} has no shared ASan runtime to preload: the library cannot load")
            return 1
        print(f"load it with LD_PRELOAD='{' '.join(map(str, preload))}'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
