// The one header that knows which compiler and GPU family this source is built for.
//
// nvcc (NVIDIA) and CoreX's clang (Iluvatar BI-V100 / MR-V100, `__ILUVATAR__` defined) both
// compile this tree. Rules that keep one source right on both:
// - no inline PTX (CoreX rejects it: %laneid, ld.global.cg and cvt.sat failed in public ports);
// - no `__CUDA_ARCH__` version gates on the Iluvatar path (CoreX reports odd values there);
// - no warp shuffles: CoreX warps are 64 lanes wide and its shuffle mask semantics are not
//   documented publicly, so every cross-thread reduction goes through shared memory with
//   explicit barriers, which is right for any warp width;
// - only the CUDA 10.2 runtime API (CoreX's level), and cuda_fp16.h; bf16 and fp8 are decoded
//   from their bits here (cuda_bf16.h / cuda_fp8.h are newer than 10.2).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "attn_kernel_info.h"

#if defined(__ILUVATAR__)
#define ATTN_PLATFORM "iluvatar-corex"
#define ATTN_HW_WARP_SIZE 64
#else
#define ATTN_PLATFORM "nvidia"
#define ATTN_HW_WARP_SIZE 32
#endif

#define ATTN_DEVICE __device__ __forceinline__

// A lambda's body inlined into its caller: upstream clang 16 (and so, likely, CoreX's clang)
// emitted the prefill kernel's large by-reference softmax lambdas as calls with their closure in
// a 288-byte local depot, and the decode body's loaders with their register arrays there; nvcc
// inlined them either way. GNU syntax, which both compilers take.
#define ATTN_INLINE_LAMBDA __attribute__((always_inline))

// The exports every kernel family's library has (attn_core.native.abi.COMMON_FUNCTIONS), inside
// its `extern "C"` block: <prefix>_abi_version, <prefix>_platform, <prefix>_error_string.
#define ATTN_COMMON_EXPORTS(prefix, version)                      \
  int prefix##_abi_version(void) { return version; }              \
  const char* prefix##_platform(void) { return ATTN_PLATFORM; }   \
  const char* prefix##_error_string(int code) {                   \
    return cudaGetErrorString(static_cast<cudaError_t>(code));    \
  }

namespace attn {

// Element kinds, shared with the Python side (attn_core/native/abi.py).
enum ElemKind : int {
  kFloat32 = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
  kFp8E4M3 = 3,  // float8_e4m3fn: no infinities, S.1111.111 is NaN
  kFp8E5M2 = 4,  // float8_e5m2: the top byte of an IEEE half
};

__host__ __device__ constexpr int elem_bytes(int kind) {
  return kind == kFloat32 ? 4 : (kind == kFloat16 || kind == kBFloat16) ? 2 : 1;
}

// One 16-byte vector: the unit of every global load in the decode kernel.
struct alignas(16) Vec16 {
  uint32_t w[4];
};
struct alignas(8) Vec8 {
  uint32_t w[2];
};

// The kernels' shared-memory width holding head_size: 64, 128 or 256 (attn_core.native.abi).
inline int head_bucket(int head_size) { return head_size <= 64 ? 64 : head_size <= 128 ? 128 : 256; }

template <typename V>
ATTN_DEVICE V load_vec(const void* p) {
  return *reinterpret_cast<const V*>(p);
}

// The driver's facts of `kernel` launched with `threads` threads and no dynamic shared memory,
// for every family's <prefix>_kernel_info export.
inline cudaError_t read_kernel_info(const void* kernel, int threads, AttnKernelInfo* info,
                                    int dynamic_smem = 0) {
  if (kernel == nullptr || info == nullptr) return cudaErrorInvalidValue;
  cudaFuncAttributes attr;
  cudaError_t err = cudaFuncGetAttributes(&attr, kernel);
  if (err != cudaSuccess) return err;
  int blocks = 0;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, dynamic_smem);
  if (err != cudaSuccess) return err;
  info->num_regs = attr.numRegs;
  info->smem_bytes = static_cast<int32_t>(attr.sharedSizeBytes) + dynamic_smem;
  info->local_bytes = static_cast<int32_t>(attr.localSizeBytes);
  info->max_threads_per_block = attr.maxThreadsPerBlock;
  info->threads_per_block = threads;
  info->blocks_per_sm = blocks;
  info->binary_version = attr.binaryVersion;
  info->ptx_version = attr.ptxVersion;
  return cudaSuccess;
}

}  // namespace attn
