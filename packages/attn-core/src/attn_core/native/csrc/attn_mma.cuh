// The matrix-tile layer of the prefill kernel: S = Q K^T and O += P V on one block's tiles in
// shared memory, in one of three implementations chosen at compile time (MmaKind, ABI-visible).
// The register level under it (m16n8k16 on register fragments, NVIDIA) is attn_m16n8k16.cuh,
// which decode's matrix-unit body uses too:
//
// - kMmaWmma: `nvcuda::wmma` 16x16x16, fp16/bf16 in, fp32 accumulate (NVIDIA, sm_80+).
// - kMmaCorexWmma: CoreX's `wmma` (compiled only under __ILUVATAR__ when <mma.h> exists).
//   Public ports describe fp16 fragments m16n16k32 / m32n32k16 / m16n32k32 / m32n16k32 with
//   fp32 accumulate and no m16n16k16; this uses m16n16k32. Unverified: the lab's device-facts
//   suite is its first compile and run, and a plan uses it only after the float64 check.
// - kMmaFma: CUDA-core fp32 FMAs with an explicit thread mapping; always builds.
//
// Shared-memory tiles (16-bit elements stored as raw bits, pitches from TileCfg):
//   Q [M][QP]   rows = GQA-packed query rows, columns = head dims (zero past head_size)
//   K [N][QP]   one key per row (zero past head_size and for masked keys)
//   Vt[DM][VP]  transposed values: one head dim per row, keys along the row
//   S [M][SP]   fp32 scores; the FMA layer reads its probabilities back from here
//   P [M][PP]   16-bit probabilities (the wmma layers' A operand of P V)
// Accumulator ownership differs per layer; every layer exposes it through rescale() and
// for_each(), so the kernel's shared-memory paths never depend on a fragment's register
// layout: the wmma layers learn each element's row and column once by loading an index matrix
// into a fragment of the same type (a fragment's element mapping is fixed per type). The one
// path that does depend on it (scores in registers, NVIDIA wmma) checks it the same way.
#pragma once

#include <type_traits>

#include "attn_m16n8k16.cuh"
#include "attn_platform.cuh"

#if !defined(__ILUVATAR__)
#include <cuda_bf16.h>
#include <mma.h>
#define ATTN_HAVE_NV_WMMA 1
#elif defined(__has_include)
#if __has_include(<mma.h>)
#include <mma.h>
#define ATTN_HAVE_COREX_WMMA 1
#endif
#endif

// Orders one warp's shared-memory writes before its fragment loads. CoreX's warp-level
// primitive is not documented publicly; a block barrier is right there because every thread
// of the block calls these layer functions together.
#if defined(__ILUVATAR__)
#define ATTN_WARP_SYNC() __syncthreads()
#else
#define ATTN_WARP_SYNC() __syncwarp()
#endif

#ifndef ATTN_QK_UNROLL
#define ATTN_QK_UNROLL 2  // k steps of S = Q K^T unrolled together (wmma layers)
#endif

namespace attn {

enum MmaKind : int { kMmaFma = 0, kMmaWmma = 1, kMmaCorexWmma = 2 };

constexpr int kQkUnroll = ATTN_QK_UNROLL;

// Tile geometry: M query rows x N keys per tile, head bucket DM, WARPS warps of the hardware's
// width; QK_WR / PV_WR: warp-grid rows of the S and O products (columns = WARPS / rows).
template <int M_, int N_, int DM_, int WARPS_, int QK_WR_, int PV_WR_, bool SHARED_KV_,
          int VSKEW_ = 8>
struct TileCfg {
  static constexpr int M = M_, N = N_, DM = DM_, WARPS = WARPS_;
  static constexpr int T = WARPS * ATTN_HW_WARP_SIZE;
  static constexpr int QK_WR = QK_WR_, QK_WC = WARPS / QK_WR_;
  static constexpr int PV_WR = PV_WR_, PV_WC = WARPS / PV_WR_;
  static constexpr bool SHARED_KV = SHARED_KV_;  // K and V take turns in one buffer
  static constexpr int QP = DM + 8;  // +16 B per row: consecutive rows start on other banks
  static constexpr int VP = N + VSKEW_;  // VSKEW 0 only where 32 KiB needs the bytes
  static constexpr int SP = N + 4;  // fp32 rows: wmma needs a multiple of 4
  static constexpr int PP = N + 8;
  static_assert(M % 16 == 0 && N % 16 == 0 && DM % 16 == 0, "16-multiples");
  static_assert(WARPS % QK_WR == 0 && WARPS % PV_WR == 0, "warp grids");
};

// -------------------------------------------------------------------- CUDA-core FMA layer
// S: thread (rg, cg) owns rows rg + (M/4) * i (i < 4) and columns cg + CG * j (j < NJ);
// interleaved so a warp's K reads fall on distinct banks and its Q reads broadcast.
// O: thread (rg, cg) owns rows rg + (M/8) * i (i < 8) and head dims cg + TC * j (j < DJ).
template <int QKIND, class C>
struct FmaLayer {
  static constexpr int kQRows = 4, kQG = C::M / kQRows, kCG = C::T / kQG, kNJ = C::N / kCG;
  static constexpr int kORows = 8, kOG = C::M / kORows, kTC = C::T / kOG, kDJ = C::DM / kTC;
  static_assert(C::T % kQG == 0 && C::N % kCG == 0, "S thread grid");
  static_assert(C::T % kOG == 0 && C::DM % kTC == 0 && kDJ >= 1, "O thread grid");
  static constexpr bool kWantsP16 = false;
  static constexpr bool kScoresInRegs = false;

  struct Acc {
    float v[kORows][kDJ];
  };

  static ATTN_DEVICE float2 pair(const uint16_t* p) {  // two consecutive elements
    const uint32_t w = *reinterpret_cast<const uint32_t*>(p);
    if (QKIND == kFloat16) return half2_to_f2(w);
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xFFFF0000u));
  }
  static ATTN_DEVICE float2 half2_to_f2(uint32_t w) {
    __half2 h;
    *reinterpret_cast<uint32_t*>(&h) = w;
    return __half22float2(h);
  }

  static ATTN_DEVICE void qk(float* S, const uint16_t* Q, const uint16_t* K, int tid) {
    const int rg = tid / kCG, cg = tid % kCG;
    float s[kQRows][kNJ];
#pragma unroll
    for (int i = 0; i < kQRows; ++i)
#pragma unroll
      for (int j = 0; j < kNJ; ++j) s[i][j] = 0.0f;
#pragma unroll 2
    for (int d = 0; d < C::DM; d += 2) {
      float2 q[kQRows], k[kNJ];
#pragma unroll
      for (int i = 0; i < kQRows; ++i) q[i] = pair(Q + (rg + kQG * i) * C::QP + d);
#pragma unroll
      for (int j = 0; j < kNJ; ++j) k[j] = pair(K + (cg + kCG * j) * C::QP + d);
#pragma unroll
      for (int i = 0; i < kQRows; ++i)
#pragma unroll
        for (int j = 0; j < kNJ; ++j) s[i][j] = fmaf(q[i].y, k[j].y, fmaf(q[i].x, k[j].x, s[i][j]));
    }
#pragma unroll
    for (int i = 0; i < kQRows; ++i)
#pragma unroll
      for (int j = 0; j < kNJ; ++j) S[(rg + kQG * i) * C::SP + cg + kCG * j] = s[i][j];
  }

  static ATTN_DEVICE void zero(Acc& a, float* /*scratch*/, int /*tid*/) {
#pragma unroll
    for (int i = 0; i < kORows; ++i)
#pragma unroll
      for (int j = 0; j < kDJ; ++j) a.v[i][j] = 0.0f;
  }

  // O[r] *= alpha[r]; then O += P V with P read from S (fp32) and V from Vt.
  static ATTN_DEVICE void rescale_pv(Acc& a, const float* alpha, const float* S,
                                     const uint16_t* /*P*/, const uint16_t* Vt, int tid) {
    const int rg = tid / kTC, cg = tid % kTC;
#pragma unroll
    for (int i = 0; i < kORows; ++i) {
      const float al = alpha[rg + kOG * i];
#pragma unroll
      for (int j = 0; j < kDJ; ++j) a.v[i][j] *= al;
    }
#pragma unroll 1  // unrolled twice, 16 bytes spilled at 128 registers (bf16, head 256)
    for (int n = 0; n < C::N; n += 2) {
      float2 p[kORows], v[kDJ];
#pragma unroll
      for (int i = 0; i < kORows; ++i)
        p[i] = *reinterpret_cast<const float2*>(S + (rg + kOG * i) * C::SP + n);
#pragma unroll
      for (int j = 0; j < kDJ; ++j) v[j] = pair(Vt + (cg + kTC * j) * C::VP + n);
#pragma unroll
      for (int i = 0; i < kORows; ++i)
#pragma unroll
        for (int j = 0; j < kDJ; ++j)
          a.v[i][j] = fmaf(p[i].y, v[j].y, fmaf(p[i].x, v[j].x, a.v[i][j]));
    }
  }

  // f(row, col, value) for every accumulator element this thread owns.
  template <class F>
  static ATTN_DEVICE void for_each(const Acc& a, int tid, float* /*scratch*/, F&& f) {
    const int rg = tid / kTC, cg = tid % kTC;
#pragma unroll
    for (int i = 0; i < kORows; ++i)
#pragma unroll
      for (int j = 0; j < kDJ; ++j) f(rg + kOG * i, cg + kTC * j, a.v[i][j]);
  }
};

// -------------------------------------------------------------------- wmma layers
#if defined(ATTN_HAVE_NV_WMMA) || defined(ATTN_HAVE_COREX_WMMA)
template <int QKIND>
struct WmmaElem;
template <>
struct WmmaElem<kFloat16> {
  using T = __half;
};
#if defined(ATTN_HAVE_NV_WMMA)
template <>
struct WmmaElem<kBFloat16> {
  using T = __nv_bfloat16;
};
#endif

// FM x FN x FK fragments. S: warp (wr, wc) owns fragment rows wr * QF_R + i, columns
// wc * QF_C + j. O: warp (wr, wc) owns fragment rows wr * PF_R + i, columns wc * PF_C + j.
//
// Scores in registers (kScoresInRegs: NVIDIA wmma 16x16x16 on 32-lane warps, each warp owning
// one fragment row of S and of O): S stays in its accumulator fragments, the kernel's softmax
// works on them, and the probabilities become P V's A fragments in registers, with no round
// trip through shared memory. That needs the fragments' element layout, which wmma leaves
// unspecified. sm_80 to sm_90 lower this shape to two m16n8k16 MMAs and keep that
// instruction's layout (probed on the H200): element t < 8 of lane l, in an
// accumulator or a row-major A fragment, is at row l / 4 + 8 ((t / 2) % 2), column
// 2 (l % 4) + t % 2 + 8 (t / 4); a 16-bit A fragment's elements 8..15 repeat 0..7. zero()
// checks this against index matrices loaded into both fragment types, and a thread whose
// fragments differ writes NaN (for_each): the float64 check then refuses the library instead
// of it returning wrong numbers.
template <int QKIND, class C, int FK>
struct WmmaLayer {
  static constexpr int FM = 16, FN = 16;
  static constexpr int QF_R = C::M / FM / C::QK_WR, QF_C = C::N / FN / C::QK_WC;
  static constexpr int PF_R = C::M / FM / C::PV_WR, PF_C = C::DM / FN / C::PV_WC;
  static_assert(QF_R >= 1 && QF_C >= 1 && PF_R >= 1 && PF_C >= 1, "warp grid too wide");
  static_assert(C::DM % FK == 0 && C::N % FK == 0, "k depth");
  static constexpr bool kWantsP16 = true;
  using E = typename WmmaElem<QKIND>::T;
  using FragA = nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, FM, FN, FK, E,
                                       nvcuda::wmma::row_major>;
  using FragB = nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, FM, FN, FK, E,
                                       nvcuda::wmma::col_major>;
  using FragC = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, FM, FN, FK, float>;
  static constexpr int kElems = FragC::num_elements;
#if defined(ATTN_HAVE_NV_WMMA)
  static constexpr bool kScoresInRegs = FK == 16 && ATTN_HW_WARP_SIZE == 32 && kElems == 8 &&
                                        QF_R == 1 && PF_R == 1 && C::QK_WC == 1 &&
                                        C::PV_WC == 1 && C::WARPS * FM == C::M;
#else
  static constexpr bool kScoresInRegs = false;
#endif

  static_assert(kElems <= 8, "rows are packed 4 bits per element in one word");
  struct Acc {
    FragC c[PF_R][PF_C];
    // each element's row inside its 16 x 16 fragment, 4 bits per element: eight separate ints
    // spilled at 128 registers (16 warps, head 256; ptxas sm_90: up to 444 bytes)
    uint32_t rows;
    bool layout_ok;  // kScoresInRegs: the fragments have the layout the register path assumes
    ATTN_DEVICE int row(int t) const { return (rows >> (4 * t)) & 15u; }
  };
  struct Scores {  // kScoresInRegs: this warp's 16 rows of S, then of P (fp32)
    FragC s[QF_R][QF_C];
  };

  // kScoresInRegs: row and column of element t of lane `lane`'s fragment in its 16 x 16 tile
  // (two m16n8k16 accumulators side by side).
  static ATTN_DEVICE int frag_row(int lane, int t) { return m16n8k16::c_row(lane, t % 4); }
  static ATTN_DEVICE int frag_col(int lane, int t) {
    return m16n8k16::c_col(lane, t % 4) + 8 * (t / 4);
  }
#if defined(ATTN_HAVE_NV_WMMA)
  // kScoresInRegs: the maximum / sum over the four lanes that hold the same two rows.
  static ATTN_DEVICE float quad_max(float v) { return m16n8k16::row_max(v); }
  static ATTN_DEVICE float quad_sum(float v) { return m16n8k16::row_sum(v); }
#endif

  static ATTN_DEVICE const E* e(const uint16_t* p) { return reinterpret_cast<const E*>(p); }

  struct NoHook {
    ATTN_DEVICE void operator()(int /*step*/) const {}
  };

  // This warp's fragments of S = Q K^T; hook(step) runs before each k step's fragment loads
  // (the kernel issues tile copies there, a few per step; rescale_pv_regs has the same hook,
  // before each of its PV_C x QF_C products).
  template <class Hook = NoHook>
  static ATTN_DEVICE void qk_frags(FragC (&s)[QF_R][QF_C], const uint16_t* Q, const uint16_t* K,
                                   int tid, const Hook& hook = Hook()) {
    const int warp = tid / ATTN_HW_WARP_SIZE;
    const int r0 = (warp / C::QK_WC) * QF_R, c0 = (warp % C::QK_WC) * QF_C;
#pragma unroll
    for (int i = 0; i < QF_R; ++i)
#pragma unroll
      for (int j = 0; j < QF_C; ++j) nvcuda::wmma::fill_fragment(s[i][j], 0.0f);
#pragma unroll kQkUnroll
    for (int k = 0; k < C::DM; k += FK) {
      hook(k / FK);
      FragA a[QF_R];
      FragB b[QF_C];
#pragma unroll
      for (int i = 0; i < QF_R; ++i)
        nvcuda::wmma::load_matrix_sync(a[i], e(Q + (r0 + i) * FM * C::QP + k), C::QP);
#pragma unroll
      for (int j = 0; j < QF_C; ++j)  // B(k = dim, n = key) = K[key][dim]: column-major
        nvcuda::wmma::load_matrix_sync(b[j], e(K + (c0 + j) * FN * C::QP + k), C::QP);
#pragma unroll
      for (int i = 0; i < QF_R; ++i)
#pragma unroll
        for (int j = 0; j < QF_C; ++j) nvcuda::wmma::mma_sync(s[i][j], a[i], b[j], s[i][j]);
    }
  }

  static ATTN_DEVICE void qk(float* S, const uint16_t* Q, const uint16_t* K, int tid) {
    const int warp = tid / ATTN_HW_WARP_SIZE;
    const int r0 = (warp / C::QK_WC) * QF_R, c0 = (warp % C::QK_WC) * QF_C;
    FragC s[QF_R][QF_C];
    qk_frags(s, Q, K, tid);
#pragma unroll
    for (int i = 0; i < QF_R; ++i)
#pragma unroll
      for (int j = 0; j < QF_C; ++j)
        nvcuda::wmma::store_matrix_sync(S + (r0 + i) * FM * C::SP + (c0 + j) * FN, s[i][j], C::SP,
                                        nvcuda::wmma::mem_row_major);
  }

  // Zero the accumulators and learn the element -> row mapping from an index matrix in
  // `scratch` (16 x 16 fp32, this warp's own; element (r, c) holds 16 r + c). kScoresInRegs:
  // also check both fragment types against the layout that path assumes (the A fragment's
  // index matrix in 16-bit elements: 0..255 are exact in fp16 and bf16).
  static ATTN_DEVICE void zero(Acc& a, float* scratch, int tid) {
    const int lane = tid % ATTN_HW_WARP_SIZE;
    scratch += (tid / ATTN_HW_WARP_SIZE) * FM * FN;
    for (int i = lane; i < FM * FN; i += ATTN_HW_WARP_SIZE) scratch[i] = static_cast<float>(i);
    ATTN_WARP_SYNC();
    FragC idx;
    nvcuda::wmma::load_matrix_sync(idx, scratch, FN, nvcuda::wmma::mem_row_major);
    a.rows = 0u;
    bool ok = true;
#pragma unroll
    for (int t = 0; t < kElems; ++t) {
      const int v = static_cast<int>(idx.x[t]);
      a.rows |= static_cast<uint32_t>(v / FN) << (4 * t);
      ok = ok && v == frag_row(lane, t) * FN + frag_col(lane, t);
    }
    ATTN_WARP_SYNC();
    if constexpr (kScoresInRegs) {
      E* idx16 = reinterpret_cast<E*>(scratch);
      for (int i = lane; i < FM * FN; i += ATTN_HW_WARP_SIZE)
        idx16[i] = static_cast<E>(static_cast<float>(i));
      ATTN_WARP_SYNC();
      FragA ia;
      nvcuda::wmma::load_matrix_sync(ia, idx16, FN);
#pragma unroll
      for (int t = 0; t < FragA::num_elements; ++t)
        ok = ok && static_cast<int>(static_cast<float>(ia.x[t])) ==
                       frag_row(lane, t % 8) * FN + frag_col(lane, t % 8);
      ATTN_WARP_SYNC();
    }
    a.layout_ok = ok || !kScoresInRegs;
#pragma unroll
    for (int i = 0; i < PF_R; ++i)
#pragma unroll
      for (int j = 0; j < PF_C; ++j) nvcuda::wmma::fill_fragment(a.c[i][j], 0.0f);
  }

  static ATTN_DEVICE void rescale_pv(Acc& a, const float* alpha, const float* /*S*/,
                                     const uint16_t* P, const uint16_t* Vt, int tid) {
    const int warp = tid / ATTN_HW_WARP_SIZE;
    const int r0 = (warp / C::PV_WC) * PF_R, c0 = (warp % C::PV_WC) * PF_C;
#pragma unroll
    for (int i = 0; i < PF_R; ++i) {
      float al[kElems];
      bool same = true;  // a row whose maximum did not move has alpha exactly 1 (exp2f(0))
#pragma unroll
      for (int t = 0; t < kElems; ++t) {
        al[t] = alpha[(r0 + i) * FM + a.row(t)];
        same = same && al[t] == 1.0f;
      }
      if (same) continue;  // most tiles past the first few, once the row maxima settle
#pragma unroll
      for (int j = 0; j < PF_C; ++j)
#pragma unroll
        for (int t = 0; t < kElems; ++t) a.c[i][j].x[t] *= al[t];
    }
    // one V fragment live at a time: with 128 accumulator registers (head 256) a whole row
    // of V fragments spilled (ptxas, sm_90: 152-248 bytes at the 32 KiB config)
#pragma unroll 1
    for (int k = 0; k < C::N; k += FK) {
      FragA p[PF_R];
#pragma unroll
      for (int i = 0; i < PF_R; ++i)
        nvcuda::wmma::load_matrix_sync(p[i], e(P + (r0 + i) * FM * C::PP + k), C::PP);
#pragma unroll
      for (int j = 0; j < PF_C; ++j) {
        FragB v;  // B(k = key, n = dim) = Vt[dim][key]: column-major
        nvcuda::wmma::load_matrix_sync(v, e(Vt + (c0 + j) * FN * C::VP + k), C::VP);
#pragma unroll
        for (int i = 0; i < PF_R; ++i) nvcuda::wmma::mma_sync(a.c[i][j], p[i], v, a.c[i][j]);
      }
    }
  }

  // kScoresInRegs: O *= al[h] on each row (h = 0: the fragment's rows 0..7 of this lane, 1: rows
  // 8..15), then O += P V with the probabilities in `sc` (fp32) converted to A fragments in
  // registers.
  template <class Hook = NoHook>
  static ATTN_DEVICE void rescale_pv_regs(Acc& a, const float (&al)[2], const Scores& sc,
                                          const uint16_t* Vt, const Hook& hook = Hook()) {
    if (al[0] != 1.0f || al[1] != 1.0f) {  // both 1: neither row's maximum moved
#pragma unroll
      for (int j = 0; j < PF_C; ++j)
#pragma unroll
        for (int t = 0; t < kElems; ++t) a.c[0][j].x[t] *= al[(t / 2) % 2];
    }
#pragma unroll
    for (int k = 0; k < QF_C; ++k) {
      FragA p;
#pragma unroll
      for (int t = 0; t < FragA::num_elements; ++t) p.x[t] = static_cast<E>(sc.s[0][k].x[t % 8]);
#pragma unroll
      for (int j = 0; j < PF_C; ++j) {
        hook(k * PF_C + j);
        FragB v;  // B(k = key, n = dim) = Vt[dim][key]: column-major
        nvcuda::wmma::load_matrix_sync(v, e(Vt + j * FN * C::VP + k * FK), C::VP);
        nvcuda::wmma::mma_sync(a.c[0][j], p, v, a.c[0][j]);
      }
    }
  }

  // f(row, col, value) for every element of this warp's fragments; columns are learned the
  // same way as rows, through this warp's scratch tile.
  template <class F>
  static ATTN_DEVICE void for_each(const Acc& a, int tid, float* scratch, F&& f) {
    const int warp = tid / ATTN_HW_WARP_SIZE, lane = tid % ATTN_HW_WARP_SIZE;
    const int r0 = (warp / C::PV_WC) * PF_R, c0 = (warp % C::PV_WC) * PF_C;
    scratch += warp * FM * FN;
    for (int i = lane; i < FM * FN; i += ATTN_HW_WARP_SIZE) scratch[i] = static_cast<float>(i % FN);
    ATTN_WARP_SYNC();
    FragC idx;
    nvcuda::wmma::load_matrix_sync(idx, scratch, FN, nvcuda::wmma::mem_row_major);
#pragma unroll
    for (int i = 0; i < PF_R; ++i)
#pragma unroll
      for (int j = 0; j < PF_C; ++j)
#pragma unroll
        for (int t = 0; t < kElems; ++t)
          f((r0 + i) * FM + a.row(t), (c0 + j) * FN + static_cast<int>(idx.x[t]),
            a.layout_ok ? a.c[i][j].x[t] : __int_as_float(0x7fc00000));  // NaN: see above
  }
};
#endif

// The layer for an MmaKind; `void` where the platform lacks it (the kernel is then not built).
template <int MMA, int QKIND, class C>
struct MmaSelect {
  using type = void;
};
template <int QKIND, class C>
struct MmaSelect<kMmaFma, QKIND, C> {
  using type = FmaLayer<QKIND, C>;
};
#if defined(ATTN_HAVE_NV_WMMA)
template <int QKIND, class C>
struct MmaSelect<kMmaWmma, QKIND, C> {
  using type = WmmaLayer<QKIND, C, 16>;
};
#endif
#if defined(ATTN_HAVE_COREX_WMMA)
template <class C>
struct MmaSelect<kMmaCorexWmma, kFloat16, C> {  // fp16 only; no m16n16k16 on CoreX
  using type = typename std::conditional<C::N % 32 == 0, WmmaLayer<kFloat16, C, 32>, void>::type;
};
#endif

}  // namespace attn
