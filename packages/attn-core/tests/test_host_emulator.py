"""ci/host_cuda's emulator finds what it claims to: a missing barrier, barriers that diverge,
shared memory read before this block wrote it, warp collectives a warp cannot finish, an
asynchronous copy read before its wait; and runs what a GPU runs (threads that return early no
longer hold a barrier, dynamic shared memory, 3-D blocks and grids, shuffles, ldmatrix and the
m16n8k16 matrix instruction by the kernel headers' own fragment layout).

Each property is a small kernel compiled the way ci/host_emulation.py compiles the native
sources (same rewrite of `<<<...>>>` and `extern __shared__`, same headers), called with ctypes.
"""

from __future__ import annotations

import ctypes
import math
from pathlib import Path

import pytest
import torch
from host_emulation_helpers import builder, host_compiler

from attn_core.native.family import DECODE, DECODE_SLOTS, GATED_DELTA, PREFILL

KERNELS = r"""
#include <cuda_runtime.h>

// Thread i writes s[i] and reads s[n - 1 - i]: right only with the barrier between.
__global__ void mirror(float* out, int barrier) {
  __shared__ float s[64];
  const int i = threadIdx.x, n = blockDim.x;
  s[i] = static_cast<float>(blockIdx.x * 100 + i);
  if (barrier) __syncthreads();
  out[blockIdx.x * n + i] = s[n - 1 - i];
}

// Half the block waits at one barrier, half at another.
__global__ void divergent(float* out) {
  if (threadIdx.x < 32) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1.0f;
}

// Only even slots are written; odd ones keep whatever shared memory held.
__global__ void half_written(float* out) {
  __shared__ float s[64];
  if (threadIdx.x % 2 == 0) s[threadIdx.x] = 1.0f;
  __syncthreads();
  out[blockIdx.x * 64 + threadIdx.x] = s[threadIdx.x];
}

// Threads past 16 return before the barriers the first 16 still pass.
__global__ void early_return(float* out) {
  __shared__ float s[16];
  if (threadIdx.x >= 16) return;
  s[threadIdx.x] = static_cast<float>(threadIdx.x);
  __syncthreads();
  float sum = 0.0f;
  for (int k = 0; k < 16; ++k) sum += s[k];
  __syncthreads();
  out[threadIdx.x] = sum;
}

// A block of (4, 2, 2) threads over a grid of (3, 2, 1), dynamic shared memory of the launch.
__global__ void coordinates(float* out) {
  extern __shared__ __align__(16) float d[];
  const int t = threadIdx.x + 4 * (threadIdx.y + 2 * threadIdx.z);
  const int b = blockIdx.x + 3 * blockIdx.y;
  d[t] = static_cast<float>(b * 16 + t);
  __syncthreads();
  out[b * 16 + t] = d[15 - t] + 1000.0f * (gridDim.x * gridDim.y + blockDim.z);
}

extern "C" int run(int which, float* out, int arg) {
  switch (which) {
    case 0: mirror<<<2, 64, 0, 0>>>(out, arg); break;
    case 1: divergent<<<1, 64, 0, 0>>>(out); break;
    case 2: half_written<<<2, 64, 0, 0>>>(out); break;
    case 3: early_return<<<1, 64, 0, 0>>>(out); break;
    case 4: coordinates<<<dim3(3, 2, 1), dim3(4, 2, 2), 16 * sizeof(float), 0>>>(out); break;
  }
  return cudaGetLastError();
}
"""


def compiled(factory: pytest.TempPathFactory, name: str, text: str, flags=()) -> ctypes.CDLL:
    """``text`` as ``name``.cu, built as ci/host_emulation.py builds the native sources."""
    src = factory.mktemp(f"{name}_src")
    (src / f"{name}.cu").write_text(text)
    target = factory.mktemp(f"{name}_lib") / f"lib{name}.so"
    builder().compile_library(src, f"{name}.cu", tuple(flags), target, host_compiler())
    lib = ctypes.CDLL(str(target))
    lib.attn_host_emulation_set_order.argtypes = [ctypes.c_int]
    return lib


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    lib = compiled(tmp_path_factory, "kernels", KERNELS)
    lib.run.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    lib.run.restype = ctypes.c_int
    return lib


def launch(lib: ctypes.CDLL, which: int, size: int, arg: int = 0, reverse: bool = False):
    out = torch.full((size,), math.nan)
    lib.attn_host_emulation_set_order(int(reverse))
    try:
        rc = lib.run(which, out.data_ptr(), arg)
    finally:
        lib.attn_host_emulation_set_order(0)
    return rc, out


def test_a_barrier_orders_shared_memory(kernels) -> None:
    want = torch.tensor([b * 100 + 63 - i for b in range(2) for i in range(64)], dtype=torch.float)
    for reverse in (False, True):
        rc, out = launch(kernels, 0, 128, arg=1, reverse=reverse)
        assert rc == 0 and torch.equal(out, want)


def test_a_missing_barrier_changes_the_result_with_the_thread_order(kernels) -> None:
    _, forward = launch(kernels, 0, 128, arg=0)
    _, backward = launch(kernels, 0, 128, arg=0, reverse=True)
    # forward, the first half reads slots not yet written this block (NaN); backward, the other
    assert forward[:32].isnan().all() and not forward[32:64].isnan().any()
    assert backward[32:64].isnan().all() and not backward[:32].isnan().any()


def test_divergent_barriers_fail_the_launch_and_the_next_launch_runs(kernels) -> None:
    rc, _ = launch(kernels, 1, 64)
    assert rc != 0  # cudaErrorLaunchFailure, read (and cleared) by cudaGetLastError
    rc, out = launch(kernels, 0, 128, arg=1)
    assert rc == 0 and not out.isnan().any()


def test_shared_memory_a_block_did_not_write_reads_as_nan(kernels) -> None:
    _, out = launch(kernels, 2, 128)
    assert (out[0::2] == 1.0).all() and out[1::2].isnan().all()  # in both blocks


def test_threads_that_returned_do_not_hold_a_barrier(kernels) -> None:
    rc, out = launch(kernels, 3, 64)
    assert rc == 0 and (out[:16] == sum(range(16))).all() and out[16:].isnan().all()


def test_block_and_grid_coordinates_and_dynamic_shared_memory(kernels) -> None:
    rc, out = launch(kernels, 4, 96)
    want = [b * 16 + 15 - t + 1000.0 * (6 + 2) for b in range(6) for t in range(16)]
    assert rc == 0 and torch.equal(out, torch.tensor(want, dtype=torch.float))


def test_a_launch_the_rewrite_cannot_take_is_refused(tmp_path: Path) -> None:
    module = builder()
    with pytest.raises(module.EmulationBuildError, match="line 2"):
        module.rewrite_for_host("// x\nauto k = kernel<<<\n  grid, block>>>;\n")
    assert "::attn_emu::launch(k.fn, g, 128, 0, s, a);" in module.rewrite_for_host(
        "k.fn<<<g, 128, 0, s>>>(a);"
    )


@pytest.mark.parametrize("slots", ["0", "9", "six"])
def test_a_bad_slot_count_is_a_usage_error_naming_it(slots: str, tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        builder().main(["--slots", slots, "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "--slots" in capsys.readouterr().err


def test_a_bad_slot_count_is_refused_before_any_compiler_runs(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="slots must be 1-8, got 0"):
        builder().build("decode", tmp_path, slots=0)


def test_an_out_path_that_cannot_be_a_directory_is_named(tmp_path: Path, capsys) -> None:
    host_compiler()  # the build must get as far as creating the cache directory
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert builder().main(["--slots", "1", "--out", str(blocker / "cache")]) == 1
    assert f"--out {blocker / 'cache'}: Not a directory" in capsys.readouterr().err


def test_the_host_libraries_are_the_families_variants() -> None:
    """ci/host_emulation.py (standard library, no attn_core) names and defines its libraries
    as attn_core.native.family does, so the loaders open them as the device's own."""
    module = builder()
    source, _, name = module.LIBRARIES["decode"]
    assert source == DECODE.source and module.MAX_SLOTS == max(DECODE_SLOTS)
    for slots in DECODE_SLOTS:  # build() adds -DATTN_GROUP_SLOTS=<slots>
        assert name.format(slots=slots) == DECODE.library_name(f"g{slots}")
        assert DECODE.variants[f"g{slots}"] == (f"ATTN_GROUP_SLOTS={slots}",)
    source, defines, name = module.LIBRARIES["prefill"]
    assert source == PREFILL.source and name == PREFILL.library_name("fma")
    assert set(PREFILL.variants["fma"]) <= {d[len("-D") :] for d in defines if d.startswith("-D")}
    for configuration in ("gated_delta", "gated_delta_nvidia"):  # CoreX's, nvcc's
        source, _, name = module.LIBRARIES[configuration]
        assert source == GATED_DELTA.source and name == GATED_DELTA.library_name("fma")


# ---------------------------------------------------------------------- warp collectives
WARP_KERNELS = r"""
#include <cuda_runtime.h>
#include <cuda_pipeline.h>

#include "attn_m16n8k16.cuh"

using namespace attn;

// Lane l reads lane l ^ 5, then lane l - 3 (its own below 3).
__global__ void shuffles(float* out) {
  const float v = static_cast<float>(threadIdx.x);
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, v, 5);
  out[64 + threadIdx.x] = __shfl_up_sync(0xffffffffu, v, 3);
}

// D [16][16] = A [16][16] . B, A row major and B given as [k][n] (ldmatrix .trans) when
// `b_by_k`, else as [n][k] (plain ldmatrix), 16-bit of QKIND; one warp.
template <int QKIND>
__global__ void product(const uint16_t* a, const uint16_t* b, int b_by_k, float* d) {
  __shared__ __align__(16) uint16_t sa[16 * 16], sb[16 * 16];
  const int lane = threadIdx.x;
  for (int e = lane; e < 256; e += 32) sa[e] = a[e], sb[e] = b[e];
  __syncthreads();
  uint32_t af[4], bf[4];
  m16n8k16::ldmatrix_x4<false>(sa + (lane & 15) * 16 + (lane >> 4) * 8, af);
  if (b_by_k) {
    m16n8k16::ldmatrix_x4<true>(sb + (lane & 15) * 16 + (lane >> 4) * 8, bf);
  } else {
    m16n8k16::ldmatrix_x4<false>(sb + ((lane & 7) + ((lane >> 4) << 3)) * 16 +
                                 ((lane >> 3) & 1) * 8, bf);
  }
  float acc[2][4] = {{1.f, 1.f, 1.f, 1.f}, {1.f, 1.f, 1.f, 1.f}};  // C = 1
  m16n8k16::mma<QKIND>(acc[0], af[0], af[1], af[2], af[3], bf[0], bf[1]);
  m16n8k16::mma<QKIND>(acc[1], af[0], af[1], af[2], af[3], bf[2], bf[3]);
  for (int j = 0; j < 2; ++j) {
    for (int i = 0; i < 4; ++i) {
      d[m16n8k16::c_row(lane, i) * 16 + 8 * j + m16n8k16::c_col(lane, i)] = acc[j][i];
    }
  }
}

// Lane 5 returns; the rest shuffle.
__global__ void lane_gone(float* out) {
  if (threadIdx.x == 5) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

// Half the warp at one shuffle, half at another.
__global__ void split_warp(float* out) {
  float v = 1.0f;
  if (threadIdx.x < 16) {
    v = __shfl_xor_sync(0xffffffffu, v, 1);
  } else {
    v = __shfl_xor_sync(0xffffffffu, v, 2);
  }
  out[threadIdx.x] = v;
}

// 16 bytes into shared memory by an asynchronous copy: read before its wait, then after.
__global__ void early_read(const float* in, float* out) {
  __shared__ __align__(16) float s[4];
  if (threadIdx.x == 0) {
    __pipeline_memcpy_async(s, in, 16, 0);
    __pipeline_commit();
    out[0] = s[1];
    __pipeline_wait_prior(0);
    out[1] = s[1];
  }
}

extern "C" int run_warp(int which, const void* a, const void* b, int arg, float* out) {
  const uint16_t* a16 = static_cast<const uint16_t*>(a);
  const uint16_t* b16 = static_cast<const uint16_t*>(b);
  void (*const bf16)(const uint16_t*, const uint16_t*, int, float*) = product<kBFloat16>;
  void (*const fp16)(const uint16_t*, const uint16_t*, int, float*) = product<kFloat16>;
  switch (which) {
    case 0: shuffles<<<1, 64, 0, 0>>>(out); break;
    case 1: bf16<<<1, 32, 0, 0>>>(a16, b16, arg, out); break;  // the rewrite takes plain names
    case 2: fp16<<<1, 32, 0, 0>>>(a16, b16, arg, out); break;
    case 3: lane_gone<<<1, 32, 0, 0>>>(out); break;
    case 4: split_warp<<<1, 32, 0, 0>>>(out); break;
    case 5: early_read<<<1, 32, 0, 0>>>(static_cast<const float*>(a), out); break;
  }
  return cudaGetLastError();
}
"""


@pytest.fixture(scope="module")
def warp_kernels(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """WARP_KERNELS against the kernel headers (csrc) in the NVIDIA configuration."""
    lib = compiled(tmp_path_factory, "warp", WARP_KERNELS, [f"-I{builder().CSRC}"])
    lib.run_warp.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                             ctypes.c_void_p]  # fmt: skip
    lib.run_warp.restype = ctypes.c_int
    return lib


def run_warp(lib, which, size, a=None, b=None, arg=0, reverse=False):
    out = torch.full((size,), math.nan)
    lib.attn_host_emulation_set_order(int(reverse))
    try:
        rc = lib.run_warp(which, a.data_ptr() if a is not None else None,
                          b.data_ptr() if b is not None else None, arg, out.data_ptr())  # fmt: skip
    finally:
        lib.attn_host_emulation_set_order(0)
    return rc, out


@pytest.mark.parametrize("reverse", [False, True])
def test_shuffles_read_the_lanes_they_name(warp_kernels, reverse: bool) -> None:
    rc, out = run_warp(warp_kernels, 0, 128, reverse=reverse)
    lanes = torch.arange(64)
    want_xor = (lanes ^ 5).float()
    want_up = torch.where(lanes % 32 >= 3, lanes - 3, lanes).float()
    assert rc == 0 and torch.equal(out[:64], want_xor) and torch.equal(out[64:], want_up)


@pytest.mark.parametrize("dtype,which", [(torch.bfloat16, 1), (torch.float16, 2)], ids=str)
@pytest.mark.parametrize("b_by_k", [True, False])
def test_ldmatrix_and_the_matrix_instruction_multiply(warp_kernels, dtype, which, b_by_k) -> None:
    """Through the headers' own fragment layout (attn_m16n8k16.cuh), the product equals
    torch's: a transposed or misplaced fragment would not."""
    gen = torch.Generator().manual_seed(7)
    a = torch.randn(16, 16, generator=gen).to(dtype)
    b = torch.randn(16, 16, generator=gen).to(dtype)  # [k][n]
    stored = b if b_by_k else b.t().contiguous()
    rc, out = run_warp(warp_kernels, which, 256, a.view(torch.int16), stored.view(torch.int16),
                       arg=int(b_by_k))  # fmt: skip
    want = a.double() @ b.double() + 1.0
    assert rc == 0
    torch.testing.assert_close(out.view(16, 16).double(), want, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("which", [3, 4], ids=["a-lane-returned", "lanes-at-two-collectives"])
def test_a_collective_the_warp_cannot_finish_fails_the_launch(warp_kernels, which: int) -> None:
    rc, _ = run_warp(warp_kernels, which, 32)
    assert rc != 0
    rc, _ = run_warp(warp_kernels, 0, 128)  # the next launch runs
    assert rc == 0


def test_an_asynchronous_copy_lands_at_its_wait(warp_kernels) -> None:
    source = torch.tensor([1.0, 2.0, 3.0, 4.0])
    rc, out = run_warp(warp_kernels, 5, 2, a=source)
    assert rc == 0 and out[0].isnan() and out[1] == 2.0
