"""Upstream clang's CUDA mode builds every native kernel cleanly (standard library only).

    python packages/attn-core/ci/clang_check.py [--clang clang++-16] [--cache DIR] [--slots 1,6]
        [--families decode,prefill,gated_delta]

CoreX's compiler is a clang, so a kernel that upstream clang compiles with a warning, or whose
register arrays clang puts in local memory, is suspect on BI-V100 however clean nvcc is. For
every decode library (one per head-slot count, csrc/paged_decode.cu ATTN_GROUP_SLOTS), the
prefill kernel's CUDA-core and NVIDIA wmma tile layers (csrc/paged_prefill.cu
ATTN_PREFILL_MMA; the CoreX wmma layer needs CoreX's headers and is first compiled on the lab),
the Gated DeltaNet library (csrc/gated_delta.cu; ``--families`` narrows the check to some),
and both modes (NVIDIA, ``-D__ILUVATAR__``) this compiles the device code to PTX for sm_80 and
fails on:

- any diagnostic clang prints (warnings included; "loop not unrolled" is one);
- any kernel whose PTX declares or touches local memory (``.local``, ``__local_depot``,
  ``ld.local`` / ``st.local``): a register array that was not kept in registers;
- a library whose PTX holds fewer kernels than its dispatch table instantiates (a check that
  compiled nothing would pass vacuously).

No CUDA toolkit is needed: the CUDA headers, libdevice and ptxas come from the registry's
``nvidia-cuda-runtime-cu12``, ``nvidia-cuda-nvcc-cu12`` and ``nvidia-cuda-cccl-cu12`` wheels,
installed into ``--cache`` and laid out the way clang's ``--cuda-path`` expects (``include/``,
``nvvm/libdevice/``, ``bin/ptxas``) with symlinks.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "src" / "attn_core" / "native" / "csrc"
SLOTS = tuple(range(1, 9))
MODES = {"nvidia": (), "iluvatar": ("-D__ILUVATAR__",)}
# 3 query kinds x 3 cache kinds (its own, fp8 e4m3, fp8 e5m2) x 3 head buckets, + 3 merges
KERNELS_PER_LIBRARY = 3 * 3 * 3 + 3
# csrc/paged_prefill.cu: 2 query kinds x 3 cache kinds x 3 head buckets x 2 tile configs, + 2
# merges (counted in clang's PTX); the NVIDIA wmma layer's large tile also comes
# with two K / V buffers (another 2 x 3 x 3). That layer compiles to nothing but the merges
# under __ILUVATAR__ (CoreX has its own layer), so that pair is not a build.
PREFILL_KERNELS = {"fma": 2 * 3 * 3 * 2 + 2, "wmma": 2 * 3 * 3 * 3 + 2}
# prefill libraries build with subnormals flushed (attn_core.native.toolchain.CLANG_FTZ)
PREFILL_FTZ = "-fgpu-flush-denormals-to-zero"
PREFILL_LAYERS = {"fma": ("ATTN_PREFILL_MMA=0", MODES), "wmma": ("ATTN_PREFILL_MMA=1", ("nvidia",))}
# csrc/gated_delta.cu: the decode step, the token-by-token and the chunked prefill at head_k 64
# and 128, the conv update, the conv prefill's outputs and states kernels
GATED_DELTA_KERNELS = 9
FAMILIES = ("decode", "prefill", "gated_delta")


def jobs_for(
    slots: tuple[int, ...], families: tuple[str, ...] = FAMILIES
) -> list[tuple[str, str, tuple[str, ...], int]]:
    """``(label, source, defines, expected kernels)`` of every compilation the check makes
    (decode: one library per head-slot count of ``slots``)."""
    jobs = []
    if "decode" in families:
        jobs += [
            (f"paged_decode.cu slots={n} {mode}", "paged_decode.cu",
             (f"-DATTN_GROUP_SLOTS={n}", *MODES[mode]), KERNELS_PER_LIBRARY)
            for n in slots for mode in MODES
        ]  # fmt: skip
    if "prefill" in families:
        for layer, (define, modes) in PREFILL_LAYERS.items():
            jobs += [
                (f"paged_prefill.cu {layer} {mode}", "paged_prefill.cu",
                 (f"-D{define}", PREFILL_FTZ, *MODES[mode]), PREFILL_KERNELS[layer])
                for mode in modes
            ]  # fmt: skip
    if "gated_delta" in families:
        jobs += [
            (f"gated_delta.cu {mode}", "gated_delta.cu", MODES[mode], GATED_DELTA_KERNELS)
            for mode in MODES
        ]
    return jobs


WHEELS = ("nvidia-cuda-runtime-cu12==12.9.*", "nvidia-cuda-nvcc-cu12==12.9.*",
          "nvidia-cuda-cccl-cu12==12.9.*")  # fmt: skip
# clang 16's CUDA wrapper includes this curand header unconditionally; the kernels use no
# curand, and its wheel is 60 MB, so the layout gets an empty one.
CURAND_STUB = "curand_mtgp32_kernel.h"

_ENTRY = re.compile(r"^\.(?:visible|weak) \.entry (\S+)\(", re.M)
_LOCAL = re.compile(r"__local_depot|\.local\b|ld\.local|st\.local")


def cuda_path(cache: Path) -> Path:
    """A ``--cuda-path`` directory built from the registry's wheels (installed once)."""
    site, farm = cache / "site", cache / "cuda"
    if not (site / "nvidia" / "cuda_nvcc" / "nvvm" / "libdevice").is_dir():
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
               "--no-deps", "--target", str(site), *WHEELS]  # fmt: skip
        subprocess.run(cmd, check=True)
    if farm.exists():
        shutil.rmtree(farm)
    (farm / "include").mkdir(parents=True)
    (farm / "bin").mkdir()
    (farm / "nvvm").mkdir()
    for part in ("cuda_runtime", "cuda_cccl", "cuda_nvcc"):
        include = site / "nvidia" / part / "include"
        for item in include.iterdir():
            target = farm / "include" / item.name
            if not target.exists():
                target.symlink_to(item)
    (farm / "include" / CURAND_STUB).write_text("// empty: the kernels use no curand\n")
    (farm / "bin" / "ptxas").symlink_to(site / "nvidia" / "cuda_nvcc" / "bin" / "ptxas")
    (farm / "nvvm" / "libdevice").symlink_to(site / "nvidia" / "cuda_nvcc" / "nvvm" / "libdevice")
    return farm


def compile_ptx(clang: str, cuda: Path, source: Path, defines: tuple[str, ...], out: Path):
    """``(diagnostics, ptx)`` of one source with ``defines``."""
    cmd = [clang, "-x", "cuda", f"--cuda-path={cuda}", "--cuda-gpu-arch=sm_80",
           "--cuda-device-only", "-S", "-std=c++17", "-O3", "-Wall", "-Wextra",
           "-Wno-unknown-cuda-version", *defines,
           "-I", str(CSRC), "-o", str(out), str(source)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    diagnostics = (done.stdout + done.stderr).strip()
    if done.returncode != 0:
        return diagnostics or f"exit {done.returncode}", ""
    return diagnostics, out.read_text()


def kernels_with_local_memory(ptx: str) -> list[str]:
    """Names of the entry functions whose bodies use local memory."""
    parts = _ENTRY.split(ptx)  # preamble, name, body, name, body, ...
    pairs = zip(parts[1::2], parts[2::2], strict=True)
    return [name for name, body in pairs if _LOCAL.search(body)]


def check(
    clang: str,
    cuda: Path,
    slots: tuple[int, ...],
    work: Path,
    jobs: int,
    families: tuple[str, ...] = FAMILIES,
) -> list[str]:
    """Every problem found, one line each (empty: clean)."""

    def one(job):
        label, src, defines, expected = job
        out = work / (re.sub(r"[^A-Za-z0-9_]+", "_", label) + ".ptx")
        diagnostics, ptx = compile_ptx(clang, cuda, CSRC / src, defines, out)
        problems = [f"{label}: {line}" for line in diagnostics.splitlines() if line.strip()]
        if ptx:
            count = len(_ENTRY.findall(ptx))
            if count < expected:
                problems.append(f"{label}: {count} kernels in the PTX, expected {expected}")
            problems += [f"{label}: local memory in {k}" for k in kernels_with_local_memory(ptx)]
        print(f"{label}: {'clean' if not problems else f'{len(problems)} problems'}", flush=True)
        return problems

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return [p for found in pool.map(one, jobs_for(slots, families)) for p in found]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clang", default=os.environ.get("CLANG", "clang++-16"))
    ap.add_argument("--cache", default=".ci-cache/clang-cuda", help="wheels + --cuda-path")
    ap.add_argument("--slots", default=",".join(map(str, SLOTS)), help="libraries to check")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--families", default=",".join(FAMILIES), help="kernel families to check")
    args = ap.parse_args(argv)
    if shutil.which(args.clang) is None:
        print(f"--clang must name a clang++ on PATH, got {args.clang!r} (apt-get install clang-16)")
        return 2
    slots = tuple(int(s) for s in args.slots.split(",") if s.strip())
    bad = [s for s in slots if s not in SLOTS]
    if bad or not slots:
        print(f"--slots must list values in {SLOTS}, got {args.slots!r}")
        return 2
    families = tuple(f.strip() for f in args.families.split(",") if f.strip())
    if not families or any(f not in FAMILIES for f in families):
        print(f"--families must list values in {FAMILIES}, got {args.families!r}")
        return 2
    cache = Path(args.cache).resolve()
    cuda = cuda_path(cache)
    work = cache / "ptx"
    work.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    problems = check(args.clang, cuda, slots, work, max(1, args.jobs), families)
    seconds = time.monotonic() - began
    for line in problems:
        print(line)
    n = len(jobs_for(slots, families))
    verdict = "FAILED" if problems else "clean"
    print(f"clang CUDA check: {n} compilations in {seconds:.0f} s, {verdict} "
          f"({len(problems)} problems)")  # fmt: skip
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
