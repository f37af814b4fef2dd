// The part of the CUDA runtime API the native sources use, for a host build that runs their
// kernels in attn_host_emulator.h (ci/host_emulation.py). Not a CUDA runtime: launches run on
// the calling thread, to completion; queries about kernels and devices answer "not supported".
#pragma once

// Marks the host build for the kernel headers: where the device build has inline PTX (the
// matrix instruction, ldmatrix) they call attn_emu_warp.h instead.
#define ATTN_HOST_EMULATION 1

#include <math.h>
#include <stdint.h>

#include "attn_host_emulator.h"

#define __host__
#define __device__
#define __global__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#if defined(__ELF__)  // every __shared__ variable in one section, poisoned before each block
#define __shared__ static __attribute__((section("attn_emu_shared")))
#else  // Mach-O and others: not poisoned (untested there)
#define __shared__ static
#endif
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))

struct float2 {
  float x, y;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
struct alignas(16) float4 {
  float x, y, z, w;
};

typedef struct CUstream_st* cudaStream_t;

enum cudaError_t : int {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorNotSupported = 801,
  cudaErrorLaunchFailure = 719,
};

inline cudaError_t cudaGetLastError() {
  return ::attn_emu::take_error() == ::attn_emu::kOk ? cudaSuccess : cudaErrorLaunchFailure;
}

inline const char* cudaGetErrorString(cudaError_t code) {
  switch (code) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorNotSupported: return "operation not supported (host emulation)";
    case cudaErrorLaunchFailure: return "unspecified launch failure (host emulation)";
    default: return "unknown error (host emulation)";
  }
}

struct cudaFuncAttributes {
  int binaryVersion, maxThreadsPerBlock, numRegs, ptxVersion;
  size_t localSizeBytes, sharedSizeBytes;
};

// One emulated device, ordinal 0, which cannot say how much shared memory a block may opt in to
// (the prefill library then takes one K / V buffer, as on a driver that cannot say; its CUDA-core
// layer has only that one). Function attributes are accepted and not enforced. What a device
// compiler would make of a kernel is not known here: its attributes read as zero registers, no
// local or static shared memory, 1024 threads, one resident block per SM (a launcher that needs
// an answer gets a harmless one; nothing should plan from it).
enum cudaDeviceAttr : int { cudaDevAttrMaxSharedMemoryPerBlockOptin = 97 };
enum cudaFuncAttribute : int { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

inline cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int*, cudaDeviceAttr, int device) {
  return device != 0 ? cudaErrorInvalidValue : cudaErrorNotSupported;
}
inline cudaError_t cudaFuncSetAttribute(const void*, cudaFuncAttribute, int) { return cudaSuccess; }
inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, const void*) {
  *attr = cudaFuncAttributes{};
  attr->maxThreadsPerBlock = 1024;
  return cudaSuccess;
}
inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, const void*, int,
                                                                size_t) {
  *blocks = 1;
  return cudaSuccess;
}

// Device arithmetic the kernels call by its CUDA name.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned int min(unsigned int a, unsigned int b) { return a < b ? a : b; }
inline unsigned int max(unsigned int a, unsigned int b) { return a > b ? a : b; }
inline int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t max(int64_t a, int64_t b) { return a > b ? a : b; }
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }

inline float __uint_as_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
inline uint32_t __float_as_uint(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned int>(x)); }
inline float __int_as_float(int u) { return __uint_as_float(static_cast<uint32_t>(u)); }
inline int __float_as_int(float f) { return static_cast<int>(__float_as_uint(f)); }

// The emulated library's own entry point: the order its threads run in within a phase (0: index
// order, 1: reverse).
extern "C" void attn_host_emulation_set_order(int reverse) {
  ::attn_emu::state().reverse = reverse != 0;
}
