// The m16n8k16 matrix instruction on register fragments: the level of the matrix-unit layer
// under wmma (attn_mma.cuh), for the paths that keep their operands in registers. Decode's
// matrix-unit body (decode_warp.cuh) feeds it straight from its cache loads; prefill's
// scores-in-registers path relies on wmma 16x16x16 being two of these (attn_mma.cuh,
// WmmaLayer). The instruction, warp shuffles and so the reductions are NVIDIA's (sm_80+); the
// layout arithmetic compiles everywhere.
//
// The fragment layout, known here only: lane l, g = l / 4, t = l % 4, holds
//   A (16 x 16, row major), four words of two 16-bit elements: a0 (row g, k 2t, 2t + 1),
//     a1 (row g + 8, same k), a2 (row g, k 2t + 8, 2t + 9), a3 (row g + 8, k 2t + 8, 2t + 9);
//   B (16 x 8, column major), two words: b0 (k 2t, 2t + 1 of column g), b1 (k 2t + 8, 2t + 9);
//   C (16 x 8, fp32), four floats: c[i] at (c_row(l, i), c_col(l, i)).
#pragma once

#include <stdint.h>

#include "attn_platform.cuh"

namespace attn {
namespace m16n8k16 {

// Row and column of accumulator element i (0..3) of lane `lane` (plain arithmetic, so CoreX
// builds compile the wmma layer's layout check too).
ATTN_DEVICE int c_row(int lane, int i) { return lane / 4 + 8 * (i / 2); }
ATTN_DEVICE int c_col(int lane, int i) { return 2 * (lane % 4) + i % 2; }

#if !defined(__ILUVATAR__)

// d += a . b, fp32 accumulate (sm_80+); QKIND: kFloat16 or kBFloat16 operands. The host build
// (ci/host_cuda, ATTN_HOST_EMULATION) computes the same fragments for the whole warp at once.
template <int QKIND>
ATTN_DEVICE void mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                     uint32_t b0, uint32_t b1) {
  static_assert(QKIND == kFloat16 || QKIND == kBFloat16, "16-bit operands");
#if defined(ATTN_HOST_EMULATION)
  ::attn_emu::mma_m16n8k16(d, {a0, a1, a2, a3}, {b0, b1}, QKIND == kBFloat16, __LINE__);
#else
  if constexpr (QKIND == kFloat16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
#endif
}

// Four 8 x 8 16-bit matrices from shared memory (ldmatrix .x4), lane l giving the address of
// row l % 8 of matrix l / 8; word m of lane l holds row l / 4, columns 2 (l % 4) .. + 1 of
// matrix m (kTrans: of its transpose).
template <bool kTrans>
ATTN_DEVICE void ldmatrix_x4(const void* row, uint32_t (&r)[4]) {
#if defined(ATTN_HOST_EMULATION)
  ::attn_emu::ldmatrix_x4(row, r, kTrans, __LINE__);
#else
  const uint32_t at = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
  }
#endif
}

// Over a row of C: the four lanes that share g (and so rows g and g + 8).
ATTN_DEVICE float row_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
ATTN_DEVICE float row_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Over a column of C: the eight lanes that share t (and so columns 2t and 2t + 1).
ATTN_DEVICE float col_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
}
ATTN_DEVICE float col_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 4);
  v += __shfl_xor_sync(0xffffffffu, v, 8);
  return v + __shfl_xor_sync(0xffffffffu, v, 16);
}
#endif  // !__ILUVATAR__

}  // namespace m16n8k16
}  // namespace attn
