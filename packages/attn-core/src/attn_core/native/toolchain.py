"""Finding the compiler for the native kernel: nvcc on NVIDIA, CoreX's clang on Iluvatar.

Standard library only: ``setup.py`` imports this module to build at ``pip install`` time, in
an isolated environment without torch.

- NVIDIA: ``$CUDA_HOME/bin/nvcc`` (then ``CUDA_PATH``, ``nvcc`` on ``PATH``,
  ``/usr/local/cuda``); arch ``sm_XY`` from the device, or a list for device-less builds.
- Upstream clang's CUDA mode (``kind="clang"``, made by hand, never found): NVIDIA targets
  against a ``--cuda-path`` (``home``) with the static CUDA runtime in ``home/lib64``; CI builds
  with it from the registry's CUDA wheels, since CoreX's compiler is a clang.
- Iluvatar CoreX: ``/usr/local/corex`` (or a ``CUDA_HOME`` holding ``bin/clang++`` and no real
  ``nvcc``; CoreX ships an ``nvcc`` stub that does not compile CUDA). clang compiles CUDA for
  ``--cuda-gpu-arch=ivcore10`` (BI-V100; ``ivcore11`` for MR-V100 / BI-V150) as language
  ``ivcore`` on newer toolkits, ``cuda`` on older ones; both are tried. These flags come from
  public ports to CoreX and are unverified on the lab machine until its first build.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

COREX_HOME = "/usr/local/corex"
DEFAULT_COREX_ARCH = "ivcore10"
# Device-less NVIDIA builds (pip install without a visible GPU): Ampere and Hopper SASS plus
# Hopper PTX, which the driver JIT-compiles on anything newer.
DEFAULT_NVIDIA_ARCHS = ("sm_80", "sm_90")
# clang's spelling of nvcc's -ftz=true (clang 12 on; -fcuda-flush-denormals-to-zero before)
CLANG_FTZ = "-fgpu-flush-denormals-to-zero"


@dataclass(frozen=True)
class Toolchain:
    """A compiler that can build ``csrc/paged_decode.cu`` into a shared library.

    Attributes:
        kind: ``"nvcc"``, ``"corex-clang"`` or ``"clang"`` (upstream, NVIDIA targets).
        compiler: path of the executable.
        home: toolkit root (``CUDA_HOME``-like).
        archs: targets, e.g. ``("sm_90",)`` or ``("ivcore10",)``.
        version: the compiler's first version line (part of the build cache key).
    """

    kind: str
    compiler: str
    home: str
    archs: tuple[str, ...]
    version: str

    def commands(
        self,
        source: Path,
        include: Path,
        output: Path,
        defines: tuple[str, ...] = (),
        *,
        flush_denormals: bool = False,
    ) -> list[list[str]]:
        """Command lines to try in order (the first that succeeds wins); ``defines`` are
        ``NAME=VALUE`` macros (the tuning variants of bench/native_tune.py).

        ``flush_denormals``: fp32 subnormals flush to zero, so ``exp2f`` is the bare hardware
        instruction (without it nvcc wraps each one in a compare and two multiplies for
        subnormal results). The prefill kernel asks for it: 88.4 -> 84.2 ms at 100K / 8192 on
        the H200; its scores' exponentials below 2^-126 are zeros either way.
        CoreX's clang may not know the flag: its command lines are then tried without it."""
        macros = [f"-D{d}" for d in defines]
        common = ["-std=c++17", "-O3", *macros, "-I", str(include), "-o", str(output), str(source)]
        if self.kind == "nvcc":
            gencode: list[str] = []
            for arch in self.archs:
                number = arch.removeprefix("sm_").removeprefix("compute_")
                gencode += ["-gencode", f"arch=compute_{number},code=sm_{number}"]
            newest = max(self.archs, key=lambda a: int(a.split("_")[-1].rstrip("a")))
            number = newest.removeprefix("sm_")
            gencode += ["-gencode", f"arch=compute_{number},code=compute_{number}"]
            # -Xptxas -v: the build log records each kernel's registers, shared memory and spills
            # (attn_core.native.facts reads them for the simulator)
            flags = ["-shared", "-Xcompiler", "-fPIC", "-lineinfo", "-Xptxas", "-v"]
            if flush_denormals:
                flags.append("-ftz=true")
            return [[self.compiler, *flags, *gencode, *common]]
        lib = str(Path(self.home) / "lib64")
        arch_flags = [f"--cuda-gpu-arch={a}" for a in self.archs]
        if self.kind == "clang":
            # the flags of ci/clang_library.py: the static runtime, so the library needs no
            # CUDA runtime beside it; ptxas -v for the log facts reads
            ftz = [CLANG_FTZ] if flush_denormals else []
            return [[
                self.compiler, "-x", "cuda", f"--cuda-path={self.home}", *arch_flags,
                "-Wno-unknown-cuda-version", *ftz, "-shared", "-fPIC", *common, f"-L{lib}",
                "-lcudart_static", "-ldl", "-lpthread", "-lrt", "-Xcuda-ptxas", "-v",
            ]]  # fmt: skip
        tail = [
            "-shared",
            "-fPIC",
            *arch_flags,
            *common,
            f"-L{lib}",
            "-lcudart",
            f"-Wl,-rpath,{lib}",
        ]
        # with the flag first, then without it (a CoreX clang that refuses it still builds)
        variants = ([CLANG_FTZ], []) if flush_denormals else ([],)
        return [
            [self.compiler, "-x", lang, *ftz, *tail]
            for ftz in variants
            for lang in ("ivcore", "cuda")
        ]


def find_toolchain(
    cuda_home: Optional[str] = None, archs: Optional[tuple[str, ...]] = None
) -> tuple[Optional[Toolchain], str]:
    """``(toolchain, "")`` or ``(None, why there is none)``.

    Args:
        cuda_home: the toolkit root (``CUDA_HOME``; ``~`` is expanded), or None to search.
        archs: targets; None picks the platform's default. A target the compiler found cannot
            build (``ivcore10`` for nvcc, ``sm_90`` for CoreX) is a reason, not a toolchain
            (:func:`foreign_archs`).
    """
    cuda_home = os.path.expanduser(cuda_home) if cuda_home else cuda_home
    corex = _corex_home(cuda_home)
    if corex is not None:
        clang = str(Path(corex) / "bin" / "clang++")
        arch = archs or (DEFAULT_COREX_ARCH,)
        found = Toolchain("corex-clang", clang, corex, tuple(arch), _version(clang))
    else:
        nvcc = _nvcc(cuda_home)
        if nvcc is None:
            where = f"CUDA_HOME={cuda_home}" if cuda_home else "CUDA_HOME, PATH or /usr/local/cuda"
            return None, f"no CUDA compiler: neither nvcc nor CoreX clang++ found in {where}"
        version = _version(nvcc)
        if not version:
            return None, f"{nvcc} does not run as a compiler (no text answer to --version)"
        home = str(Path(nvcc).resolve().parent.parent)
        found = Toolchain("nvcc", nvcc, home, tuple(archs or DEFAULT_NVIDIA_ARCHS), version)
    bad = foreign_archs(found.kind, found.archs)
    if bad:
        return None, f"{found.compiler} ({found.kind}) cannot build {', '.join(bad)}"
    return found, ""


def foreign_archs(kind: str, archs: tuple[str, ...]) -> list[str]:
    """The targets of ``archs`` a ``kind`` compiler cannot build: nvcc builds ``sm_*`` /
    ``compute_*``, upstream clang ``sm_*``, CoreX's clang ``ivcore*`` (nvcc once died on
    ``ivcore10`` with "invalid literal for int()")."""
    own = {"nvcc": ("sm_", "compute_"), "clang": ("sm_",)}.get(kind, ("ivcore",))
    return [a for a in archs if not a.startswith(own)]


def _corex_home(cuda_home: Optional[str]) -> Optional[str]:
    for home in (cuda_home, COREX_HOME):
        if home and (Path(home) / "bin" / "clang++").is_file() and _is_corex(home):
            return home
    return None


def _is_corex(home: str) -> bool:
    # CoreX's tree carries its name, and its nvcc (if any) is a stub, not NVIDIA's compiler.
    return "corex" in str(Path(home).resolve()).lower() or not (Path(home) / "nvvm").exists()


def _nvcc(cuda_home: Optional[str]) -> Optional[str]:
    candidates = []
    if cuda_home:
        candidates.append(Path(cuda_home) / "bin" / "nvcc")
    found = shutil.which("nvcc")
    if found:
        candidates.append(Path(found))
    candidates.append(Path("/usr/local/cuda/bin/nvcc"))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return None


def _version(compiler: str) -> str:
    """The last line ``compiler --version`` prints, or "" when it prints none, or bytes that are
    not text (a binary answer once raised UnicodeDecodeError out of the CLI)."""
    try:
        done = subprocess.run([compiler, "--version"], capture_output=True, timeout=60, check=False)
        text = done.stdout.decode("utf-8")
    except (OSError, subprocess.TimeoutExpired, UnicodeDecodeError):
        return ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines or not lines[-1].isprintable():
        return ""
    return lines[-1]
