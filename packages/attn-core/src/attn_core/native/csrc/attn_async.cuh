// 16-byte global -> shared copies that overlap with compute where the platform can.
//
// NVIDIA sm_80+: the CUDA runtime's pipeline primitives (cuda_pipeline.h, CUDA 11+; no inline
// PTX): copies are issued, grouped by commit(), and waited for by wait<N>() (all but the N most
// recent groups complete). CoreX exposes no asynchronous copy (DESIGN.md), so there each copy
// is a plain load and store, complete when it returns, and commit / wait do nothing.
#pragma once

#include "attn_platform.cuh"

#if !defined(__ILUVATAR__)
#include <cuda_pipeline.h>
#define ATTN_ASYNC_COPY 1
#endif

namespace attn {

// dst <- the first `valid` bytes of src, the rest zero (valid in 0..16; src 16-byte aligned
// and readable for `valid` bytes).
ATTN_DEVICE void copy16_zfill(void* dst, const void* src, int valid) {
#if defined(ATTN_ASYNC_COPY)
  __pipeline_memcpy_async(dst, src, 16, 16 - valid);
#else
  Vec16 v = {{0u, 0u, 0u, 0u}};
  if (valid > 0) v = load_vec<Vec16>(src);
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const int keep = valid - 4 * w;  // bytes of this word to keep
    if (keep <= 0) v.w[w] = 0u;
    else if (keep < 4) v.w[w] &= (1u << (8 * keep)) - 1u;
  }
  *reinterpret_cast<Vec16*>(dst) = v;
#endif
}

ATTN_DEVICE void copy16(void* dst, const void* src) { copy16_zfill(dst, src, 16); }

// dst <- the first `valid` bytes of 8 at src, the rest zero (valid in 0..8; both 8-byte
// aligned): the fp8 value copies of caches whose pages hold 8 tokens.
ATTN_DEVICE void copy8_zfill(void* dst, const void* src, int valid) {
#if defined(ATTN_ASYNC_COPY)
  __pipeline_memcpy_async(dst, src, 8, 8 - valid);
#else
  Vec8 v = {{0u, 0u}};
  if (valid > 0) v = load_vec<Vec8>(src);
#pragma unroll
  for (int w = 0; w < 2; ++w) {
    const int keep = valid - 4 * w;
    if (keep <= 0) v.w[w] = 0u;
    else if (keep < 4) v.w[w] &= (1u << (8 * keep)) - 1u;
  }
  *reinterpret_cast<Vec8*>(dst) = v;
#endif
}

ATTN_DEVICE void async_commit() {
#if defined(ATTN_ASYNC_COPY)
  __pipeline_commit();
#endif
}

template <int PENDING>
ATTN_DEVICE void async_wait() {
#if defined(ATTN_ASYNC_COPY)
  __pipeline_wait_prior(PENDING);
#endif
}

}  // namespace attn
