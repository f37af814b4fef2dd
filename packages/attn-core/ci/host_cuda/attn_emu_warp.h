// Warp collectives for the host build of the NVIDIA configuration (ci/host_emulation.py's
// `gated_delta_nvidia` library): the full-mask xor and up shuffles, ldmatrix (.x4, plain and
// .trans) and the m16n8k16 matrix instruction with 16-bit operands and fp32 sums, each computed
// for the whole warp at once by its last lane to arrive (attn_host_emulator.h). The kernel
// headers call these where the device build has inline PTX (attn_m16n8k16.cuh), so what the
// host checks is the kernels' fragment arithmetic: which lane holds which element, which rows a
// lane addresses.
//
// The matrix instruction's sums are exact products added in double and rounded once to fp32:
// the GPU's own order of fp32 additions differs in the last bits, far inside every tolerance
// the tests hold the kernels to.
#pragma once

#include <stdint.h>
#include <string.h>

#include <type_traits>

namespace attn_emu {

// What a collective's computation reads (every lane's words in) and writes (every lane's out).
using Operands = uint64_t (*)[kCollectiveIn];
using Results = uint64_t (*)[kCollectiveOut];

// The calling lane's part of a collective: its `in` words, then its `out` words once the whole
// warp has arrived and `compute(in[lane][word], out[lane][word])` has run once for all lanes.
template <class Compute>
inline void collective(const uint64_t* in, int n_in, uint64_t* out, int n_out, int line,
                       Compute compute) {
  State& s = state();
  Thread& t = s.threads[s.current];
  WarpExchange& w = s.warps[s.current / kWarp];
  const int lane = s.current % kWarp, parity = t.collectives++ & 1;
  const int n = static_cast<int>(s.threads.size()), w0 = s.current / kWarp * kWarp;
  const int lanes = n - w0 < kWarp ? n - w0 : kWarp;
  memcpy(w.in[parity][lane], in, sizeof(uint64_t) * n_in);
  if (++w.arrived[parity] == lanes) {  // the last lane: every operand is in
    w.arrived[parity] = 0;
    compute(w.in[parity], w.out[parity]);
  }
  yield_at(kAtCollective, line);
  memcpy(out, w.out[parity][lane], sizeof(uint64_t) * n_out);
}

template <class T>
inline uint64_t to_word(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "a register's value");
  uint64_t w = 0;
  memcpy(&w, &v, sizeof(T));
  return w;
}

template <class T>
inline T from_word(uint64_t w) {
  T v;
  memcpy(&v, &w, sizeof(T));
  return v;
}

// Lane l gets `v` of lane source(l).
template <class T, class Source>
inline T shuffle(T v, int line, Source source) {
  const uint64_t in = to_word(v);
  uint64_t out = 0;
  collective(&in, 1, &out, 1, line, [&](Operands i, Results o) {
    for (int l = 0; l < kWarp; ++l) o[l][0] = i[source(l)][0];
  });
  return from_word<T>(out);
}

// Four 8 x 8 matrices of 16-bit elements, lane l addressing row l % 8 of matrix l / 8; lane l
// gets word m: elements (l / 4, 2 (l % 4) .. + 1) of matrix m, or of its transpose (`trans`).
inline void ldmatrix_x4(const void* row, uint32_t (&r)[4], bool trans, int line) {
  const uint64_t in = reinterpret_cast<uintptr_t>(row);
  uint64_t out[4];
  collective(&in, 1, out, 4, line, [&](Operands i, Results o) {
    for (int l = 0; l < kWarp; ++l) {
      for (int m = 0; m < 4; ++m) {
        uint16_t e[2];
        for (int h = 0; h < 2; ++h) {
          const int rr = trans ? 2 * (l % 4) + h : l / 4, cc = trans ? l / 4 : 2 * (l % 4) + h;
          const char* base = reinterpret_cast<const char*>(i[8 * m + rr][0]);
          memcpy(&e[h], base + 2 * cc, 2);
        }
        o[l][m] = e[0] | static_cast<uint32_t>(e[1]) << 16;
      }
    }
  });
  for (int m = 0; m < 4; ++m) r[m] = static_cast<uint32_t>(out[m]);
}

inline float bits16_value(uint32_t bits, bool bf16) {
  if (bf16) {
    const uint32_t u = bits << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
  }
  const uint16_t h = static_cast<uint16_t>(bits);
  _Float16 f;
  memcpy(&f, &h, 2);
  return static_cast<float>(f);
}

// d += a . b for m16n8k16 fragments (attn_m16n8k16.cuh's layout), operands fp16 or bf16.
inline void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], bool bf16,
                         int line) {
  uint64_t in[kCollectiveIn], out[4];
  for (int k = 0; k < 4; ++k) in[k] = a[k];
  for (int k = 0; k < 2; ++k) in[4 + k] = b[k];
  for (int k = 0; k < 4; ++k) in[6 + k] = to_word(d[k]);
  collective(in, kCollectiveIn, out, 4, line, [&](Operands i, Results o) {
    float A[16][16], B[16][8];
    for (int l = 0; l < kWarp; ++l) {
      const int g = l / 4, t = l % 4;
      for (int h = 0; h < 2; ++h) {  // the word's low element, then its high one
        const auto elem = [&](uint64_t word) {
          return bits16_value(static_cast<uint32_t>(word >> (16 * h)) & 0xFFFFu, bf16);
        };
        A[g][2 * t + h] = elem(i[l][0]);
        A[g + 8][2 * t + h] = elem(i[l][1]);
        A[g][2 * t + 8 + h] = elem(i[l][2]);
        A[g + 8][2 * t + 8 + h] = elem(i[l][3]);
        B[2 * t + h][g] = elem(i[l][4]);
        B[2 * t + 8 + h][g] = elem(i[l][5]);
      }
    }
    for (int l = 0; l < kWarp; ++l) {
      for (int e = 0; e < 4; ++e) {
        const int row = l / 4 + 8 * (e / 2), col = 2 * (l % 4) + e % 2;
        double sum = from_word<float>(i[l][6 + e]);
        for (int k = 0; k < 16; ++k) sum += static_cast<double>(A[row][k]) * B[k][col];
        o[l][e] = to_word(static_cast<float>(sum));
      }
    }
  });
  for (int k = 0; k < 4; ++k) d[k] = from_word<float>(out[k]);
}

}  // namespace attn_emu

// CUDA's full-mask shuffles (the mask is not checked: every caller passes the whole warp).
template <class T>
inline T emu_shfl_xor_sync(unsigned /*mask*/, T v, int lane_mask, int line) {
  return ::attn_emu::shuffle(v, line, [&](int l) { return l ^ lane_mask; });
}
template <class T>
inline T emu_shfl_up_sync(unsigned /*mask*/, T v, unsigned delta, int line) {
  const int d = static_cast<int>(delta);
  return ::attn_emu::shuffle(v, line, [&](int l) { return l >= d ? l - d : l; });
}
#define __shfl_xor_sync(mask, v, m) emu_shfl_xor_sync(mask, v, m, __LINE__)
#define __shfl_up_sync(mask, v, d) emu_shfl_up_sync(mask, v, d, __LINE__)
