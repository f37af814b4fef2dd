// The chunk-parallel prefill for 16-bit inputs on the matrix unit (NVIDIA sm_80+: mma.sync
// m16n8k16, ldmatrix, asynchronous copies): chunk_prep16 writes each (chunk, value head) record
// in the input's 16-bit dtype (record16_* in gated_delta.cu), chunk_pass16 walks them. Included
// by gated_delta.cu inside namespace attn::gdn, after the pair's shared definitions (kPar,
// ChunkSegment, segment_seq, record16_*, invert_unit_lower) and attn_async.cuh /
// attn_m16n8k16.cuh (included at its top).
//
// The same WY/UT algorithm as the fp32 pair (chunk_prep, chunk_pass), each product one m16n8k16
// instruction a 16 x 8 x 16 tile with 16-bit operands and fp32 sums:
//     chunk_prep16:  A = strictly-lower(beta K K^T o D), P = (Q K^T o D) scaled, T = (I + A)^-1
//                    (fp32, on CUDA cores), W = T diag(beta e^G) K, U = T diag(beta) V
//     chunk_pass16:  X = [W; Qg] S;  V' = U - X[:64];  O = X[64:] + P V';
//                    S <- e^G_last S + Kd^T V'
// Rounded to 16 bits, as flash-linear-attention's kernels round them: T's scaled copies, the
// records (W, U, Qg, P, Kd^T), the state as the products read it, and V'. The state itself stays
// fp32 in accumulator fragments from a sequence's first chunk to its last. What that rounding
// costs is what the 16-bit state tolerance was measured for (docs/design/gated-delta-prefill.md);
// the fp32 pair keeps fp32 operands. K = 128 (a warp a 16-row tile of the state), V a multiple
// of 32 up to 128.
//
// chunk_pass16: grid (V / 32, HV, width), 8 warps. Warp w owns the state's key rows
// 16 w .. 16 w + 15 over the block's 32 value columns (four 16 x 8 accumulator tiles) and row
// tile w of X (warps 0-3: W's rows, then V'; warps 4-7: Qg's rows, then the outputs of tokens
// 16 (w - 4) ..). A chunk's record (72 KiB at K = V = 128: [W; Qg], P and Kd^T whole, U at the
// block's columns) streams into one of two shared stages by asynchronous copies issued a chunk
// ahead, so a chunk waits at two barriers only: V' written, then the state's copy and the next
// stage.
#pragma once

#if !defined(__ILUVATAR__)
#define ATTN_GDN_HAVE_PASS16 1

// Value columns a chunk_pass16 block: 32 gives one sequence of 32 value heads at V = 128 its
// 128 blocks, one an H100 SM. 64 columns (64 blocks, half the record bytes read in all, 189
// registers) was slower for one sequence and faster for eight: 32K 4.01 -> 4.78 ms, 128K
// 15.64 -> 18.61, 8 x 16K 17.75 -> 16.10 (the pair; H100, bench/linear_pair_tune.py --pair
// 16bit, three interleaved rounds).
constexpr int kSlice16 = 32;
constexpr int kNt16 = kSlice16 / 8;  // 16 x 8 accumulator tiles across a block's columns
static_assert(kSlice16 % 16 == 0, "pairs of column tiles");
constexpr int kMaxV16 = 128;      // chunk_prep16's value tile
constexpr int kPass16Warps = 8;
constexpr int kPass16Threads = kPass16Warps * 32;
constexpr int kPad16 = 8;         // elements a staged row is padded by: ldmatrix rows on 8 banks

// Element offsets of one stage and of the block's other buffers in dynamic shared memory.
template <int K>
struct Pass16Smem {
  static constexpr int kWqPitch = K + kPad16, kPPitch = kPar + kPad16, kKdPitch = kPar + kPad16;
  static constexpr int kUPitch = kSlice16 + kPad16, kStPitch = K + kPad16;
  static constexpr int kVtPitch = kPar + kPad16;
  static constexpr int kWq = 0;                            // [W; Qg] [2 kPar][K]
  static constexpr int kP = kWq + 2 * kPar * kWqPitch;     // P [kPar][kPar]
  static constexpr int kKd = kP + kPar * kPPitch;          // Kd^T [K][kPar]
  static constexpr int kU = kKd + K * kKdPitch;            // U [kPar][kSlice16]
  static constexpr int kStage = kU + kPar * kUPitch;
  static constexpr int kSt = 2 * kStage;                   // S^T [kSlice16][K], 16-bit
  static constexpr int kVt = kSt + kSlice16 * kStPitch;    // V'^T [kSlice16][kPar], 16-bit
  static constexpr int kElems = kVt + kSlice16 * kVtPitch;
  static constexpr int kBytes = 2 * kElems;
  static_assert(kStage % 8 == 0 && kSt % 8 == 0 && kVt % 8 == 0, "16-byte aligned buffers");
};

// Four 8 x 8 16-bit matrices from shared memory, lane l giving the address of row l % 8 of
// matrix l / 8 (ldmatrix).
ATTN_DEVICE void ldsm_x4(const uint16_t* p, uint32_t (&r)[4]) {
  m16n8k16::ldmatrix_x4<false>(p, r);
}

// The A operand (16 x 16, row major) at `tile`, rows `pitch` elements apart.
ATTN_DEVICE void load_a(const uint16_t* tile, int pitch, int lane, uint32_t (&a)[4]) {
  ldsm_x4(tile + (lane & 15) * pitch + (lane >> 4) * 8, a);
}

// The B operands (16 x 8, k along each stored row) of two column tiles: rows n .. n + 15 of a
// [n][k] buffer at `tile`: b[0], b[1] for columns n .. n + 7, b[2], b[3] for n + 8 ...
ATTN_DEVICE void load_b2(const uint16_t* tile, int pitch, int lane, uint32_t (&b)[4]) {
  ldsm_x4(tile + ((lane & 7) + ((lane >> 4) << 3)) * pitch + ((lane >> 3) & 1) * 8, b);
}

template <int QKIND>
ATTN_DEVICE float2 unpack16x2(uint32_t w) {
  return QKIND == kFloat16 ? half2_bits_to_float2(w)
                           : make_float2(bf16_bits_to_float(w & 0xFFFFu),
                                         bf16_bits_to_float(w >> 16));
}

template <int QKIND>
ATTN_DEVICE uint32_t pack16x2(float lo, float hi) {
  return static_cast<uint32_t>(to_bits16<QKIND>(lo)) |
         (static_cast<uint32_t>(to_bits16<QKIND>(hi)) << 16);
}

// The B operands of two column tiles from a row-major [k][n] buffer (transposed by ldmatrix):
// rows k .. k + 15, columns n .. n + 15 at `tile`; b[0], b[1] for columns n .., b[2], b[3] for
// n + 8 ...
ATTN_DEVICE void load_b2_trans(const uint16_t* tile, int pitch, int lane, uint32_t (&b)[4]) {
  m16n8k16::ldmatrix_x4<true>(tile + (lane & 15) * pitch + (lane >> 4) * 8, b);
}

template <int QKIND>
ATTN_DEVICE float bits16_to_float(uint32_t bits) {
  return QKIND == kFloat16 ? half_bits_to_float(bits) : bf16_bits_to_float(bits);
}

// ---------------------------------------------------------------------------- chunk_prep16
constexpr int kPrep16Threads = 256;  // 8 warps
static_assert(kPrep16Threads == kPrepThreads, "invert_unit_lower's threads, launch_pair's");

// chunk_prep16's dynamic shared memory: 16-bit tiles, then fp32 (89 KiB at K = 128: two blocks
// an H100 SM).
template <int K>
struct Prep16Smem {
  static constexpr int kInPitch = K + kPad16, kVPitch = kMaxV16 + kPad16, kTPitch = kPar + kPad16;
  static constexpr int kK = 0;                          // k [kPar][K], raw
  static constexpr int kQ = kK + kPar * kInPitch;       // q [kPar][K], raw
  static constexpr int kV = kQ + kPar * kInPitch;       // v [kPar][V], raw
  static constexpr int kTw = kV + kPar * kVPitch;       // T diag(beta e^G / |k|) [kPar][kPar]
  static constexpr int kTu = kTw + kPar * kTPitch;      // T diag(beta) [kPar][kPar]
  static constexpr int kFloat0 = (kTu + kPar * kTPitch) / 2;  // in floats from here
  static constexpr int kMat = kFloat0;                  // A^T, then T [kPar][kPar]
  static constexpr int kX = kMat + kPar * kPar;         // invert_unit_lower's scratch
  static constexpr int kVec = kX + 768;                 // six vectors of kPar
  static constexpr int kBytes = 4 * (kVec + 6 * kPar);
  static_assert((kTu + kPar * kTPitch) % 8 == 0, "the fp32 part 16-byte aligned");
};

// out[16 r .. 16 r + 15][columns c * width / 2 ..) = T [rows 16 r ..] B, T lower triangular
// ([kPar][kPar] at `t`, pitch Prep16Smem's kTPitch) and B [kPar][width] at `b`: one warp's half
// of a 16-row tile, stored in the 16-bit kind.
template <int QKIND>
ATTN_DEVICE void product_to_record(const uint16_t* t, int t_pitch, const uint16_t* b, int b_pitch,
                                   int width, uint16_t* out, int out_pitch, int r, int c,
                                   int lane) {
  uint32_t af[kPar / 16][4];
#pragma unroll
  for (int kk = 0; kk < kPar / 16; ++kk) {
    if (kk <= r) load_a(t + 16 * r * t_pitch + 16 * kk, t_pitch, lane, af[kk]);
  }
  const int g = lane / 4, t4 = lane % 4, half = width / 2;
  for (int n0 = c * half; n0 < (c + 1) * half; n0 += 16) {
    float acc[2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[j][i] = 0.f;
    }
#pragma unroll
    for (int kk = 0; kk < kPar / 16; ++kk) {
      if (kk <= r) {  // T is zero right of its diagonal tile
        uint32_t bf[4];
        load_b2_trans(b + 16 * kk * b_pitch + n0, b_pitch, lane, bf);
        m16n8k16::mma<QKIND>(acc[0], af[kk][0], af[kk][1], af[kk][2], af[kk][3], bf[0], bf[1]);
        m16n8k16::mma<QKIND>(acc[1], af[kk][0], af[kk][1], af[kk][2], af[kk][3], bf[2], bf[3]);
      }
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int row = 16 * r + g + 8 * hf, col = n0 + 8 * j + 2 * t4;
        *reinterpret_cast<uint32_t*>(out + row * out_pitch + col) =
            pack16x2<QKIND>(acc[j][2 * hf], acc[j][2 * hf + 1]);
      }
    }
  }
}

// Grid (HV, depth, width), kPrep16Threads threads: the 16-bit record of one chunk and value
// head. The chunk's k, q (key head) and v rows arrive by asynchronous copies, zeros past the
// sequence's end (so every record element is written, zeros included); the Gram products run
// on the matrix unit from them as they are (the l2 norms, betas and decays are scalars per row
// or column, applied to the fp32 sums); the solve is the fp32 pair's (invert_unit_lower); the
// W and U products take T with the betas and decays folded into its columns.
template <int K, int QKIND>
__global__ void __launch_bounds__(kPrep16Threads, 2)
    chunk_prep16(AttnGdnPrefillArgs a, ChunkSegment s) {
  static_assert(K % 16 == 0 && K <= 128, "16-row tiles of the keys");
  using L = Prep16Smem<K>;
  extern __shared__ __align__(16) uint16_t smem16[];
  float* const fsm = reinterpret_cast<float*>(smem16);
  float* const mat = fsm + L::kMat;
  float* const gcum = fsm + L::kVec;
  float* const inv_k = gcum + kPar;
  float* const inv_q = inv_k + kPar;
  float* const beta = inv_q + kPar;
  float* const wcoef = beta + kPar;  // beta e^G / |k|: W's column scale
  float* const kdec = wcoef + kPar;  // e^(G_last - G) / |k|: Kd's row scale
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int h = blockIdx.x, dp = blockIdx.y, z = blockIdx.z;
  const SegmentSeq sq = segment_seq(a, s, z);
  const int p = s.p0 + dp;
  if (p >= sq.chunks) return;
  const int64_t tok0 = sq.start + static_cast<int64_t>(p) * kPar;
  const int n = static_cast<int>(min(static_cast<int64_t>(kPar), sq.end - tok0));
  const int kh = h / (a.num_value_heads / a.num_heads);
  const int64_t rec_bytes = record16_bytes(K, a.head_v);
  const int64_t rec_at = (static_cast<int64_t>(z) * s.depth + dp) * a.num_value_heads + h;
  char* const rec_base = reinterpret_cast<char*>(a.workspace) + rec_at * rec_bytes;
  uint16_t* const rec = reinterpret_cast<uint16_t*>(rec_base);

  // 1. k, q and v rows into shared memory (zeros past n); gates and betas
  {
    const uint16_t* kin = static_cast<const uint16_t*>(a.k);
    const uint16_t* qin = static_cast<const uint16_t*>(a.q);
    const uint16_t* vin = static_cast<const uint16_t*>(a.v);
    constexpr int kRow = K / 8;  // 16-byte copies a row
    static_assert(kPar * kRow % kPrep16Threads == 0, "whole copies a thread");
#pragma unroll
    for (int m = 0; m < kPar * kRow / kPrep16Threads; ++m) {
      const int e = tid + kPrep16Threads * m, t = e / kRow, c = e % kRow;
      const bool live = t < n;
      const int64_t ka = live ? (tok0 + t) * a.k_tok_stride + kh * a.k_head_stride + 8 * c : 0;
      const int64_t qa = live ? (tok0 + t) * a.q_tok_stride + kh * a.q_head_stride + 8 * c : 0;
      copy16_zfill(smem16 + L::kK + t * L::kInPitch + 8 * c, kin + ka, live ? 16 : 0);
      copy16_zfill(smem16 + L::kQ + t * L::kInPitch + 8 * c, qin + qa, live ? 16 : 0);
    }
    const int v_row = a.head_v / 8;
    for (int e = tid; e < kPar * v_row; e += kPrep16Threads) {
      const int t = e / v_row, c = e % v_row;
      const bool live = t < n;
      const int64_t va = live ? (tok0 + t) * a.v_tok_stride + h * a.v_head_stride + 8 * c : 0;
      copy16_zfill(smem16 + L::kV + t * L::kVPitch + 8 * c, vin + va, live ? 16 : 0);
    }
    async_commit();
  }
  if (tid < kPar) {
    const bool live = tid < n;
    const int64_t ga = (tok0 + tid) * a.g_tok_stride + h * a.g_head_stride;
    const int64_t ba = (tok0 + tid) * a.beta_tok_stride + h * a.beta_head_stride;
    gcum[tid] = live ? load_any(a.g, ga, a.g_kind) : 0.f;
    beta[tid] = live ? load_any(a.beta, ba, a.beta_kind) : 0.f;
  }
  async_wait<0>();
  __syncthreads();

  // 2. the l2 norms (four lanes a token), the cumulative gates
  {
    const int t = tid / 4, part = tid % 4;
    const uint16_t* kr = smem16 + L::kK + t * L::kInPitch + part * (K / 4);
    const uint16_t* qr = smem16 + L::kQ + t * L::kInPitch + part * (K / 4);
    float kk = 0.f, qq = 0.f;
#pragma unroll
    for (int m = 0; m < K / 4; m += 2) {
      const float2 kv = unpack16x2<QKIND>(*reinterpret_cast<const uint32_t*>(kr + m));
      const float2 qv = unpack16x2<QKIND>(*reinterpret_cast<const uint32_t*>(qr + m));
      kk += kv.x * kv.x + kv.y * kv.y;
      qq += qv.x * qv.x + qv.y * qv.y;
    }
    kk += __shfl_xor_sync(0xffffffffu, kk, 1);
    kk += __shfl_xor_sync(0xffffffffu, kk, 2);
    qq += __shfl_xor_sync(0xffffffffu, qq, 1);
    qq += __shfl_xor_sync(0xffffffffu, qq, 2);
    if (part == 0) {
      inv_k[t] = a.l2norm ? 1.0f / sqrtf(kk + kL2Eps) : 1.0f;
      inv_q[t] = (a.l2norm ? 1.0f / sqrtf(qq + kL2Eps) : 1.0f) * a.scale;
    }
  }
  static_assert(kPar == 64, "two gates a lane");
  if (warp == 0) {  // the gates' running sum, two a lane, by shuffles
    const float g0 = gcum[2 * lane], g1 = gcum[2 * lane + 1];
    float run = g0 + g1;
#pragma unroll
    for (int off = 1; off < 32; off *= 2) {
      const float before = __shfl_up_sync(0xffffffffu, run, off);
      if (lane >= off) run += before;
    }
    gcum[2 * lane] = run - g1;
    gcum[2 * lane + 1] = run;
    if (lane == 31) *reinterpret_cast<float*>(rec_base + rec_bytes - 16) = expf(run);
  }
  __syncthreads();
  if (tid < kPar) {
    wcoef[tid] = beta[tid] * expf(gcum[tid]) * inv_k[tid];
    kdec[tid] = expf(gcum[kPar - 1] - gcum[tid]) * inv_k[tid];
  }

  // 3. K K^T and Q K^T: warp (r, c) rows 16 r .., columns 32 c ..
  const int r = warp % 4, c = warp / 4;
  float gk[4][4], gq[4][4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) gk[j][i] = gq[j][i] = 0.f;
  }
#pragma unroll
  for (int k0 = 0; k0 < K; k0 += 16) {
    uint32_t ak[4], aq[4], b01[4], b23[4];
    load_a(smem16 + L::kK + 16 * r * L::kInPitch + k0, L::kInPitch, lane, ak);
    load_a(smem16 + L::kQ + 16 * r * L::kInPitch + k0, L::kInPitch, lane, aq);
    load_b2(smem16 + L::kK + 32 * c * L::kInPitch + k0, L::kInPitch, lane, b01);
    load_b2(smem16 + L::kK + (32 * c + 16) * L::kInPitch + k0, L::kInPitch, lane, b23);
    m16n8k16::mma<QKIND>(gk[0], ak[0], ak[1], ak[2], ak[3], b01[0], b01[1]);
    m16n8k16::mma<QKIND>(gk[1], ak[0], ak[1], ak[2], ak[3], b01[2], b01[3]);
    m16n8k16::mma<QKIND>(gk[2], ak[0], ak[1], ak[2], ak[3], b23[0], b23[1]);
    m16n8k16::mma<QKIND>(gk[3], ak[0], ak[1], ak[2], ak[3], b23[2], b23[3]);
    m16n8k16::mma<QKIND>(gq[0], aq[0], aq[1], aq[2], aq[3], b01[0], b01[1]);
    m16n8k16::mma<QKIND>(gq[1], aq[0], aq[1], aq[2], aq[3], b01[2], b01[3]);
    m16n8k16::mma<QKIND>(gq[2], aq[0], aq[1], aq[2], aq[3], b23[0], b23[1]);
    m16n8k16::mma<QKIND>(gq[3], aq[0], aq[1], aq[2], aq[3], b23[2], b23[3]);
  }
  // 4. A^T above mat's diagonal (mat[u][t] = A[t][u], u < t); P [t][u] to the record
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int t = 16 * r + m16n8k16::c_row(lane, 2 * hf);
      const int u0 = 32 * c + 8 * j + m16n8k16::c_col(lane, 0);
      float pv[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int u = u0 + e;
        const float d = u <= t ? expf(gcum[t] - gcum[u]) : 0.f;
        if (u < t) mat[u * kPar + t] = beta[t] * d * inv_k[t] * inv_k[u] * gk[j][2 * hf + e];
        pv[e] = d * inv_q[t] * inv_k[u] * gq[j][2 * hf + e];
      }
      *reinterpret_cast<uint32_t*>(rec + record16_p(K) + t * kPar + u0) =
          pack16x2<QKIND>(pv[0], pv[1]);
    }
  }
  __syncthreads();  // A is whole

  // 5. T = (I + A)^-1, then its two scaled 16-bit copies (zero right of the diagonal)
  invert_unit_lower(mat, fsm + L::kX);
  // Qg [t][j] and Kd^T [j][t] to the record meanwhile: they need only the inputs and scalars
  for (int e = tid; e < kPar * K / 2; e += kPrep16Threads) {
    const int t = e / (K / 2), j = 2 * (e % (K / 2));
    const uint16_t* qr = smem16 + L::kQ + t * L::kInPitch + j;
    const float2 qv = unpack16x2<QKIND>(*reinterpret_cast<const uint32_t*>(qr));
    const float f = expf(gcum[t]) * inv_q[t];
    *reinterpret_cast<uint32_t*>(rec + (kPar + t) * K + j) = pack16x2<QKIND>(qv.x * f, qv.y * f);
  }
  for (int e = tid; e < K * kPar / 2; e += kPrep16Threads) {
    const int j = e / (kPar / 2), t = 2 * (e % (kPar / 2));
    const float k0 = bits16_to_float<QKIND>(smem16[L::kK + t * L::kInPitch + j]);
    const float k1 = bits16_to_float<QKIND>(smem16[L::kK + (t + 1) * L::kInPitch + j]);
    *reinterpret_cast<uint32_t*>(rec + record16_kdt(K) + j * kPar + t) =
        pack16x2<QKIND>(k0 * kdec[t], k1 * kdec[t + 1]);
  }
  __syncthreads();  // T is whole
  uint16_t* const tw = smem16 + L::kTw;
  uint16_t* const tu = smem16 + L::kTu;
  for (int e = tid; e < kPar * kPar / 2; e += kPrep16Threads) {
    const int t = e / (kPar / 2), s0 = 2 * (e % (kPar / 2));
    const float t0 = s0 <= t ? mat[t * kPar + s0] : 0.f;
    const float t1 = s0 + 1 <= t ? mat[t * kPar + s0 + 1] : 0.f;
    *reinterpret_cast<uint32_t*>(tw + t * L::kTPitch + s0) =
        pack16x2<QKIND>(t0 * wcoef[s0], t1 * wcoef[s0 + 1]);
    *reinterpret_cast<uint32_t*>(tu + t * L::kTPitch + s0) =
        pack16x2<QKIND>(t0 * beta[s0], t1 * beta[s0 + 1]);
  }
  __syncthreads();

  // 6. W = T diag(beta e^G / |k|) K and U = T diag(beta) V
  product_to_record<QKIND>(tw, L::kTPitch, smem16 + L::kK, L::kInPitch, K, rec, K, r, c, lane);
  product_to_record<QKIND>(tu, L::kTPitch, smem16 + L::kV, L::kVPitch, a.head_v,
                           rec + record16_u(K), a.head_v, r, c, lane);
}

// One chunk's record into a stage: [W; Qg], P and Kd^T whole, U's rows at columns col0 ...
template <int K>
ATTN_DEVICE void stage_record16(uint16_t* stage, const char* rec, int head_v, int col0) {
  using L = Pass16Smem<K>;
  const uint16_t* r = reinterpret_cast<const uint16_t*>(rec);
  const int tid = threadIdx.x;
  constexpr int kWqRow = K / 8, kRow64 = kPar / 8, kURow = kSlice16 / 8;  // 16-byte copies a row
  static_assert(2 * kPar * kWqRow % kPass16Threads == 0 && kPar * kRow64 % kPass16Threads == 0 &&
                    K * kRow64 % kPass16Threads == 0 && kPar * kURow % kPass16Threads == 0,
                "whole copies a thread");
#pragma unroll
  for (int m = 0; m < 2 * kPar * kWqRow / kPass16Threads; ++m) {
    const int e = tid + kPass16Threads * m, row = e / kWqRow, c = e % kWqRow;
    copy16(stage + L::kWq + row * L::kWqPitch + 8 * c, r + row * K + 8 * c);
  }
#pragma unroll
  for (int m = 0; m < kPar * kRow64 / kPass16Threads; ++m) {
    const int e = tid + kPass16Threads * m, row = e / kRow64, c = e % kRow64;
    copy16(stage + L::kP + row * L::kPPitch + 8 * c, r + record16_p(K) + row * kPar + 8 * c);
  }
#pragma unroll
  for (int m = 0; m < K * kRow64 / kPass16Threads; ++m) {
    const int e = tid + kPass16Threads * m, row = e / kRow64, c = e % kRow64;
    copy16(stage + L::kKd + row * L::kKdPitch + 8 * c, r + record16_kdt(K) + row * kPar + 8 * c);
  }
#pragma unroll
  for (int m = 0; m < kPar * kURow / kPass16Threads; ++m) {
    const int e = tid + kPass16Threads * m, row = e / kURow, c = e % kURow;
    copy16(stage + L::kU + row * L::kUPitch + 8 * c,
           r + record16_u(K) + static_cast<int64_t>(row) * head_v + col0 + 8 * c);
  }
  async_commit();
}

// acc[j] += A . B over the block's kNt16 column tiles, B [n][k] at `b` (rows n = the block's
// columns, k .. k + 15 along each row), A one 16 x 16 fragment.
template <int QKIND>
ATTN_DEVICE void mma_columns(float (&acc)[kNt16][4], const uint32_t (&af)[4], const uint16_t* b,
                             int pitch, int lane) {
#pragma unroll
  for (int np = 0; np < kNt16 / 2; ++np) {
    uint32_t bf[4];
    load_b2(b + 16 * np * pitch, pitch, lane, bf);
    m16n8k16::mma<QKIND>(acc[2 * np], af[0], af[1], af[2], af[3], bf[0], bf[1]);
    m16n8k16::mma<QKIND>(acc[2 * np + 1], af[0], af[1], af[2], af[3], bf[2], bf[3]);
  }
}

// Grid (V / kSlice16, HV, width): the block's K x 32 slice of the state walks the sequence's
// chunks [p0, p0 + depth), from the initial state (p0 == 0) or the final state (the previous
// segment left it there) to the final state, as chunk_pass does.
template <int K, int QKIND>
__global__ void __launch_bounds__(kPass16Threads, 1)
    chunk_pass16(AttnGdnPrefillArgs a, ChunkSegment s) {
  static_assert(K == 16 * kPass16Warps, "a warp a 16-row tile of the state");
  using L = Pass16Smem<K>;
  extern __shared__ __align__(16) uint16_t smem16[];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t4 = lane % 4;  // the accumulator's row and column pair (m16n8k16)
  const int h = blockIdx.y, z = blockIdx.z, col0 = blockIdx.x * kSlice16;
  const SegmentSeq sq = segment_seq(a, s, z);
  const int p_end = static_cast<int>(min(static_cast<int64_t>(s.p0 + s.depth), sq.chunks));
  if (s.p0 > 0 && s.p0 >= p_end) return;  // done: its state is in final_state already
  const int64_t rec_bytes = record16_bytes(K, a.head_v);
  const char* rec0 = reinterpret_cast<const char*>(a.workspace) +
                     (static_cast<int64_t>(z) * s.depth * a.num_value_heads + h) * rec_bytes;
  const int64_t rec_step = a.num_value_heads * rec_bytes;  // from chunk p to p + 1
  uint16_t* st = smem16 + L::kSt;
  uint16_t* vt = smem16 + L::kVt;

  // The state: rows 16 warp + g (+ 8), columns 8 j + 2 t4 (+ 1) of the block's slice.
  const float* from = s.p0 == 0 ? a.initial_state : a.final_state;
  const int64_t st_at =
      (static_cast<int64_t>(sq.seq) * a.num_value_heads + h) * K * a.head_v + col0;
  float sacc[kNt16][4];
#pragma unroll
  for (int j = 0; j < kNt16; ++j) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = 16 * warp + g + 8 * half, col = 8 * j + 2 * t4;
      const float2 v = from != nullptr
                           ? *reinterpret_cast<const float2*>(from + st_at + row * a.head_v + col)
                           : make_float2(0.f, 0.f);
      sacc[j][2 * half] = v.x;
      sacc[j][2 * half + 1] = v.y;
    }
  }
  // S^T's 16-bit copy, the operand of the next chunk's X
  const auto store_state_t = [&] {
#pragma unroll
    for (int j = 0; j < kNt16; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = 16 * warp + m16n8k16::c_row(lane, i);
        const int col = 8 * j + m16n8k16::c_col(lane, i);
        st[col * L::kStPitch + row] = to_bits16<QKIND>(sacc[j][i]);
      }
    }
  };
  store_state_t();
  if (s.p0 < p_end) stage_record16<K>(smem16, rec0, a.head_v, col0);
  async_wait<0>();
  __syncthreads();

  int buf = 0;
  for (int p = s.p0; p < p_end; ++p) {
    const char* rec = rec0 + (p - s.p0) * rec_step;
    const int64_t tok0 = sq.start + static_cast<int64_t>(p) * kPar;
    const int n = static_cast<int>(min(static_cast<int64_t>(kPar), sq.end - tok0));
    const float chunk_decay = *reinterpret_cast<const float*>(rec + rec_bytes - 16);
    if (p + 1 < p_end) {
      stage_record16<K>(smem16 + (buf ^ 1) * L::kStage, rec + rec_step, a.head_v, col0);
    }
    const uint16_t* sg = smem16 + buf * L::kStage;

    // 1. X, row tile `warp` of [W; Qg] S
    float x[kNt16][4];
#pragma unroll
    for (int j = 0; j < kNt16; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) x[j][i] = 0.f;
    }
#pragma unroll
    for (int k0 = 0; k0 < K; k0 += 16) {
      uint32_t af[4];
      load_a(sg + L::kWq + 16 * warp * L::kWqPitch + k0, L::kWqPitch, lane, af);
      mma_columns<QKIND>(x, af, st + k0, L::kStPitch, lane);
    }
    // 2. V' = U - W S (warps 0-3, tokens 16 warp ..) as V'^T, 16-bit
    if (warp < 4) {
#pragma unroll
      for (int j = 0; j < kNt16; ++j) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int t = 16 * warp + g + 8 * half, col = 8 * j + 2 * t4;
          const uint16_t* ur = sg + L::kU + t * L::kUPitch + col;
          const float2 u = unpack16x2<QKIND>(*reinterpret_cast<const uint32_t*>(ur));
          vt[col * L::kVtPitch + t] = to_bits16<QKIND>(u.x - x[j][2 * half]);
          vt[(col + 1) * L::kVtPitch + t] = to_bits16<QKIND>(u.y - x[j][2 * half + 1]);
        }
      }
    }
    __syncthreads();  // V' is whole; every warp has read S^T

    // 3. O = Qg S + P V' (warps 4-7, tokens 16 r ..): P is lower triangular, so k tiles <= r
    if (warp >= 4) {
      const int r = warp - 4;
#pragma unroll
      for (int kk = 0; kk < kPar / 16; ++kk) {
        if (kk <= r) {
          uint32_t af[4];
          load_a(sg + L::kP + 16 * r * L::kPPitch + 16 * kk, L::kPPitch, lane, af);
          mma_columns<QKIND>(x, af, vt + 16 * kk, L::kVtPitch, lane);
        }
      }
      uint16_t* out = static_cast<uint16_t*>(a.out);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int t = 16 * r + g + 8 * half;
        if (t < n) {
          const int64_t at = (tok0 + t) * a.out_tok_stride + h * a.out_head_stride + col0 + 2 * t4;
#pragma unroll
          for (int j = 0; j < kNt16; ++j) {
            out[at + 8 * j] = to_bits16<QKIND>(x[j][2 * half]);
            out[at + 8 * j + 1] = to_bits16<QKIND>(x[j][2 * half + 1]);
          }
        }
      }
    }
    // 4. S <- e^G_last S + Kd^T V' (every warp: its 16 key rows)
#pragma unroll
    for (int j = 0; j < kNt16; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) sacc[j][i] *= chunk_decay;
    }
#pragma unroll
    for (int kk = 0; kk < kPar / 16; ++kk) {
      uint32_t af[4];
      load_a(sg + L::kKd + 16 * warp * L::kKdPitch + 16 * kk, L::kKdPitch, lane, af);
      mma_columns<QKIND>(sacc, af, vt + 16 * kk, L::kVtPitch, lane);
    }
    store_state_t();
    async_wait<0>();  // the next chunk's stage
    __syncthreads();  // S^T whole, the stage landed, V'^T and this stage read
    buf ^= 1;
  }
  if (a.final_state != nullptr) {
#pragma unroll
    for (int j = 0; j < kNt16; ++j) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = 16 * warp + g + 8 * half, col = 8 * j + 2 * t4;
        *reinterpret_cast<float2*>(a.final_state + st_at + row * a.head_v + col) =
            make_float2(sacc[j][2 * half], sacc[j][2 * half + 1]);
      }
    }
  }
}

#endif  // !__ILUVATAR__
