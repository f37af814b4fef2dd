"""Build one native decode library with upstream clang for an NVIDIA GPU (standard library only).

    python packages/attn-core/ci/clang_library.py --slots 6 --out DIR [--arch sm_90]
        [--clang clang++-16] [--cache DIR] [--fatbinary /usr/local/cuda/bin/fatbinary]

CoreX's compiler is a clang, and the lab's BI-V100 is the only device that runs a clang build;
this puts the same source, compiled by upstream clang's CUDA mode, on an NVIDIA GPU beside
nvcc's build, so a difference in what the two compilers make of it shows up as a failed
reference test or a slower row there. The library is ``DIR/libattn_native_g<slots>.so`` (the
name attn_core.native loads), its compiler output (ptxas ``-v``: registers, spills) beside it in
``.log``; the kernels that spill are printed.

To run it: copy it over nvcc's library of the same slots in a build directory
(``$ATTN_CORE_NATIVE_CACHE/<key>/``) and set ``ATTN_CORE_NATIVE_BUILD=0``. attn-core then
verifies and uses it like any other build; ``test_the_driver_reports_what_the_facts_record``
fails by design (it checks the registers against nvcc's record, kernel_facts.json).

Needs: clang (16 tested), the registry wheels ``ci/clang_check.py`` installs (headers, ptxas,
libdevice, and the static CUDA runtime linked into the library, so the GPU host needs no CUDA
12 runtime), and one ``fatbinary`` from a CUDA toolkit (the only tool the wheels lack). clang
16 speaks the old fatbinary's ``--image=profile=...``; CUDA 13's fatbinary takes only
``--image3=kind=...,sm=...``, so a shim placed on clang's ``--cuda-path`` translates.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from clang_check import CSRC, SLOTS, cuda_path  # noqa: E402

_IMAGE = re.compile(r"--image=profile=(sm|compute)_(\d+a?),file=(.+)")
_SPILL = re.compile(r"Function properties for (\S+)\n\s+\d+ bytes stack frame, (\d+) bytes spill")


def image3_args(argv: list[str]) -> list[str]:
    """clang's fatbinary arguments in CUDA 13's spelling: ``--image=profile=sm_90,file=F`` ->
    ``--image3=kind=elf,sm=90,file=F`` (``compute_90``: ``kind=ptx``); the rest unchanged."""
    out = []
    for arg in argv:
        m = _IMAGE.fullmatch(arg)
        if m:
            kind = "elf" if m.group(1) == "sm" else "ptx"
            out.append(f"--image3=kind={kind},sm={m.group(2)},file={m.group(3)}")
        else:
            out.append(arg)
    return out


def fatbinary_main(real: str) -> None:
    """The shim's body: run the toolkit's fatbinary with the translated arguments."""
    os.execv(real, [real, *image3_args(sys.argv[1:])])


def install_shim(farm: Path, real: str) -> None:
    """``farm/bin/fatbinary``, a script that calls :func:`fatbinary_main` with ``real``."""
    shim = farm / "bin" / "fatbinary"
    here = str(Path(__file__).resolve().parent)
    shim.write_text(
        f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {here!r})\n"
        f"from clang_library import fatbinary_main\nfatbinary_main({real!r})\n"
    )
    shim.chmod(0o755)


def spilling_kernels(log: str) -> list[tuple[str, int]]:
    """``(kernel, spill store bytes)`` of every kernel ptxas ``-v`` reports spilling."""
    return [(name, int(n)) for name, n in _SPILL.findall(log) if int(n) > 0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--slots", type=int, required=True, help=f"head slots, one of {SLOTS}")
    ap.add_argument("--out", required=True, help="directory for the library and its log")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--clang", default=os.environ.get("CLANG", "clang++-16"))
    ap.add_argument("--cache", default=".ci-cache/clang-cuda", help="wheels + --cuda-path")
    ap.add_argument(
        "--fatbinary", default=shutil.which("fatbinary") or "/usr/local/cuda/bin/fatbinary"
    )
    args = ap.parse_args(argv)
    if args.slots not in SLOTS:
        ap.error(f"--slots must be one of {SLOTS}, got {args.slots}")
    if shutil.which(args.clang) is None:
        ap.error(f"--clang must name a clang++ on PATH, got {args.clang!r} (apt install clang-16)")
    if not Path(args.fatbinary).is_file():
        ap.error(f"--fatbinary must name a CUDA toolkit's fatbinary, got {args.fatbinary!r}")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        ap.error(f"--out must be a directory, got the file {args.out!r}")
    cache = Path(args.cache).resolve()
    farm = cuda_path(cache)
    install_shim(farm, str(Path(args.fatbinary).resolve()))
    (farm / "lib64").mkdir(exist_ok=True)
    (farm / "lib64" / "libcudart_static.a").symlink_to(
        cache / "site" / "nvidia" / "cuda_runtime" / "lib" / "libcudart_static.a"
    )
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"libattn_native_g{args.slots}.so"
    cmd = [args.clang, "-x", "cuda", f"--cuda-path={farm}", f"--cuda-gpu-arch={args.arch}",
           "-Wno-unknown-cuda-version", "-shared", "-fPIC", "-std=c++17", "-O3",
           f"-DATTN_GROUP_SLOTS={args.slots}", "-I", str(CSRC), "-o", str(target),
           str(CSRC / "paged_decode.cu"), f"-L{farm / 'lib64'}", "-lcudart_static", "-ldl",
           "-lpthread", "-lrt", "-Xcuda-ptxas", "-v"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    log = done.stdout + done.stderr
    target.with_suffix(".log").write_text(" ".join(cmd) + "\n" + log)
    if done.returncode != 0:
        print("\n".join(log.strip().splitlines()[-20:]))
        print(f"clang library: FAILED (exit {done.returncode}), log {target.with_suffix('.log')}")
        return 1
    for name, nbytes in spilling_kernels(log):
        print(f"spills {nbytes} B: {name}")
    print(f"clang library: {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
