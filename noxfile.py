"""Sessions that tie the monorepo together.

    nox -s sim      (default) CPU tests of attn-core, engine-patch and sim, then the simulator
                    report and its gates on the default BI-V100 profile; `-- ARGS` go to the
                    report alone (e.g. `nox -s sim -- --full`)
    nox -s tests    everything that runs on this machine: the above, the HIL runner against a
                    Docker engine, engine-patch inside the real vLLM 0.6.3, attn-core on torch 2.1
    nox -s lint     ruff check + ruff format --check; mypy on attn-core and engine-patch
    nox -s clang    upstream clang (CUDA mode) builds every native kernel with no warning and no
                    local memory, NVIDIA and -D__ILUVATAR__ (needs clang++-16; no CUDA toolkit),
                    and one library of each kernel family from a regular (non-editable) install
    nox -s vllm     engine-patch's tests inside vllm==0.6.3 (installed without its CUDA deps)
    nox -s compat   attn-core's tests on torch 2.1 / Python 3.10, the vendor's stack
    nox -s bench    GPU benchmarks (decode, prefill) on whatever device is present
    nox -s hil -- --target NAME --suite functional,long-context
                    the hardware-in-the-loop suites on a lab target

Sessions that need torch use pip (not uv): pip finds the CPU wheel this repository pins on local
disk, where uv would download a multi-GB CUDA build.
"""

from __future__ import annotations

import glob
import json
import os
import shlex
import shutil
from pathlib import Path

import nox

nox.options.sessions = ["sim"]
nox.options.default_venv_backend = "virtualenv"
nox.options.error_on_missing_interpreters = True

# A CPU build on the project machines' local disk; BI100_TORCH overrides it (e.g. on a laptop).
TORCH = shlex.split(os.environ.get("BI100_TORCH", "torch==2.13.0"))
# The vendor stack: torch 2.1.0+corex on Python 3.10. 2.1.2 is the newest 2.1.x on PyPI.
# PyPI has only the CUDA 12.1 build of 2.1.2 (a 670 MB wheel, measured, that pulls the
# nvidia-* wheels: about 4.7 GB installed); the CPU build (~185 MB, not measured: unreachable
# here) is only on PyTorch's own index, which the project machines cannot reach. Where it is
# reachable, BI100_COMPAT_INDEX selects it, e.g.
#   BI100_COMPAT_INDEX=https://download.pytorch.org/whl/cpu nox -s compat
# and BI100_COMPAT_TORCH may name a local wheel file instead of the requirement.
COMPAT_TORCH = shlex.split(os.environ.get("BI100_COMPAT_TORCH", "torch==2.1.2"))
COMPAT_INDEX = os.environ.get("BI100_COMPAT_INDEX", "")
# torch 2.1.2's own requirements besides the nvidia-* / triton wheels of the CUDA build
COMPAT_TORCH_DEPS = ["filelock", "typing-extensions", "sympy", "networkx", "jinja2", "fsspec"]


def _interpreter(version: str) -> str:
    """A pyenv-installed ``pythonX.Y`` by path (pyenv's shims hide non-default versions), else
    the bare version for nox to find on PATH."""
    pattern = os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python{version}")
    found = sorted(glob.glob(pattern))
    return found[-1] if found else version


COMPAT_PYTHON = _interpreter("3.10")

# tabulate: attn-core's tests run the benchmark scripts' --quick mode, which print tables.
TEST_DEPS = ["pytest>=7", "pytest-xdist>=3", "pytest-timeout>=2.2", "hypothesis>=6", "tabulate"]
ATTN_CORE = "packages/attn-core"
ENGINE_PATCH = "packages/engine-patch"
SIM = "packages/sim"
HIL = "hil"


def _install_stack(session: nox.Session, *extra: str) -> None:
    session.install(*TORCH)
    session.install(*TEST_DEPS, *extra)
    session.install("-e", ATTN_CORE, "-e", ENGINE_PATCH, "-e", SIM)


def _pytest(session: nox.Session, path: str, *args: str) -> None:
    # pytest exits 5 when it collected nothing; nox treats any non-zero exit as failure,
    # so an empty or mis-pointed test run fails the session instead of passing silently.
    session.run("python", "-m", "pytest", path, "-q", "-ra", *args)


def _cpu_tests(session: nox.Session, *marker_args: str) -> None:
    _pytest(session, f"{ATTN_CORE}/tests", "-n", "auto", *marker_args)
    _pytest(session, f"{ENGINE_PATCH}/tests", "-n", "auto")
    _pytest(session, f"{SIM}/tests", "-n", "auto")


@nox.session
def sim(session: nox.Session) -> None:
    """CPU tests, then the simulator report and gates (default profile: bi-v100)."""
    _install_stack(session)
    _cpu_tests(session, "-m", "not long and not cuda")
    out = os.environ.get("SIM_REPORT_DIR", "sim-report")
    # posargs are the report's flags (--full, --shape, --profile): gates takes other ones
    # (--profiles, --gates, --baseline) and would refuse them
    session.run("python", "-m", "attn_sim", "report", "--out", out, *session.posargs)
    session.run("python", "-m", "attn_sim", "gates", "--out", out)


@nox.session
def tests(session: nox.Session) -> None:
    """Every test that runs on this machine; then the vLLM and torch-2.1 sessions."""
    # compat, the last session, needs a python3.10: say so now, not after the other sessions
    if not (os.path.isabs(COMPAT_PYTHON) or shutil.which(f"python{COMPAT_PYTHON}")):
        session.error(
            "nox -s tests ends with the compat session (attn-core on torch 2.1), which needs a "
            "python3.10 on PATH or under ~/.pyenv/versions/3.10.*: install one first"
        )
    _install_stack(session, "-e", HIL)
    _cpu_tests(session, "-m", "not cuda")
    # The HIL tests drive a real Docker engine (DOCKER_HOST); under CI=true an unreachable
    # engine fails them instead of skipping.
    _pytest(session, f"{HIL}/tests", "-n", "2")
    session.notify("vllm")
    session.notify("compat")


@nox.session
def vllm(session: nox.Session) -> None:
    """engine-patch inside the real vLLM 0.6.3 Python package, on the CPU."""
    session.install(*TORCH)
    session.install(*TEST_DEPS)
    session.install("-e", ATTN_CORE, "-e", ENGINE_PATCH)
    # vllm==0.6.3 --no-deps, its pure-Python import needs pinned, its CUDA extensions removed
    # (built for torch 2.4 + CUDA, they cannot load here; vLLM falls back to Python).
    session.run("bash", f"{ENGINE_PATCH}/ci/install-vllm.sh", "python", external=True)
    session.run(
        "python", "-m", "pytest", f"{ENGINE_PATCH}/tests", "-q", "-ra", "-n", "auto",
        env={"ENGINE_PATCH_REQUIRE_VLLM": "1"},
    )  # fmt: skip


def _install_one_wheel_at_a_time(session: nox.Session, *requirements: str) -> None:
    """Resolve ``requirements`` once, then install each resolved distribution in its own pip call.

    One pip call downloads every wheel into its temporary directory before it installs any: for
    torch 2.1.2's CUDA build that is ~2.7 GB of wheels beside the ~4.7 GB they unpack to. The
    CI machine ran out of disk there; one wheel at a time the temporary
    peak is the largest wheel (cuDNN, 732 MB).
    """
    report = Path(session.create_tmp()) / "resolved.json"
    session.run(
        "python", "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(report),
        *requirements,
    )  # fmt: skip
    resolved = json.loads(report.read_text())["install"]
    for item in resolved:
        meta = item["metadata"]
        session.install("--no-deps", "--no-cache-dir", f"{meta['name']}=={meta['version']}")


@nox.session(python=COMPAT_PYTHON)
def compat(session: nox.Session) -> None:
    """attn-core's tests on torch 2.1.2 / Python 3.10 (the vendor ships torch 2.1.0+corex, 3.10)."""
    if COMPAT_INDEX:
        # --no-deps: the CPU index must serve torch only; its pure-Python deps come from PyPI
        session.install("--index-url", COMPAT_INDEX, "--no-deps", *COMPAT_TORCH)
        session.install(*COMPAT_TORCH_DEPS, "numpy<2")
    else:
        _install_one_wheel_at_a_time(session, *COMPAT_TORCH, "numpy<2")
    session.install(*TEST_DEPS)
    session.install("--no-deps", "-e", ATTN_CORE)
    session.run("python", "-c", "import torch; print('torch', torch.__version__)")
    _pytest(session, f"{ATTN_CORE}/tests", "-n", "auto", "-m", "not long and not cuda")


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (check + format) over the repository; mypy over attn-core and engine-patch."""
    session.install("ruff", "mypy")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.install(*TORCH)
    session.run("mypy", f"{ATTN_CORE}/src/attn_core", "--ignore-missing-imports")
    session.run("mypy", f"{ENGINE_PATCH}/src/engine_patch", "--ignore-missing-imports")


@nox.session
def clang(session: nox.Session) -> None:
    """Every native kernel under clang's CUDA mode: no warning, no local memory (CoreX's compiler
    is a clang). CUDA headers and libdevice come from the registry's wheels, not a toolkit."""
    # Representative decode libraries by default (MHA, Qwen3.6's group 6, the widest): the 23
    # compilations of every library and layer take ~17 CPU-minutes at -O3 (all clean when
    # last run); these 9 about 6. `nox -s clang -- --slots 1,2,3,4,5,6,7,8` checks them all.
    args = session.posargs or ["--slots", "1,6,8"]
    session.run("python", f"{ATTN_CORE}/ci/clang_check.py", *args)
    # The lab install: attn-core as a regular `pip install` makes it (no torch: the build
    # modules are standard-library only), then one library of each kernel family built by
    # upstream clang from the installed sources (tests/test_installed_package_serves.py runs the
    # same sources through the installed loaders). A wheel without csrc/ once failed only on the
    # lab machine.
    session.install("--no-deps", ATTN_CORE, env={"ATTN_CORE_NATIVE_BUILD": "0"})
    installed_build = """
import importlib.util, shutil, subprocess, sys
from pathlib import Path
sys.path.insert(0, "packages/attn-core/ci")
from clang_check import cuda_path
from clang_library import install_shim
cache, clang = Path(sys.argv[1]).resolve(), sys.argv[2]
native = Path(importlib.util.find_spec("attn_core").submodule_search_locations[0]) / "native"
assert Path("packages").resolve() not in native.parents, f"not an installed package: {native}"
def load(name):  # by path, as setup.py does: attn_core/__init__ imports torch
    spec = importlib.util.spec_from_file_location("installed_" + name, native / (name + ".py"))
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
toolchain, family, build = load("toolchain"), load("family"), load("build")
fatbinary = shutil.which("fatbinary")
if fatbinary is None:  # the CUDA 12 wheels lack it; CUDA 13's nvcc wheel has one
    site = cache / "fatbinary-site"
    if not (site / "nvidia/cu13/bin/fatbinary").is_file():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                        str(site), "nvidia-cuda-nvcc==13.0.*"], check=True)
    fatbinary = str(site / "nvidia/cu13/bin/fatbinary")
farm = cuda_path(cache)
install_shim(farm, str(Path(fatbinary).resolve()))
(farm / "lib64").mkdir()
runtime = cache / "site/nvidia/cuda_runtime/lib/libcudart_static.a"
(farm / "lib64/libcudart_static.a").symlink_to(runtime)
tc = toolchain.Toolchain("clang", clang, str(farm), ("sm_80",), toolchain._version(clang))
out = cache / "installed-build"
shutil.rmtree(out, ignore_errors=True)
for kind, variant in ((family.DECODE, "g1"), (family.PREFILL, "fma"), (family.GATED_DELTA, "fma")):
    path, seconds = build.build_variant(tc, out, kind, variant)
    assert not build.damage(path, log=True), build.damage(path, log=True)
    print(f"installed attn-core ({native}): {path.name} built by {clang} in {seconds:.0f} s")
"""
    clang_exe = os.environ.get("CLANG", "clang++-16")
    session.run("python", "-c", installed_build, ".ci-cache/clang-cuda", clang_exe)


@nox.session
def bench(session: nox.Session) -> None:
    """Decode and prefill benchmarks on the present device (tables + results/*.json)."""
    session.install(*TORCH)
    session.install("tabulate")
    session.install("-e", ATTN_CORE)
    session.run("python", "bench/decode_bench.py", *session.posargs)
    session.run("python", "bench/prefill_bench.py", *session.posargs)


@nox.session(venv_backend="uv|virtualenv")
def hil(session: nox.Session) -> None:
    """Run HIL suites on lab targets: nox -s hil -- --target NAME --suite functional."""
    # [ssh]: paramiko, which docker-py 7.x needs for any ssh:// endpoint (the lab target), even
    # with use_ssh_client = true
    session.install("-e", f"{HIL}[ssh]")
    session.run("python", "-m", "hil", *session.posargs)
