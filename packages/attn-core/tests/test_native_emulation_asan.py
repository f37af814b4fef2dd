"""The emulated kernels read and write only inside the tensors they are given: a subset of the
host-emulated reference tests run again with the libraries built under AddressSanitizer.

The ASan runtime has to be loaded before anything else, so each run is a child pytest with the
compiler's ASan and C++ runtimes in ``LD_PRELOAD`` and ``ATTN_CORE_EMULATION_ASAN=1`` (the
helpers then build instrumented libraries). torch allocates CPU tensors with
``posix_memalign``, which ASan intercepts: a kernel load or store past a cache, a block table,
the lengths, the outputs or the partials reports the kernel's source line and fails the child.
The subset covers pages past each end (lengths at and past the table's capacity), windows
restaged mid-partition, empty partitions, hundreds of partitions, strided q / out, the
prefill kernel's splits, windows and ALiBi, and every Gated DeltaNet kernel (the 16-bit pair in
its NVIDIA configuration too); the first test
shows the harness catching a read one element past a buffer.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from host_emulation_helpers import builder, host_compiler

import attn_core

TESTS = Path(__file__).resolve().parent
DECODE_SUBSET = "alibi or empty or qwen or strided or merge or past_the_table"
PREFILL_SUBSET = "alibi or split_counts or gqa"
# every Gated DeltaNet kernel: both prefill forms over empty and odd-length sequences, strided
# inputs, the decode step with a padding slot, both convolutions with and without states
GATED_DELTA_SUBSET = "prefill or padding or strided or conv"
# the 16-bit pair (NVIDIA configuration): empty, one-token and partial chunks, its workspace
GATED_DELTA_MMA_SUBSET = "unnormalised"

OVERRUN = r"""
#include <cuda_runtime.h>
__global__ void copy(const float* in, float* out, int n, int over) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i + (i == n - 1 ? over : 0)];
}
extern "C" int run(const float* in, float* out, int n, int over) {
  copy<<<(n + 63) / 64, 64, 0, 0>>>(in, out, n, over);
  return cudaGetLastError();
}
"""

CHILD = """
import ctypes, sys, torch
lib = ctypes.CDLL(sys.argv[1])
lib.run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
x, y = torch.arange(100, dtype=torch.float32), torch.zeros(100)
print("rc", lib.run(x.data_ptr(), y.data_ptr(), 100, int(sys.argv[2])), bool((x == y).all()))
"""


@pytest.fixture(scope="module")
def asan_env() -> dict[str, str]:
    compiler = host_compiler()
    preload = builder().asan_preload(compiler)
    if preload is None:
        why = f"{compiler} has no shared AddressSanitizer runtime (libasan / libclang_rt.asan)"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    # the child imports the attn_core this process imported, wherever its cwd
    source = str(Path(attn_core.__file__).resolve().parents[1])
    inherited = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    path = os.pathsep.join([source, *filter(None, inherited)])
    return {
        **os.environ,
        "PYTHONPATH": path,
        "LD_PRELOAD": " ".join(map(str, preload)),
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:exitcode=23",
        "ATTN_CORE_EMULATION_ASAN": "1",
    }


def run_child(args: list[str], env: dict[str, str], timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout,
        check=False, cwd=TESTS,
    )  # fmt: skip


def test_a_read_past_a_tensor_is_reported(asan_env, tmp_path: Path) -> None:
    module = builder()
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "overrun.cu").write_text(OVERRUN)
    target = tmp_path / "lib" / "liboverrun.so"
    flags = module.ASAN_FLAGS
    module.compile_library(tmp_path / "src", "overrun.cu", flags, target, host_compiler())
    (tmp_path / "child.py").write_text(CHILD)
    inside = run_child([str(tmp_path / "child.py"), str(target), "0"], asan_env, 120)
    assert inside.returncode == 0 and "rc 0 True" in inside.stdout, inside.stderr[-3000:]
    past = run_child([str(tmp_path / "child.py"), str(target), "1"], asan_env, 120)
    assert past.returncode == 23, past.stderr[-3000:]
    assert "heap-buffer-overflow" in past.stderr and "overrun.cu:5" in past.stderr


@pytest.mark.parametrize(
    ("file", "subset"),
    [
        ("test_native_host_emulation.py", DECODE_SUBSET),
        ("test_native_prefill_host_emulation.py", PREFILL_SUBSET),
        ("test_native_gated_delta_host.py", GATED_DELTA_SUBSET),
        ("test_native_gated_delta_mma_host.py", GATED_DELTA_MMA_SUBSET),
    ],
)
def test_the_kernels_stay_inside_their_tensors(asan_env, file: str, subset: str) -> None:
    # -s: ASan ends the process at its first report, so a report pytest captured would be lost
    args = ["-m", "pytest", file, "-q", "-s", "-p", "no:cacheprovider", "-p", "no:xdist"]
    done = run_child([*args, "-k", subset], asan_env, 1500)
    assert "AddressSanitizer" not in done.stderr, done.stderr[-6000:]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and " failed" not in done.stdout, done.stdout[-2000:]
