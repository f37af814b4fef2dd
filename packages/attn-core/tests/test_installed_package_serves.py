"""A regular (non-editable) install serves every kernel family: the wheel pip would install,
unpacked on its own, has its kernel sources built for the host CPU (ci/host_emulation.py) and
then called through the wheel's own loaders and launchers, against the float64 reference.

CI has no GPU, so "serves" here is the CoreX source configuration run by the host emulator
(what test_native_host_emulation.py and its siblings check in depth); ``nox -s clang`` builds
the same installed sources for a device with clang. A wheel that lacks a header, a loader that
looks for its sources in the repository, or an ABI mismatch between the shipped Python and the
shipped source each fail here, not on the lab machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from host_emulation_helpers import host_compiler
from test_native_hardening_package import _copy_package, _wheel

TESTS = Path(__file__).resolve().parent

# Runs in a fresh interpreter whose attn_core is the unpacked wheel (argv: site, library dir,
# compiler); the helpers are the tests' own, so they import that attn_core too.
SERVE = r"""
import sys
from pathlib import Path

import torch

import attn_core
from ci_scripts import load_ci_script
from host_emulation_helpers import host_case, host_prefill_case
from native_helpers import reference as decode_reference, run_native as run_decode
from native_prefill_helpers import edge_batch, reference as prefill_reference
from native_prefill_helpers import run_native as run_prefill
from attn_core.native import split
from attn_core.native.decode import DecodeLibrary
from attn_core.native.gated_delta import GatedDeltaLibrary, check_library
from attn_core.native.prefill import PrefillLibrary

site, out, compiler = (Path(a) for a in sys.argv[1:4])
package = Path(attn_core.__file__).resolve().parent
assert package.is_relative_to(site.resolve()), f"attn_core came from {package}, not the wheel"
csrc = package / "native" / "csrc"
emulation = load_ci_script("host_emulation")


def built(name):
    source, defines, file_name = emulation.LIBRARIES[name]
    target = out / file_name.format(slots=1)
    emulation.compile_library(csrc, source, (*defines, "-DATTN_GROUP_SLOTS=1"), target,
                              str(compiler))
    return target


def worst(got, want):
    assert bool(torch.isfinite(got).all()), "non-finite output"
    return float((got.double().cpu() - want).abs().max())


decode = host_case([1, 15, 17, 300], 2, 2, 128, 16, torch.float16, seed=1)
error = worst(run_decode(decode, 3, 128, lib=DecodeLibrary(built("decode")), stream=0),
              decode_reference(decode))
print(f"decode {error:.1e}")
assert error <= 1e-2, error

prefill = host_prefill_case(edge_batch(16, split.tokens_per_tile(split.CONFIG_LARGE, 1)), 2, 2,
                            128, 16, torch.float16, seed=2)
got = run_prefill(prefill, "fma", config=split.CONFIG_LARGE, num_splits=1,
                  lib=PrefillLibrary(built("prefill")), stream=0)
error = worst(got, prefill_reference(prefill))
print(f"prefill {error:.1e}")
assert error <= 1e-2, error

gdn = GatedDeltaLibrary(built("gated_delta"))
verdict = check_library(gdn, torch.device("cpu"), (gdn.path.name, torch.bfloat16, 128, 128, 2),
                        stream=0)
print(f"gated_delta {verdict.detail}")
assert verdict.ok, verdict.detail
print(f"served from {package}")
"""


def test_the_installed_wheel_builds_and_serves_every_family(tmp_path: Path) -> None:
    compiler = host_compiler()
    dist = tmp_path / "dist"
    _wheel(_copy_package(tmp_path), dist)
    (wheel,) = dist.glob("attn_core-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(site), str(TESTS)))}
    env.pop("ATTN_CORE_NATIVE_CACHE", None)
    done = subprocess.run(
        [sys.executable, "-c", SERVE, str(site), str(tmp_path / "libs"), compiler],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    for family in ("decode", "prefill", "gated_delta"):
        assert f"\n{family} " in "\n" + done.stdout, done.stdout
