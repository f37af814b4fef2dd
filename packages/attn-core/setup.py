"""Build hook: compile every native kernel family when a CUDA or CoreX compiler is present.

The metadata is in pyproject.toml; this file only adds a step to ``build_py``. It needs no
torch: attn_core/native/toolchain.py, family.py and build.py (which loads core/files.py) are
standard-library modules, loaded here by path. Every family's libraries
(attn_core/native/family.py: decode, prefill, gated_delta) land in
``attn_core/native/_prebuilt``, so an installed package serves them without a build in the
serving process. A missing compiler or a failed build never fails the install (the torch
path runs and ``engine-patch status`` says why); the HIL image (hil/docker/Dockerfile) builds with
``python -m attn_core.native build || [ $? -eq 3 ]`` instead, where a failed build fails it.

Targets: ``ATTN_CORE_NATIVE_ARCH`` (comma-separated, e.g. ``sm_90`` or ``ivcore10``), else the
GPUs ``nvidia-smi`` reports, else ``sm_80,sm_90`` (NVIDIA) / ``ivcore10`` (CoreX).
``ATTN_CORE_NATIVE_BUILD=0`` skips the build.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

SRC = Path(__file__).resolve().parent / "src" / "attn_core"


def _load(relative: str):
    name = "_attn_core_setup_" + relative.replace("/", "_").removesuffix(".py")
    spec = importlib.util.spec_from_file_location(name, SRC / relative)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


def _gpu_archs() -> tuple[str, ...]:
    if not shutil.which("nvidia-smi"):
        return ()
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return ()
    caps = {line.strip().replace(".", "") for line in done.stdout.splitlines() if line.strip()}
    return tuple(sorted(f"sm_{c}" for c in caps if c.isdigit()))


class BuildPyWithNative(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # a source checkout builds on first use (attn_core.native.loader)
        out_dir = Path(self.build_lib) / "attn_core" / "native" / "_prebuilt"
        # build/ outlives an interrupted install: its half-built libraries, locks and temporary
        # folders would be copied into site-packages by the next one, so nothing of them stays
        shutil.rmtree(out_dir, ignore_errors=True)
        settings = _load("core/settings.py")
        env = os.environ
        wanted = env.get("ATTN_CORE_NATIVE_BUILD")
        if not settings.parse_bool("ATTN_CORE_NATIVE_BUILD", wanted, True):
            print("attn-core: native kernel not built (ATTN_CORE_NATIVE_BUILD is off)")
            return
        toolchain_mod = _load("native/toolchain.py")
        family_mod = _load("native/family.py")
        build_mod = _load("native/build.py")
        arch_text = env.get("ATTN_CORE_NATIVE_ARCH", "")
        # the one validator of targets (a bad one fails the install, naming the variable)
        forced = (
            settings.parse_archs("ATTN_CORE_NATIVE_ARCH", arch_text) if arch_text.strip() else ()
        )
        home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
        toolchain, why = toolchain_mod.find_toolchain(home, forced or _gpu_archs() or None)
        if toolchain is None:
            print(f"attn-core: native kernel not built: {why} (the torch path will run)")
            return
        print(
            f"attn-core: building the native kernels for {','.join(toolchain.archs)}: minutes per "
            "library (ATTN_CORE_NATIVE_BUILD=0 skips it; the torch path then runs)",
            flush=True,
        )
        # a fresh folder outside build/, and only finished libraries (each with its log and
        # build record) move into the package: an output is complete or absent
        with tempfile.TemporaryDirectory(prefix="attn-core-native-") as fresh, \
                build_mod.stop_on_signals():  # fmt: skip
            try:
                seconds = build_mod.build_all(
                    toolchain, family_mod.FAMILIES.values(), out_dir=Path(fresh),
                    progress=lambda line: print(f"attn-core: {line}", flush=True),
                )  # fmt: skip
            except build_mod.BuildError as exc:
                # the libraries that did build still ship; the others' kernels take the torch path
                _move_finished(build_mod, Path(fresh), out_dir)
                print(
                    f"attn-core: WARNING: native kernel build failed, the torch path runs.\n{exc}"
                )
                return
            _move_finished(build_mod, Path(fresh), out_dir)
        print(f"attn-core: native kernel built for {','.join(toolchain.archs)} in {seconds:.0f} s")


def _move_finished(build_mod, fresh: Path, out_dir: Path) -> None:
    """Every library in ``fresh`` its build record vouches for, with its log and record, into
    ``out_dir`` (the record last: a library without one is never served)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for library in sorted(fresh.glob("*.so")):
        if build_mod.damage(library):
            continue
        for path in (library, build_mod.log_path(library), build_mod.record_path(library)):
            if path.is_file():
                shutil.move(str(path), str(out_dir / path.name))


class BinaryDistribution(Distribution):
    def has_ext_modules(self) -> bool:  # the wheel may carry a compiled library
        return True


setup(cmdclass={"build_py": BuildPyWithNative}, distclass=BinaryDistribution)
