// Gated DeltaNet (the hybrid model's linear-attention layers): the recurrent decode step on a
// state pool, the prefill in chunks and token by token, and the width-4 depthwise causal
// convolution before them, decode and varlen prefill.
//
// Decode step, per (sequence, value head h, key head h / (HV / H)), fp32 state S [K, V]:
//     S <- S * exp(g);  delta = beta * (v - S^T k);  S <- S + k delta^T;  o = S^T (q * scale)
// computed as o = scale * (S_dec^T q + (q . k) delta), so every state element is read once and
// written once (the step is a pure stream of the pool: 64 KiB per head at K = V = 128).
// Grid (V / 32 value slices, HV / heads_per_block, N): one sequence of 32 value heads at V = 128
// is 128 blocks, about one per H100 SM (a step at batch 8 and 64 runs within 1.1x / 1.2x of
// reading and writing the states once: docs/benchmarks.md#gated-deltanet); a block of 128
// threads is 4 row groups x 32 value columns, each thread holding K / 4 rows of its column in
// registers (32 floats at K = 128, a compile-time count: K is a template parameter, 64 or 128).
// S^T k and S^T q are summed over the row groups through shared memory, never warp shuffles:
// CoreX warps are 64 lanes (attn_platform.cuh). heads_per_block value heads of one key head
// share the key and query loads and their norms; the reduction buffer alternates by head
// parity, so each head costs one barrier. l2 normalisation is a scalar per vector, so it is
// folded in after the reduction (S^T k_hat = |k|^-1 S^T k) and the raw k and q are what shared
// memory holds.
//
// Prefill, chunked (chunk_gated_delta_rule, 16-token chunks in the WY/UT form) and token by
// token (fused_recurrent_gated_delta_rule): the same mapping, one block per (V slice, value
// head, sequence) walking its sequence with the state in registers, read from the initial state
// once and written to the final state once (no transient device memory). chunk_gated_delta_rule
// also has a chunk-parallel form (chunk_prep, chunk_pass: 64-token chunks through a workspace),
// which serves where the fused kernel's grid would leave SMs idle (attn_core/native/split.py).
//
// Convolution, width W = 4 (the model's; other widths take the torch path): one thread per
// (sequence, channel) for the update, sliding its W - 1 inputs in registers over the new tokens;
// for prefill one thread per (channel, 16-token tile) for the outputs, then a second kernel
// writes each sequence's last W - 1 inputs to its state slot. Two kernels because the state is
// read by the first (inputs before each sequence) and overwritten by the second: in one launch a
// block could overwrite a window another block has yet to read.
//
// Every `#pragma unroll` loop has a compile-time trip count; register arrays are indexed only by
// unrolled loop counters (a runtime index would put them in local memory; ci/clang_check.py
// checks). No host sync and no allocation: a decode step is capturable in a CUDA graph.

#include "attn_async.cuh"
#include "attn_convert.cuh"
#include "attn_gated_delta_abi.h"
#include "attn_m16n8k16.cuh"
#include "attn_platform.cuh"

namespace attn {
namespace gdn {

constexpr int kThreads = 128;
constexpr int kCols = 32;                     // value columns per block
constexpr int kRowGroups = kThreads / kCols;  // 4
constexpr float kL2Eps = 1e-6f;
constexpr int kWidth = 4;         // the convolution width compiled
constexpr int kConvTokens = 16;   // prefill outputs per thread
constexpr int kMaxGrid = 65535;   // gridDim.y and .z

ATTN_DEVICE float load_any(const void* p, int64_t i, int kind) {
  float x = 0.f;
  with_element_kind(kind, [&](auto k) { x = load_elem<decltype(k)::value>(p, i); });
  return x;
}

ATTN_DEVICE void store_any(void* p, int64_t i, int kind, float value) {
  with_element_kind(kind, [&](auto k) { store_elem<decltype(k)::value>(p, i, value); });
}

ATTN_DEVICE int64_t load_index(const void* p, int64_t i, int kind) {
  return kind == 0 ? static_cast<int64_t>(static_cast<const int32_t*>(p)[i])
                   : static_cast<const int64_t*>(p)[i];
}

ATTN_DEVICE float silu(float x) { return x / (1.0f + expf(-x)); }

// KeyLast: the pool is key-last ([.., V, K] in memory, passed as its [.., K, V] view: state_k_stride
// 1, every other stride and the base 16-byte aligned), so a thread's K / 4 rows of its column
// are contiguous and move as float4s. Read element by element, lanes 512 bytes apart, the step
// took 5.5x the contiguous pool's time at batch 64 (0.606 against 0.110 ms, H100, graph replay).
template <int K, bool KeyLast>
__global__ void __launch_bounds__(kThreads) decode_step(AttnGdnDecodeArgs a) {
  static_assert(K % kRowGroups == 0 && K <= kThreads, "K rows split over the row groups");
  constexpr int kRows = K / kRowGroups;
  __shared__ float sk[K], sq[K];
  __shared__ float norms[kRowGroups][3];               // k.k, q.q, q.k per row group
  __shared__ float red[2][2][kRowGroups][kCols];       // [head parity][S^T k, S^T q][group][col]
  const int tid = threadIdx.x;
  const int c = tid % kCols, r = tid / kCols;
  const int seq = blockIdx.z;
  const int group = a.num_value_heads / a.num_heads;
  const int head0 = blockIdx.y * a.heads_per_block;
  const int kh = head0 / group;
  const int col = blockIdx.x * kCols + c;
  const int64_t slot = load_index(a.state_indices, seq, a.index_kind);
  const bool valid = slot >= 0 && slot < a.num_slots;

  if (tid < K) {
    sk[tid] = load_any(a.k, seq * a.k_seq_stride + kh * a.k_head_stride + tid, a.qkv_kind);
    sq[tid] = load_any(a.q, seq * a.q_seq_stride + kh * a.q_head_stride + tid, a.qkv_kind);
  }
  __syncthreads();
  if (c == 0) {
    float kk = 0.f, qq = 0.f, qk = 0.f;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const float kv = sk[r * kRows + i], qv = sq[r * kRows + i];
      kk += kv * kv;
      qq += qv * qv;
      qk += qv * kv;
    }
    norms[r][0] = kk;
    norms[r][1] = qq;
    norms[r][2] = qk;
  }
  __syncthreads();
  float kk = 0.f, qq = 0.f, qk = 0.f;
#pragma unroll
  for (int j = 0; j < kRowGroups; ++j) {
    kk += norms[j][0];
    qq += norms[j][1];
    qk += norms[j][2];
  }
  const float inv_k = a.l2norm ? 1.0f / sqrtf(kk + kL2Eps) : 1.0f;
  const float inv_q = a.l2norm ? 1.0f / sqrtf(qq + kL2Eps) : 1.0f;
  const float out_scale = a.scale * inv_q;  // o = out_scale * (S_dec^T q + inv_k (q.k) delta)
  const float qk_hat = inv_k * qk;

  // 32-bit row offsets: with 64-bit ones (row as int64_t) ptxas kept 32 addresses live across
  // the reduction and spilled 8 bytes at K = 128 (sm_90, nvcc 13.0); the host keeps
  // K * state_k_stride below 2^31.
  const int row_stride = static_cast<int>(a.state_k_stride);
  for (int j = 0; j < a.heads_per_block; ++j) {
    const int h = head0 + j;
    float* st = a.state_pool + col * a.state_v_stride +
                (valid ? slot * a.state_slot_stride + h * a.state_head_stride : 0);
    const float decay = expf(load_any(a.g, seq * a.g_seq_stride + h * a.g_head_stride, a.g_kind));
    const float beta =
        load_any(a.beta, seq * a.beta_seq_stride + h * a.beta_head_stride, a.beta_kind);
    float s[kRows];
    if constexpr (KeyLast) {
      const float4* rows = reinterpret_cast<const float4*>(st + r * kRows);
#pragma unroll
      for (int i = 0; i < kRows / 4; ++i) {
        const float4 x = valid ? rows[i] : float4{0.f, 0.f, 0.f, 0.f};
        s[4 * i] = x.x * decay;
        s[4 * i + 1] = x.y * decay;
        s[4 * i + 2] = x.z * decay;
        s[4 * i + 3] = x.w * decay;
      }
    } else {
#pragma unroll
      for (int i = 0; i < kRows; ++i) s[i] = valid ? st[(r * kRows + i) * row_stride] * decay : 0.f;
    }
    float pk = 0.f, pq = 0.f;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      pk += sk[r * kRows + i] * s[i];
      pq += sq[r * kRows + i] * s[i];
    }
    red[j & 1][0][r][c] = pk;
    red[j & 1][1][r][c] = pq;
    __syncthreads();
    float sum_k = 0.f, sum_q = 0.f;
#pragma unroll
    for (int m = 0; m < kRowGroups; ++m) {
      sum_k += red[j & 1][0][m][c];
      sum_q += red[j & 1][1][m][c];
    }
    const float vv = load_any(a.v, seq * a.v_seq_stride + h * a.v_head_stride + col, a.qkv_kind);
    const float delta = beta * (vv - inv_k * sum_k);
    const float step = inv_k * delta;
#pragma unroll
    for (int i = 0; i < kRows; ++i) s[i] += sk[r * kRows + i] * step;
    if (valid && KeyLast) {
      float4* rows = reinterpret_cast<float4*>(st + r * kRows);
#pragma unroll
      for (int i = 0; i < kRows / 4; ++i) {
        rows[i] = float4{s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]};
      }
    } else if (valid) {
#pragma unroll
      for (int i = 0; i < kRows; ++i) st[(r * kRows + i) * row_stride] = s[i];
    }
    if (r == 0) {
      const float o = valid ? out_scale * (sum_q + qk_hat * delta) : 0.f;
      store_any(a.out, seq * a.out_seq_stride + h * a.out_head_stride + col, a.qkv_kind, o);
    }
  }
}

// Token t's inputs a prefill thread needs: k and q element `tid` (threads below K), its value
// column, the head's decay and beta.
struct TokenInputs {
  float k, q, v, g, beta;
};

template <int K>
ATTN_DEVICE TokenInputs load_token(const AttnGdnPrefillArgs& a, int64_t t, int kh, int h,
                                   int col, int tid) {
  TokenInputs in;
  in.k = tid < K ? load_any(a.k, t * a.k_tok_stride + kh * a.k_head_stride + tid, a.qkv_kind) : 0.f;
  in.q = tid < K ? load_any(a.q, t * a.q_tok_stride + kh * a.q_head_stride + tid, a.qkv_kind) : 0.f;
  in.v = load_any(a.v, t * a.v_tok_stride + h * a.v_head_stride + col, a.qkv_kind);
  in.g = load_any(a.g, t * a.g_tok_stride + h * a.g_head_stride, a.g_kind);
  in.beta = load_any(a.beta, t * a.beta_tok_stride + h * a.beta_head_stride, a.beta_kind);
  return in;
}

// The block (slice, value head, sequence) of a prefill kernel: thread (r, c) holds rows
// r * kRows .. r * kRows + kRows - 1 of value column `col` of the sequence's K x V state for
// value head h, whose tokens are [start, end); constructed, it has put the initial state's rows
// (zeros without one) in `s`.
template <int K>
struct PrefillSlice {
  static constexpr int kRows = K / kRowGroups;
  int c, r, h, kh, col;
  int64_t start, end, state_at;

  ATTN_DEVICE PrefillSlice(const AttnGdnPrefillArgs& a, float (&s)[kRows]) {
    const int tid = threadIdx.x, seq = blockIdx.z;
    c = tid % kCols;
    r = tid / kCols;
    h = blockIdx.y;
    kh = h / (a.num_value_heads / a.num_heads);
    col = blockIdx.x * kCols + c;
    start = load_index(a.cu_seqlens, seq, a.offset_kind);
    end = load_index(a.cu_seqlens, seq + 1, a.offset_kind);
    state_at = (static_cast<int64_t>(seq) * a.num_value_heads + h) * K * a.head_v + col;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int64_t at = state_at + (r * kRows + i) * a.head_v;
      s[i] = a.initial_state != nullptr ? a.initial_state[at] : 0.f;
    }
  }

  // The final state's rows, when the caller asked for it.
  ATTN_DEVICE void store(const AttnGdnPrefillArgs& a, const float (&s)[kRows]) const {
    if (a.final_state == nullptr) return;
#pragma unroll
    for (int i = 0; i < kRows; ++i) a.final_state[state_at + (r * kRows + i) * a.head_v] = s[i];
  }
};

// Grid (V / 32, HV, N): block (slice, value head, sequence) walks its sequence's tokens with its
// K x 32 slice of the state in registers (the decode step's thread mapping). Two barriers a
// token: one makes the token's k and q visible, one the row-group partial sums (with the l2
// norms' partials, which need no barrier of their own). Shared buffers alternate by token parity
// and each token's inputs are loaded two tokens ahead (registers, rotated: no array).
template <int K>
__global__ void __launch_bounds__(kThreads) recurrent_prefill(AttnGdnPrefillArgs a) {
  constexpr int kRows = K / kRowGroups;
  __shared__ float sk[2][K], sq[2][K];
  __shared__ float norms[2][kRowGroups][3];
  __shared__ float red[2][2][kRowGroups][kCols];
  const int tid = threadIdx.x;
  float s[kRows];
  const PrefillSlice<K> slice(a, s);
  const int c = slice.c, r = slice.r, h = slice.h, kh = slice.kh, col = slice.col;
  const int64_t start = slice.start, end = slice.end;
  // Tokens t + 1 and t + 2 are in flight while token t runs: a load issued during token t is
  // first used two tokens later, so its latency hides behind two tokens' barriers and sums
  // (with one token ahead the update waited on it each token; neither is measured on a GPU yet).
  const TokenInputs zero = {0.f, 0.f, 0.f, 0.f, 0.f};
  TokenInputs cur = start < end ? load_token<K>(a, start, kh, h, col, tid) : zero;
  TokenInputs ahead1 = start + 1 < end ? load_token<K>(a, start + 1, kh, h, col, tid) : zero;
  TokenInputs ahead2 = start + 2 < end ? load_token<K>(a, start + 2, kh, h, col, tid) : zero;
  if (tid < K) {
    sk[0][tid] = cur.k;
    sq[0][tid] = cur.q;
  }
  for (int64_t t = start; t < end; ++t) {
    const int b = static_cast<int>((t - start) & 1);
    const TokenInputs now = cur;
    const float decay = expf(now.g);
    __syncthreads();  // token t's k and q are in sk[b], sq[b]
    float pk = 0.f, pq = 0.f, kk = 0.f, qq = 0.f, qk = 0.f;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const float kv = sk[b][r * kRows + i], qv = sq[b][r * kRows + i];
      s[i] *= decay;
      pk += kv * s[i];
      pq += qv * s[i];
      kk += kv * kv;
      qq += qv * qv;
      qk += qv * kv;
    }
    red[b][0][r][c] = pk;
    red[b][1][r][c] = pq;
    if (c == 0) {
      norms[b][r][0] = kk;
      norms[b][r][1] = qq;
      norms[b][r][2] = qk;
    }
    __syncthreads();  // every row group's partials are in red[b], norms[b]
    const TokenInputs ahead3 = t + 3 < end ? load_token<K>(a, t + 3, kh, h, col, tid) : zero;
    float sum_k = 0.f, sum_q = 0.f;
    kk = qq = qk = 0.f;
#pragma unroll
    for (int m = 0; m < kRowGroups; ++m) {
      sum_k += red[b][0][m][c];
      sum_q += red[b][1][m][c];
      kk += norms[b][m][0];
      qq += norms[b][m][1];
      qk += norms[b][m][2];
    }
    const float inv_k = a.l2norm ? 1.0f / sqrtf(kk + kL2Eps) : 1.0f;
    const float inv_q = a.l2norm ? 1.0f / sqrtf(qq + kL2Eps) : 1.0f;
    const float delta = now.beta * (now.v - inv_k * sum_k);
    const float step = inv_k * delta;
#pragma unroll
    for (int i = 0; i < kRows; ++i) s[i] += sk[b][r * kRows + i] * step;
    if (r == 0) {
      const float o = a.scale * inv_q * (sum_q + inv_k * qk * delta);
      store_any(a.out, t * a.out_tok_stride + h * a.out_head_stride + col, a.qkv_kind, o);
    }
    if (tid < K) {  // sk[b ^ 1] was last read before this token's first barrier
      sk[b ^ 1][tid] = ahead1.k;
      sq[b ^ 1][tid] = ahead1.q;
    }
    cur = ahead1;
    ahead1 = ahead2;
    ahead2 = ahead3;
  }
  slice.store(a, s);
}

// Chunked prefill (chunk_gated_delta_rule) in the WY/UT form on CUDA cores, chunks of kChunk
// tokens. Per chunk, with G_t the gates' cumulative sum from the chunk's start, S0 the state
// before it, k and q l2-normalised (q also scaled):
//     u_t = beta_t (v_t - e^G_t S0^T k_t) - sum_{s<t} beta_t e^(G_t - G_s) (k_t . k_s) u_s
//     o_t = e^G_t S0^T q_t + sum_{s<=t} e^(G_t - G_s) (q_t . k_s) u_s
//     S  <- e^G_last S0 + sum_s e^(G_last - G_s) k_s u_s^T
// (forward substitution of the unit lower-triangular system is the UT transform's solve). The
// block and its state slice are the token-by-token kernel's; a chunk costs eight barriers instead
// of two per token, and its loads are issued together. kChunk is 16, not 64: the chunk's k and q
// (fp32, rows padded by four floats: 16-byte aligned, and the Gram's eight rows a quarter-warp
// reads fall in distinct banks) and the row groups' partial products must fit the BI-V100's
// 32 KiB of shared memory beside the intra-chunk matrices (31.4 KiB at K = 128); 64 would need
// the matrix-unit layer's tiling (csrc/attn_mma.cuh), a later step.
constexpr int kChunk = 16;
constexpr int kNormLanes = kThreads / kChunk;  // 8 threads load and normalise one token

// Shared rows are read four floats at a time (rows padded to 16 bytes): a warp's broadcast
// read of one float4 is one shared-memory transaction where four float reads were four, and the
// products over a row were one load per FMA.
ATTN_DEVICE const float4* as_quads(const float* row) {
  return reinterpret_cast<const float4*>(row);
}
// acc + a . b as four fused multiply-adds (written as a tree the products were one FMUL and
// an FADD in five instructions: 248M of 743M fp32 instructions of a 8K prefill, H100 ncu)
ATTN_DEVICE float dot4(float4 a, float4 b, float acc) {
  return fmaf(a.w, b.w, fmaf(a.z, b.z, fmaf(a.y, b.y, fmaf(a.x, b.x, acc))));
}
ATTN_DEVICE float dot4(float4 a, float x, float y, float z, float w, float acc) {
  return fmaf(a.w, w, fmaf(a.z, z, fmaf(a.y, y, fmaf(a.x, x, acc))));
}

// Lane lp's N elements lp, lp + kNormLanes, ... of row `base` of p, zeros where not `live`:
// every load issued before any is used (the dtype is switched on once, outside the loads). With
// each load stored to shared memory as it came, the loads were issued one after another's
// store: waiting on them was 35 % of the chunked kernel's stalls (H100 ncu, 8K prefill).
template <int Kind, int N>
ATTN_DEVICE void load_lane(const void* p, int64_t base, int lp, bool live, float (&out)[N]) {
#pragma unroll
  for (int m = 0; m < N; ++m) out[m] = live ? load_elem<Kind>(p, base + lp + kNormLanes * m) : 0.f;
}

template <int N>
ATTN_DEVICE void load_lane_any(const void* p, int64_t base, int lp, bool live, int kind,
                               float (&out)[N]) {
  with_element_kind(kind, [&](auto k) { load_lane<decltype(k)::value>(p, base, lp, live, out); });
}

template <int K>
__global__ void __launch_bounds__(kThreads) chunked_prefill(AttnGdnPrefillArgs a) {
  constexpr int kRows = K / kRowGroups;
  constexpr int kStride = K + 4;                 // padded row of kc and of q in `scratch`
  constexpr int kQuads = K / 4;                  // float4s a row
  constexpr int kRowQuads = kRows / 4;           // float4s of a row group's rows
  constexpr int kPerLane = K / kNormLanes;       // elements of a token one lane loads
  constexpr int kRed = 2 * kRowGroups * kChunk * kCols;  // S^T k, S^T q partials of each group
  constexpr int kMine = kChunk / kRowGroups;  // tokens whose sums, outputs a thread finishes
  constexpr int kScratch = kRed > kChunk * kStride ? kRed : kChunk * kStride;
  constexpr int kPairs = 2 * kChunk * kChunk / kThreads;       // Gram entries per thread
  static_assert(kPairs * kThreads == 2 * kChunk * kChunk, "Gram entries split evenly");
  static_assert(kMine * kRowGroups == kChunk, "a chunk's tokens split over the row groups");
  __shared__ __align__(16) float kc[kChunk * kStride];
  __shared__ __align__(16) float scratch[kScratch];  // q rows, then the partial products
  __shared__ float akk[kChunk][kChunk], aqk[kChunk][kChunk];
  __shared__ float ubuf[kChunk][kCols];  // the solve's right-hand side, then its solution u
  __shared__ float wu[kChunk][kCols];    // u decayed to the chunk's end, for the state
  __shared__ float npart[kChunk][kNormLanes][2];
  __shared__ float gcum[kChunk], graw[kChunk], gbeta[kChunk];
  const int tid = threadIdx.x;
  float s[kRows];
  const PrefillSlice<K> slice(a, s);
  const int c = slice.c, r = slice.r, h = slice.h, kh = slice.kh, col = slice.col;
  const int64_t start = slice.start, end = slice.end;
  const int lt = tid / kNormLanes, lp = tid % kNormLanes;  // the token and lane this thread loads
  for (int64_t c0 = start; c0 < end; c0 += kChunk) {
    const int n = static_cast<int>(min(static_cast<int64_t>(kChunk), end - c0));
    // 1. the chunk's k, q (raw), gates, betas and values, all loads issued before any store;
    // padding tokens are zeros
    const bool live = lt < n;
    float kv[kPerLane], qv[kPerLane];
    load_lane_any(a.k, (c0 + lt) * a.k_tok_stride + kh * a.k_head_stride, lp, live, a.qkv_kind, kv);
    load_lane_any(a.q, (c0 + lt) * a.q_tok_stride + kh * a.q_head_stride, lp, live, a.qkv_kind, qv);
    const int64_t gt = c0 + tid;  // gates and betas: one token a thread of the first kChunk
    const bool gate_live = tid < n;
    const float graw_t =
        gate_live ? load_any(a.g, gt * a.g_tok_stride + h * a.g_head_stride, a.g_kind) : 0.f;
    const float gbeta_t = gate_live ? load_any(a.beta, gt * a.beta_tok_stride +
                                                           h * a.beta_head_stride, a.beta_kind)
                                    : 0.f;
    float vreg[kMine];  // the values of this thread's tokens r * kMine ..
#pragma unroll
    for (int m = 0; m < kMine; ++m) {
      const int t = r * kMine + m;
      const int64_t vat = (c0 + t) * a.v_tok_stride + h * a.v_head_stride + col;
      vreg[m] = t < n ? load_any(a.v, vat, a.qkv_kind) : 0.f;
    }
    float kk = 0.f, qq = 0.f;
#pragma unroll
    for (int m = 0; m < kPerLane; ++m) {
      const int j = lp + kNormLanes * m;
      kc[lt * kStride + j] = kv[m];
      scratch[lt * kStride + j] = qv[m];
      kk += kv[m] * kv[m];
      qq += qv[m] * qv[m];
    }
    npart[lt][lp][0] = kk;
    npart[lt][lp][1] = qq;
    if (tid < kChunk) {
      graw[tid] = graw_t;
      gbeta[tid] = gbeta_t;
    }
    __syncthreads();
    // 2. normalise this thread's elements; cumulative gates
    {
      float sk2 = 0.f, sq2 = 0.f;
#pragma unroll
      for (int p = 0; p < kNormLanes; ++p) {
        sk2 += npart[lt][p][0];
        sq2 += npart[lt][p][1];
      }
      const float inv_k = a.l2norm ? 1.0f / sqrtf(sk2 + kL2Eps) : 1.0f;
      const float inv_q = (a.l2norm ? 1.0f / sqrtf(sq2 + kL2Eps) : 1.0f) * a.scale;
#pragma unroll
      for (int m = 0; m < kPerLane; ++m) {
        const int j = lp + kNormLanes * m;
        kc[lt * kStride + j] *= inv_k;
        scratch[lt * kStride + j] *= inv_q;
      }
    }
    if (tid == 0) {
      float total = 0.f;
#pragma unroll
      for (int t = 0; t < kChunk; ++t) {
        total += graw[t];
        gcum[t] = total;
      }
    }
    __syncthreads();
    // 3. the decayed Gram matrices (kPairs entries a thread) and S0^T k, S0^T q partial sums
#pragma unroll
    for (int x = 0; x < kPairs; ++x) {  // into akk / aqk at once: read only after two barriers
      const int pair = tid + kThreads * x;
      const int mat = pair / (kChunk * kChunk), t = (pair / kChunk) % kChunk, u = pair % kChunk;
      const float4* left = as_quads(mat == 0 ? &kc[t * kStride] : &scratch[t * kStride]);
      const float4* right = as_quads(&kc[u * kStride]);
      float dot = 0.f;
#pragma unroll 8
      for (int j = 0; j < kQuads; ++j) dot = dot4(left[j], right[j], dot);
      const float decay = expf(gcum[t] - gcum[u]);
      if (mat == 0) {
        akk[t][u] = u < t ? dot * decay * gbeta[t] : 0.f;
      } else {
        aqk[t][u] = u <= t ? dot * decay : 0.f;
      }
    }
    float pk[kChunk], pq[kChunk];
#pragma unroll
    for (int t = 0; t < kChunk; ++t) {
      const float4* krow = as_quads(&kc[t * kStride + r * kRows]);
      const float4* qrow = as_quads(&scratch[t * kStride + r * kRows]);
      float sum_k = 0.f, sum_q = 0.f;
#pragma unroll
      for (int i = 0; i < kRowQuads; ++i) {
        sum_k = dot4(krow[i], s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3], sum_k);
        sum_q = dot4(qrow[i], s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3], sum_q);
      }
      pk[t] = sum_k;
      pq[t] = sum_q;
    }
    __syncthreads();  // every read of q is done: `scratch` takes the partial sums
#pragma unroll
    for (int t = 0; t < kChunk; ++t) {
      scratch[((0 * kRowGroups + r) * kChunk + t) * kCols + c] = pk[t];
      scratch[((1 * kRowGroups + r) * kChunk + t) * kCols + c] = pq[t];
    }
    __syncthreads();
    // 4. one value column a thread, the solve split three ways so that only the forward
    // substitution runs on one row group (it alone was ~1.4K of a chunk's ~6.6K instructions
    // a thread while the other three warps waited): (a) each thread sums the row groups'
    // partials of its kMine tokens into the right-hand side beta (v - e^G S0^T k) and e^G S0^T q;
    // (b) row group 0 solves for u in place; (c) each thread adds its tokens' intra-chunk
    // output terms and decays their u for the state.
    float inter_q[kMine];
#pragma unroll
    for (int m = 0; m < kMine; ++m) {
      const int t = r * kMine + m;
      float sum_k = 0.f, sum_q = 0.f;
#pragma unroll
      for (int g = 0; g < kRowGroups; ++g) {
        sum_k += scratch[((0 * kRowGroups + g) * kChunk + t) * kCols + c];
        sum_q += scratch[((1 * kRowGroups + g) * kChunk + t) * kCols + c];
      }
      const float gamma = expf(gcum[t]);
      ubuf[t][c] = gbeta[t] * (vreg[m] - gamma * sum_k);
      inter_q[m] = gamma * sum_q;
    }
    __syncthreads();
    if (r == 0) {
      // Full-length inner loops over zeros (u past t is 0, akk is masked): with `j < t`
      // bounds clang 16 unrolled the inner loops before the outer one and kept u in local
      // memory (ci/clang_check.py).
      float u[kChunk];
#pragma unroll
      for (int t = 0; t < kChunk; ++t) u[t] = 0.f;
#pragma unroll
      for (int t = 0; t < kChunk; ++t) {
        float acc = ubuf[t][c];
#pragma unroll
        for (int j = 0; j < kChunk; ++j) acc -= akk[t][j] * u[j];
        u[t] = acc;
        ubuf[t][c] = acc;
      }
    }
    __syncthreads();
#pragma unroll
    for (int m = 0; m < kMine; ++m) {
      const int t = r * kMine + m;
      float o = inter_q[m];
#pragma unroll
      for (int j = 0; j < kChunk; ++j) o += aqk[t][j] * ubuf[j][c];
      if (t < n) {
        const int64_t oat = (c0 + t) * a.out_tok_stride + h * a.out_head_stride + col;
        store_any(a.out, oat, a.qkv_kind, o);
      }
      wu[t][c] = expf(gcum[kChunk - 1] - gcum[t]) * ubuf[t][c];
    }
    __syncthreads();
    // 5. the state: decayed over the chunk, plus the chunk's keys times their new values
    const float chunk_decay = expf(gcum[kChunk - 1]);
#pragma unroll
    for (int i = 0; i < kRows; ++i) s[i] *= chunk_decay;
#pragma unroll
    for (int t = 0; t < kChunk; ++t) {
      const float w = wu[t][c];
      const float4* krow = as_quads(&kc[t * kStride + r * kRows]);
#pragma unroll
      for (int i = 0; i < kRowQuads; ++i) {
        const float4 k4 = krow[i];
        s[4 * i] += k4.x * w;
        s[4 * i + 1] += k4.y * w;
        s[4 * i + 2] += k4.z * w;
        s[4 * i + 3] += k4.w * w;
      }
    }
    __syncthreads();  // kc, wu and the gates are read: the next chunk may load
  }
  slice.store(a, s);
}

// ---------------------------------------------------------------- chunk-parallel prefill
// chunk_gated_delta_rule split into what does not depend on the state and what does
// (docs/design/gated-delta-prefill.md). Per chunk of kPar = 64 tokens and value head, with G_t
// the gates' cumulative sum from the chunk's start, k and q l2-normalised (q also scaled), D
// the decay exp(G_t - G_s) below and on the diagonal:
//     A  = strictly_lower(diag(beta) (K K^T o D)),  T = (I + A)^-1
//     W  = T diag(beta e^G) K,   U = T diag(beta) V,   P = (Q K^T) o D,
//     Qg = diag(e^G) Q,   Kd = diag(e^(G_last - G)) K
// chunk_prep computes all of that for every chunk of a segment at once (one block a chunk and
// value head); chunk_pass then walks each sequence's chunks with the state on chip:
//     V' = U - W S;   O = Qg S + P V';   S <- e^G_last S + Kd^T V'
// chunk_pass splits the value dimension finely (kSlice columns a block): the columns are
// independent once W and U are known, so a single sequence of 32 value heads is 256 blocks
// without recomputing anything, where the fused 16-token kernel above needed each block to
// solve its chunk itself. What chunk_prep hands over lives in a workspace of one record per
// (chunk slot, value head), laid out in the order chunk_pass reads it: ChunkRecord::kTiles tiles
// of kTile floats ([W; Qg]^T as K rows of 128, P^T, Kd), then U [64, V], then the chunk's
// e^G_last (padded to 16 bytes).
constexpr int kPar = 64;            // tokens a chunk
constexpr int kSlice = 16;          // value columns a chunk_pass block
constexpr int kTile = 2048;         // floats a staged tile (8 KiB)
// chunk_pass's threads: each thread 4 x 4 of [W; Qg] S, 4 x 4 of the state, 8 outputs a chunk
// (156 registers at K = 128). The same work over 256 threads (2 x 4, 2 x 4 and 4; 104
// registers, two blocks an SM) was slower on the H100: 6.85 -> 7.83 ms at 32K, the same 14
// barriers a chunk with half the work between them (docs/benchmarks.md#gated-deltanet).
constexpr int kPassThreads = 128;
constexpr int kPrepThreads = 256;

template <int K>
struct ChunkRecord {
  static constexpr int kWqTiles = K / 16;          // [W; Qg]^T: 16 key rows of 128 a tile
  static constexpr int kPTiles = kPar * kPar / kTile;
  static constexpr int kKdTiles = kPar * K / kTile;
  static constexpr int kTiles = kWqTiles + kPTiles + kKdTiles;
  static constexpr int kKdTokens = kTile / K;      // tokens of Kd a tile
  static constexpr int kTileFloats = kTiles * kTile;
  static_assert(kPar * kPar % kTile == 0 && kPar * K % kTile == 0, "whole tiles");
};

// Floats of one record (tiles, U, the gate) at these head sizes.
__host__ __device__ constexpr int64_t record_floats(int head_k, int head_v) {
  return (head_k / 16 + kPar * kPar / kTile + kPar * head_k / kTile) * static_cast<int64_t>(kTile) +
         static_cast<int64_t>(kPar) * head_v + 4;
}

// The 16-bit records of the matrix-unit pair (gated_delta_pair16.cuh), in the input's own 16-bit
// kind: [W; Qg] [2 kPar][K] (token major), P [kPar][kPar], Kd^T [K][kPar], U [kPar][V], each row
// major, then the chunk's e^G_last as one float in the record's last 16 bytes. Half the fp32
// record's bytes, and each product's operand already in the row order the matrix unit loads.
__host__ __device__ constexpr int64_t record16_p(int head_k) { return 2 * kPar * head_k; }
__host__ __device__ constexpr int64_t record16_kdt(int head_k) {
  return record16_p(head_k) + kPar * kPar;
}
__host__ __device__ constexpr int64_t record16_u(int head_k) {
  return record16_kdt(head_k) + static_cast<int64_t>(head_k) * kPar;
}
__host__ __device__ constexpr int64_t record16_bytes(int head_k, int head_v) {
  return (2 * (record16_u(head_k) + static_cast<int64_t>(kPar) * head_v) + 15) / 16 * 16 + 16;
}

// Which chunks a launch covers: sequences seq_order[base .. base + width) at chunk positions
// [p0, p0 + depth); record (z, p) of value head h is ((z * depth + p - p0) * HV + h).
struct ChunkSegment {
  int32_t base, width, p0, depth;
};

// The sequence of grid slice z and its token range.
struct SegmentSeq {
  int seq;
  int64_t start, end, chunks;
};

ATTN_DEVICE SegmentSeq segment_seq(const AttnGdnPrefillArgs& a, const ChunkSegment& s, int z) {
  SegmentSeq q;
  q.seq = static_cast<const int32_t*>(a.seq_order)[s.base + z];
  q.start = load_index(a.cu_seqlens, q.seq, a.offset_kind);
  q.end = load_index(a.cu_seqlens, q.seq + 1, a.offset_kind);
  q.chunks = (q.end - q.start + kPar - 1) / kPar;
  return q;
}

ATTN_DEVICE float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }
ATTN_DEVICE void st4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }

// N elements p[at[m]] (0.0 where at[m] < 0), every load issued before any value is used: the
// dtype is switched on once, outside the loads. With each element loaded and stored to shared
// memory in turn, chunk_prep took 9.23 ms of a 32K prefill; with its loads gathered (and its
// solve in four partial sums) 7.42 (H100, docs/benchmarks.md#gated-deltanet).
template <int Kind, int N>
ATTN_DEVICE void gather(const void* p, const int64_t (&at)[N], float (&out)[N]) {
#pragma unroll
  for (int m = 0; m < N; ++m) out[m] = at[m] >= 0 ? load_elem<Kind>(p, at[m]) : 0.f;
}

template <int N>
ATTN_DEVICE void gather_any(const void* p, const int64_t (&at)[N], int kind, float (&out)[N]) {
  with_element_kind(kind, [&](auto k) { gather<decltype(k)::value>(p, at, out); });
}

// T = (I + A)^-1 into the lower half of `mat` [kPar][kPar] (kPrepThreads threads, ending before
// a barrier), with `x` of 768 floats for scratch, A[t][u] read from mat[u][t] (u < t, above the
// diagonal) and T[u][j] from mat[u][j] (u >= j, on or below it): no element is written while
// another thread may read it. Forward substitution runs only inside the four 16 x 16 diagonal
// blocks, a thread a column kept in registers (one block a warp); the blocks below them follow
// by distance from the diagonal, every thread an element:
//     X = sum_{j <= k < i} A_ik T_kj,   T_ij = -T_ii X.
// Every loop has a compile-time trip count, the triangles masked by selects. Substituting down
// the whole 64 x 64 triangle walked 2016 dependent terms for column 0 on two of the eight
// warps: chunk_prep took 6.64 ms of a 32K prefill that way, 6.30 with these blocks as loops of
// runtime length through shared memory (H100, bench/linear_pair_tune.py, three interleaved
// rounds), where ncu put 57 % of chunk_prep16's warp time in the solve; this form took
// chunk_prep16 2.20 -> 1.62 ms and chunk_prep 6.29 -> 5.62 (H100, 32K, torch.profiler).
ATTN_DEVICE void invert_unit_lower(float* mat, float* x) {
  constexpr int kB = 16, kBlocks = kPar / kB;
  static_assert(kB * kB == kPrepThreads && (kBlocks - 1) * kB * kB <= 768, "an element a thread");
  const int tid = threadIdx.x;
  if (tid / 32 < kBlocks && tid % 32 < kB) {  // column j of diagonal block `base`
    const int j = tid % 32, base = tid / 32 * kB;
    float tc[kB];  // T[base + t][base + j]: 0 above the diagonal, as the substitution gives
#pragma unroll
    for (int t = 0; t < kB; ++t) {
      float acc = t == j ? 1.f : 0.f;
#pragma unroll
      for (int u = 0; u < kB; ++u) {  // a square loop: clang 16 kept tc in local memory for u < t
        if (u < t) acc -= mat[(base + u) * kPar + base + t] * tc[u];
      }
      tc[t] = acc;
    }
#pragma unroll
    for (int t = 0; t < kB; ++t) {
      if (t >= j) mat[(base + t) * kPar + base + j] = tc[t];
    }
  }
#pragma unroll
  for (int d = 1; d < kBlocks; ++d) {
    __syncthreads();  // the blocks nearer the diagonal are whole
#pragma unroll
    for (int bj = 0; bj < kBlocks - d; ++bj) {  // X of block (bj + d, bj): thread (r, c)
      const int r = tid / kB, c = tid % kB, row = (bj + d) * kB + r, col = bj * kB + c;
      float x0 = 0.f, x1 = 0.f;
#pragma unroll
      for (int u = 0; u < d * kB; u += 2) {  // T[.][col] is zero above col in its own block
        const int k = bj * kB + u;
        x0 += mat[k * kPar + row] * (u >= c ? mat[k * kPar + col] : 0.f);
        x1 += mat[(k + 1) * kPar + row] * (u + 1 >= c ? mat[(k + 1) * kPar + col] : 0.f);
      }
      x[bj * kB * kB + tid] = x0 + x1;
    }
    __syncthreads();
#pragma unroll
    for (int bj = 0; bj < kBlocks - d; ++bj) {  // T_ij = -T_ii X
      const int r = tid / kB, c = tid % kB, bi = bj + d, row = bi * kB + r;
      float t0 = 0.f, t1 = 0.f;
#pragma unroll
      for (int u = 0; u < kB; u += 2) {  // T_ii is zero right of its diagonal
        const float* xc = x + bj * kB * kB + c;  // X's column c
        t0 -= (u <= r ? mat[row * kPar + bi * kB + u] : 0.f) * xc[u * kB];
        t1 -= (u + 1 <= r ? mat[row * kPar + bi * kB + u + 1] : 0.f) * xc[(u + 1) * kB];
      }
      mat[row * kPar + bj * kB + c] = t0 + t1;
    }
  }
}

// Grid (HV, depth, width), kPrepThreads threads: the record of one chunk and value head.
// Shared memory is 25 KiB, inside the BI-V100's 32 KiB a block: A and T share one 64 x 64
// matrix (A is strictly lower and T lower: T is kept where it is, A transposed above the
// diagonal), and the operand tiles stream through an 8 KiB buffer.
template <int K>
__global__ void __launch_bounds__(kPrepThreads) chunk_prep(AttnGdnPrefillArgs a, ChunkSegment s) {
  using R = ChunkRecord<K>;
  constexpr int kKt = 16;           // key elements a Gram tile
  constexpr int kKtRow = kPar + 4;  // its rows padded: stores 4-way, not 32-way, conflicted
  constexpr int kSt = 16;           // tokens of a W / U operand tile (128 columns)
  static_assert(kKtRow * kKt * 2 <= kPar * kPar && K <= 128, "the Gram tiles fit the matrix");
  __shared__ __align__(16) float mat[kPar * kPar];   // Gram tiles; then T below, A^T above
  __shared__ __align__(16) float opnd[kSt * 128];    // norm partials; then the operand tiles
  __shared__ float gcum[kPar], inv_k[kPar], inv_q[kPar], beta[kPar], egate[kPar];
  const int tid = threadIdx.x, h = blockIdx.x, dp = blockIdx.y, z = blockIdx.z;
  const SegmentSeq sq = segment_seq(a, s, z);
  const int p = s.p0 + dp;
  if (p >= sq.chunks) return;
  const int64_t tok0 = sq.start + static_cast<int64_t>(p) * kPar;
  const int n = static_cast<int>(min(static_cast<int64_t>(kPar), sq.end - tok0));
  const int kh = h / (a.num_value_heads / a.num_heads);
  float* rec = a.workspace +
               ((static_cast<int64_t>(z) * s.depth + dp) * a.num_value_heads + h) *
                   record_floats(K, a.head_v);

  // 1. gates, betas; the squared norms of k and q in four parts a token
  float* parts = opnd;  // [kPar][4][2]
  {
    const int t = tid / 4, part = tid % 4;
    float kk = 0.f, qq = 0.f;
    if (t < n) {
      const int64_t ka = (tok0 + t) * a.k_tok_stride + kh * a.k_head_stride;
      const int64_t qa = (tok0 + t) * a.q_tok_stride + kh * a.q_head_stride;
#pragma unroll 8
      for (int m = 0; m < K / 4; ++m) {
        const int j = part + 4 * m;
        const float kv = load_any(a.k, ka + j, a.qkv_kind), qv = load_any(a.q, qa + j, a.qkv_kind);
        kk += kv * kv;
        qq += qv * qv;
      }
    }
    parts[(t * 4 + part) * 2] = kk;
    parts[(t * 4 + part) * 2 + 1] = qq;
  }
  if (tid < kPar) {
    const int64_t ga = (tok0 + tid) * a.g_tok_stride + h * a.g_head_stride;
    const int64_t ba = (tok0 + tid) * a.beta_tok_stride + h * a.beta_head_stride;
    gcum[tid] = tid < n ? load_any(a.g, ga, a.g_kind) : 0.f;
    beta[tid] = tid < n ? load_any(a.beta, ba, a.beta_kind) : 0.f;
  }
  __syncthreads();
  if (tid < kPar) {
    float kk = 0.f, qq = 0.f;
#pragma unroll
    for (int part = 0; part < 4; ++part) {
      kk += parts[(tid * 4 + part) * 2];
      qq += parts[(tid * 4 + part) * 2 + 1];
    }
    inv_k[tid] = a.l2norm ? 1.0f / sqrtf(kk + kL2Eps) : 1.0f;
    inv_q[tid] = (a.l2norm ? 1.0f / sqrtf(qq + kL2Eps) : 1.0f) * a.scale;
  }
  if (tid == 0) {
    float total = 0.f;
    for (int t = 0; t < kPar; ++t) {
      total += gcum[t];
      gcum[t] = total;
    }
    rec[R::kTileFloats + static_cast<int64_t>(kPar) * a.head_v] = expf(total);
  }
  __syncthreads();
  if (tid < kPar) egate[tid] = expf(gcum[tid]);

  // 2. raw Gram products K K^T and Q K^T in key tiles of kKt, thread (ti, si) holding tokens
  // 4 ti .. of the rows and 4 si .. of the columns
  const int ti = tid / 16, si = tid % 16;
  float gk[4][4], gq[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) gk[i][j] = gq[i][j] = 0.f;
  }
  float* kt = mat;  // [kKt][kKtRow]: key element major
  float* qt = mat + kKt * kKtRow;
  for (int k0 = 0; k0 < K; k0 += kKt) {
    __syncthreads();  // the previous tile is read
    constexpr int kPer = kPar * kKt / kPrepThreads;
    int64_t ka[kPer], qa[kPer];
    float kv[kPer], qv[kPer];
#pragma unroll
    for (int m = 0; m < kPer; ++m) {
      const int e = tid + kPrepThreads * m, t = e / kKt, j = e % kKt;
      ka[m] = t < n ? (tok0 + t) * a.k_tok_stride + kh * a.k_head_stride + k0 + j : -1;
      qa[m] = t < n ? (tok0 + t) * a.q_tok_stride + kh * a.q_head_stride + k0 + j : -1;
    }
    gather_any(a.k, ka, a.qkv_kind, kv);
    gather_any(a.q, qa, a.qkv_kind, qv);
#pragma unroll
    for (int m = 0; m < kPer; ++m) {
      const int e = tid + kPrepThreads * m, t = e / kKt, j = e % kKt;
      kt[j * kKtRow + t] = kv[m];
      qt[j * kKtRow + t] = qv[m];
    }
    __syncthreads();
#pragma unroll 4
    for (int j = 0; j < kKt; ++j) {
      const float4 kr = ld4(kt + j * kKtRow + 4 * ti), qr = ld4(qt + j * kKtRow + 4 * ti);
      const float4 kc = ld4(kt + j * kKtRow + 4 * si);
      const float krow[4] = {kr.x, kr.y, kr.z, kr.w}, qrow[4] = {qr.x, qr.y, qr.z, qr.w};
      const float kcol[4] = {kc.x, kc.y, kc.z, kc.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          gk[i][c] = fmaf(krow[i], kcol[c], gk[i][c]);
          gq[i][c] = fmaf(qrow[i], kcol[c], gq[i][c]);
        }
      }
    }
  }
  __syncthreads();  // the Gram tiles are read: `mat` takes A
  // 3. A^T (mat[u][t] = A[t][u], u < t: above the diagonal); P^T straight to the record
  float* pt = rec + R::kWqTiles * kTile;  // [s][t]
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int u = 4 * si + c;
    float prow[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int t = 4 * ti + i;
      const float d = u <= t ? expf(gcum[t] - gcum[u]) : 0.f;
      if (u < t) mat[u * kPar + t] = beta[t] * d * inv_k[t] * inv_k[u] * gk[i][c];
      prow[i] = d * inv_q[t] * inv_k[u] * gq[i][c];
    }
    st4(pt + u * kPar + 4 * ti, float4{prow[0], prow[1], prow[2], prow[3]});
  }
  __syncthreads();  // A is whole

  // 4. T = (I + A)^-1 into mat's lower half
  invert_unit_lower(mat, opnd);
  __syncthreads();
  for (int e = tid; e < kPar * kPar; e += kPrepThreads) {  // T is 0 above the diagonal
    if (e % kPar > e / kPar) mat[e] = 0.f;
  }
  // 5. W = T (beta e^G k_hat) and U = T (beta v): operand tiles of kSt tokens x 128 in opnd,
  // thread (ti, ci) holding rows 4 ti .. and columns 8 ci ..
  const int ci = tid % 16;
  const int passes = 1 + (a.head_v + 127) / 128;  // W's K <= 128 columns, then U's
  for (int pass = 0; pass < passes; ++pass) {
    const bool keys = pass == 0;
    const int c0 = keys ? 0 : (pass - 1) * 128;
    const int width = keys ? K : min(128, a.head_v - c0);
    float acc[4][8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int c = 0; c < 8; ++c) acc[i][c] = 0.f;
    }
    for (int s0 = 0; s0 < kPar; s0 += kSt) {
      __syncthreads();  // T is whole (first tile) / the previous tile is read
      constexpr int kPer = kSt * 128 / kPrepThreads;
      int64_t at[kPer];
      float val[kPer];
#pragma unroll
      for (int m = 0; m < kPer; ++m) {
        const int e = tid + kPrepThreads * m, u = e / 128, j = e % 128, tok = s0 + u;
        const int64_t row = keys ? (tok0 + tok) * a.k_tok_stride + kh * a.k_head_stride
                                 : (tok0 + tok) * a.v_tok_stride + h * a.v_head_stride;
        at[m] = tok < n && j < width ? row + c0 + j : -1;
      }
      gather_any(keys ? a.k : a.v, at, a.qkv_kind, val);
#pragma unroll
      for (int m = 0; m < kPer; ++m) {
        const int e = tid + kPrepThreads * m, u = e / 128, tok = s0 + u;
        const float coef = keys ? beta[tok] * egate[tok] * inv_k[tok] : beta[tok];
        opnd[e] = val[m] * coef;
      }
      __syncthreads();
#pragma unroll 4
      for (int u = 0; u < kSt; ++u) {
        const float4 lo = ld4(opnd + u * 128 + 8 * ci), hi = ld4(opnd + u * 128 + 8 * ci + 4);
        const float ov[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float tv = mat[(4 * ti + i) * kPar + s0 + u];
#pragma unroll
          for (int c = 0; c < 8; ++c) acc[i][c] = fmaf(tv, ov[c], acc[i][c]);
        }
      }
    }
    if (keys) {  // W^T: rows 0 .. 63 of [W; Qg]^T (key element major, 128 a row)
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const int j = c0 + 8 * ci + c;
        if (j < K) st4(rec + j * 128 + 4 * ti, float4{acc[0][c], acc[1][c], acc[2][c], acc[3][c]});
      }
    } else {
      float* u_rec = rec + R::kTileFloats;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int j = c0 + 8 * ci;
        if (j < a.head_v) {
          float* row = u_rec + (4 * ti + i) * a.head_v + j;
          st4(row, float4{acc[i][0], acc[i][1], acc[i][2], acc[i][3]});
          st4(row + 4, float4{acc[i][4], acc[i][5], acc[i][6], acc[i][7]});
        }
      }
    }
  }
  // 6. Qg^T (rows 64 .. 127 of [W; Qg]^T) and Kd, straight from the inputs
  const float glast = gcum[kPar - 1];
  float* kd = rec + (R::kWqTiles + R::kPTiles) * kTile;  // [t][K]
  constexpr int kBatch = 8;
  static_assert(kPar * K % (kPrepThreads * kBatch) == 0, "whole batches");
  for (int e0 = 0; e0 < kPar * K; e0 += kPrepThreads * kBatch) {
    int64_t qa[kBatch], ka[kBatch];
    float qv[kBatch], kv[kBatch];
#pragma unroll
    for (int m = 0; m < kBatch; ++m) {
      const int e = e0 + tid + kPrepThreads * m;
      const int tq = e % kPar, jq = e / kPar;  // Qg^T: consecutive threads, consecutive tokens
      const int tk = e / K, jk = e % K;        // Kd: consecutive threads, consecutive elements
      qa[m] = tq < n ? (tok0 + tq) * a.q_tok_stride + kh * a.q_head_stride + jq : -1;
      ka[m] = tk < n ? (tok0 + tk) * a.k_tok_stride + kh * a.k_head_stride + jk : -1;
    }
    gather_any(a.q, qa, a.qkv_kind, qv);
    gather_any(a.k, ka, a.qkv_kind, kv);
#pragma unroll
    for (int m = 0; m < kBatch; ++m) {
      const int e = e0 + tid + kPrepThreads * m;
      const int tq = e % kPar, jq = e / kPar, tk = e / K;
      rec[jq * 128 + kPar + tq] = qv[m] * egate[tq] * inv_q[tq];
      kd[e] = kv[m] * expf(glast - gcum[tk]) * inv_k[tk];
    }
  }
}

// The kTile floats of tile `i` of `rec`, kTileVecs float4s a thread (kPassThreads threads).
constexpr int kTileVecs = kTile / 4 / kPassThreads;
static_assert(kTileVecs * 4 * kPassThreads == kTile, "whole float4s a thread");

ATTN_DEVICE void load_tile(const float* rec, int i, float4 (&r)[kTileVecs]) {
  const float* base = rec + static_cast<int64_t>(i) * kTile;
#pragma unroll
  for (int m = 0; m < kTileVecs; ++m) r[m] = ld4(base + 4 * (threadIdx.x + kPassThreads * m));
}

ATTN_DEVICE void store_tile(float* stage, const float4 (&r)[kTileVecs]) {
#pragma unroll
  for (int m = 0; m < kTileVecs; ++m) st4(stage + 4 * (threadIdx.x + kPassThreads * m), r[m]);
}

// N consecutive floats from p (16-byte aligned for N >= 4, 8-byte for N = 2) in one or two
// vector loads.
template <int N>
ATTN_DEVICE void ld_n(const float* p, float (&r)[N]) {
  static_assert(N == 1 || N == 2 || N == 4 || N == 8, "one or two vector loads");
  if constexpr (N == 8) {
    const float4 lo = ld4(p), hi = ld4(p + 4);
    r[0] = lo.x, r[1] = lo.y, r[2] = lo.z, r[3] = lo.w;
    r[4] = hi.x, r[5] = hi.y, r[6] = hi.z, r[7] = hi.w;
  } else if constexpr (N == 4) {
    const float4 v = ld4(p);
    r[0] = v.x, r[1] = v.y, r[2] = v.z, r[3] = v.w;
  } else if constexpr (N == 2) {
    const float2 v = *reinterpret_cast<const float2*>(p);
    r[0] = v.x, r[1] = v.y;
  } else {
    r[0] = *p;
  }
}

// Grid (V / kSlice, HV, width), kPassThreads threads: the block's K x kSlice slice of the
// state walks the sequence's chunks [p0, p0 + depth), read from the initial state (p0 == 0)
// or the final state (the previous segment left it there) and written to the final state.
// A chunk's record streams through two shared buffers in tiles, the next tile's loads issued
// before the current one's products, one barrier a tile (14 a chunk at K = 128). Each thread
// reading the record elements it uses straight from L2 instead (two barriers a chunk, 16 KiB
// of shared memory) was slower on the H100: chunk_pass 6.93 -> 9.91 ms at 32K, 8 x 16K 56.2 ->
// 63.4 (bench/linear_pair_tune.py, three interleaved rounds): the exposed L2 latency cost more
// than the barriers it saved. One block an SM at least: the default register target (128,
// nvcc 13 sm_90) spilled 8 bytes at K = 128; it takes 156 registers.
template <int K>
__global__ void __launch_bounds__(kPassThreads, 1) chunk_pass(AttnGdnPrefillArgs a, ChunkSegment s) {
  using R = ChunkRecord<K>;
  constexpr int kCg = kSlice / 4;                          // column groups of 4
  constexpr int kRg = kPassThreads / kCg;                  // row groups
  constexpr int kXRows = 2 * kPar / kRg;                   // rows of [W; Qg] S a thread owns
  constexpr int kSRows = K / kRg;                          // state rows a thread owns
  constexpr int kOg = kPassThreads / kPar;                 // threads a token's outputs
  constexpr int kOCols = kSlice / kOg;                     // output columns a thread
  static_assert(kRg * kCg == kPassThreads && kXRows * kRg == 2 * kPar && kSRows * kRg == K &&
                    kOg * kPar == kPassThreads && kOCols * kOg == kSlice,
                "the products, the state and the outputs split over the threads");
  static_assert(kPar % kXRows == 0, "a thread's rows are all W's or all Qg's");
  __shared__ __align__(16) float state[K * kSlice];    // [K][kSlice]
  __shared__ __align__(16) float vnew[kPar * kSlice];  // V' [t][kSlice]
  __shared__ __align__(16) float qs[kPar * kSlice];    // Qg S [t][kSlice]
  const int tid = threadIdx.x, h = blockIdx.y, z = blockIdx.z;
  const int col0 = blockIdx.x * kSlice;
  const SegmentSeq sq = segment_seq(a, s, z);
  const int p_end = static_cast<int>(min(static_cast<int64_t>(s.p0 + s.depth), sq.chunks));
  if (s.p0 > 0 && s.p0 >= p_end) return;  // done: its state is in final_state already
  const int rg = tid / kCg, cg = tid % kCg;  // rows kXRows rg .. of [W; Qg], columns 4 cg ..
  const int to = tid / kOg, og = tid % kOg;  // outputs: token `to`, columns kOCols og ..
  const bool w_rows = kXRows * rg < kPar;    // this thread's product rows are W's (else Qg's)
  const int64_t rec_floats = record_floats(K, a.head_v);
  const float* rec0 = a.workspace + (static_cast<int64_t>(z) * s.depth * a.num_value_heads + h) *
                                        rec_floats;
  const int64_t rec_step = a.num_value_heads * rec_floats;  // from chunk p to p + 1

  // the state slice: rows rg * kSRows .., columns 4 cg ..
  const float* from = s.p0 == 0 ? a.initial_state : a.final_state;
  const int64_t st_at = (static_cast<int64_t>(sq.seq) * a.num_value_heads + h) * K * a.head_v +
                        col0 + 4 * cg;
  float own[kSRows][4];
#pragma unroll
  for (int i = 0; i < kSRows; ++i) {
    const int row = rg * kSRows + i;
    const float4 v = from != nullptr ? ld4(from + st_at + row * a.head_v) : float4{0.f, 0.f, 0.f, 0.f};
    own[i][0] = v.x;
    own[i][1] = v.y;
    own[i][2] = v.z;
    own[i][3] = v.w;
    st4(state + row * kSlice + 4 * cg, v);
  }

  // A chunk's steps around its products.
  const auto load_u = [&](const float* rec, float4 (&u)[kXRows]) {  // U's rows at our columns
#pragma unroll
    for (int i = 0; i < kXRows; ++i) {
      u[i] = w_rows ? ld4(rec + R::kTileFloats + (kXRows * rg + i) * a.head_v + col0 + 4 * cg)
                    : float4{0.f, 0.f, 0.f, 0.f};
    }
  };
  // V' = U - W S (rows 0 .. 63), Qg S (rows 64 .. 127)
  const auto store_products = [&](const float4 (&u)[kXRows], const float (&x)[kXRows][4]) {
#pragma unroll
    for (int r = 0; r < kXRows; ++r) {
      const int row = kXRows * rg + r;
      if (w_rows) {
        st4(vnew + row * kSlice + 4 * cg, float4{u[r].x - x[r][0], u[r].y - x[r][1],
                                                u[r].z - x[r][2], u[r].w - x[r][3]});
      } else {
        st4(qs + (row - kPar) * kSlice + 4 * cg, float4{x[r][0], x[r][1], x[r][2], x[r][3]});
      }
    }
  };
  const auto store_outputs = [&](int64_t tok0, int n, const float (&o)[kOCols]) {
    if (to < n) {
      const int64_t at =
          (tok0 + to) * a.out_tok_stride + h * a.out_head_stride + col0 + kOCols * og;
#pragma unroll
      for (int c = 0; c < kOCols; ++c) store_any(a.out, at + c, a.qkv_kind, o[c]);
    }
  };
  const auto decay_state = [&](float chunk_decay) {
#pragma unroll
    for (int r = 0; r < kSRows; ++r) {
#pragma unroll
      for (int c = 0; c < 4; ++c) own[r][c] *= chunk_decay;
    }
  };
  // S += Kd^T V' over token `t` of V', Kd's row `kd_row` (K floats, ours at rg * kSRows)
  const auto update_state = [&](int t, const float* kd_row) {
    float vr[4], kv[kSRows];
    ld_n(vnew + t * kSlice + 4 * cg, vr);
    ld_n(kd_row + rg * kSRows, kv);
#pragma unroll
    for (int r = 0; r < kSRows; ++r) {
#pragma unroll
      for (int c = 0; c < 4; ++c) own[r][c] = fmaf(kv[r], vr[c], own[r][c]);
    }
  };
  const auto store_state = [&] {
#pragma unroll
    for (int r = 0; r < kSRows; ++r) {
      st4(state + (rg * kSRows + r) * kSlice + 4 * cg,
          float4{own[r][0], own[r][1], own[r][2], own[r][3]});
    }
  };

  __shared__ __align__(16) float stage[2][kTile];  // the record's tiles, two in flight
  float4 next[kTileVecs];
  if (s.p0 < p_end) {
    load_tile(rec0, 0, next);
    store_tile(stage[0], next);
  }
  __syncthreads();
  int buf = 0;
  for (int p = s.p0; p < p_end; ++p) {
    const float* rec = rec0 + (p - s.p0) * rec_step;
    const int64_t tok0 = sq.start + static_cast<int64_t>(p) * kPar;
    const int n = static_cast<int>(min(static_cast<int64_t>(kPar), sq.end - tok0));
    const float chunk_decay = rec[R::kTileFloats + static_cast<int64_t>(kPar) * a.head_v];
    float4 u[kXRows];  // U's rows kXRows rg .. at this block's columns (W's rows only)
    load_u(rec, u);
    float x[kXRows][4];  // [W; Qg] S: rows kXRows rg .., columns 4 cg ..
#pragma unroll
    for (int i = 0; i < kXRows; ++i) {
#pragma unroll
      for (int c = 0; c < 4; ++c) x[i][c] = 0.f;
    }
    float o[kOCols];
#pragma unroll
    for (int c = 0; c < kOCols; ++c) o[c] = 0.f;
#pragma unroll 1
    for (int i = 0; i < R::kTiles; ++i) {
      const bool more = i + 1 < R::kTiles || p + 1 < p_end;
      if (more) load_tile(i + 1 < R::kTiles ? rec : rec + rec_step, (i + 1) % R::kTiles, next);
      const float* tile = stage[buf];
      if (i < R::kWqTiles) {  // [W; Qg] S, key rows 16 i ..
#pragma unroll 4
        for (int kk = 0; kk < 16; ++kk) {
          float ar[kXRows], sr[4];
          ld_n(tile + kk * 128 + kXRows * rg, ar);
          ld_n(state + (16 * i + kk) * kSlice + 4 * cg, sr);
#pragma unroll
          for (int r = 0; r < kXRows; ++r) {
#pragma unroll
            for (int c = 0; c < 4; ++c) x[r][c] = fmaf(ar[r], sr[c], x[r][c]);
          }
        }
        if (i == R::kWqTiles - 1) store_products(u, x);
      } else if (i < R::kWqTiles + R::kPTiles) {  // O = Qg S + P V', P^T rows 32 ph ..
        const int ph = i - R::kWqTiles;
        constexpr int kRowsP = kTile / kPar;  // 32
        if (ph == 0) ld_n(qs + to * kSlice + kOCols * og, o);
#pragma unroll 4
        for (int ss = 0; ss < kRowsP; ++ss) {
          const float pv = tile[ss * kPar + to];
          float vr[kOCols];
          ld_n(vnew + (kRowsP * ph + ss) * kSlice + kOCols * og, vr);
#pragma unroll
          for (int c = 0; c < kOCols; ++c) o[c] = fmaf(pv, vr[c], o[c]);
        }
        if (ph == R::kPTiles - 1) store_outputs(tok0, n, o);
      } else {  // S <- e^G_last S + Kd^T V', tokens kKdTokens dq ..
        const int dq = i - R::kWqTiles - R::kPTiles;
        if (dq == 0) decay_state(chunk_decay);
#pragma unroll 4
        for (int tt = 0; tt < R::kKdTokens; ++tt) {
          update_state(R::kKdTokens * dq + tt, tile + tt * K);
        }
        if (dq == R::kKdTiles - 1) store_state();
      }
      if (more) store_tile(stage[buf ^ 1], next);
      __syncthreads();
      buf ^= 1;
    }
  }
  if (a.final_state != nullptr) {
#pragma unroll
    for (int r = 0; r < kSRows; ++r) {
      st4(a.final_state + st_at + (rg * kSRows + r) * a.head_v,
          float4{own[r][0], own[r][1], own[r][2], own[r][3]});
    }
  }
}

#include "gated_delta_pair16.cuh"

// The state slot of sequence `seq` (its own index without `indices`) and whether it is one.
ATTN_DEVICE int64_t conv_slot(const AttnGdnConvArgs& a, int seq, bool& valid) {
  const int64_t slot = a.indices != nullptr ? load_index(a.indices, seq, a.index_kind) : seq;
  valid = a.conv_state != nullptr && slot >= 0 && slot < a.num_slots;
  return slot;
}

ATTN_DEVICE int64_t state_at(const AttnGdnConvArgs& a, int64_t slot, int d, int pos) {
  return slot * a.state_slot_stride + d * a.state_dim_stride + pos * a.state_pos_stride;
}

// A thread of the per-sequence grids (ceil(dim / 128), N): its channel, its sequence and that
// sequence's state slot (conv_slot).
struct ConvThread {
  int d, seq;
  int64_t slot;
  bool valid;
};

ATTN_DEVICE ConvThread conv_thread(const AttnGdnConvArgs& a) {
  ConvThread at;
  at.d = blockIdx.x * kThreads + threadIdx.x;
  at.seq = blockIdx.y;
  at.slot = conv_slot(a, at.seq, at.valid);
  return at;
}

// Channel d's window in a state slot: positions [0, W - 1), the inputs before the next token.
template <int W>
ATTN_DEVICE void load_window(const AttnGdnConvArgs& a, int64_t slot, int d, bool read,
                             float (&win)[W - 1]) {
#pragma unroll
  for (int j = 0; j < W - 1; ++j) {
    win[j] = read ? load_any(a.conv_state, state_at(a, slot, d, j), a.state_kind) : 0.f;
  }
}

template <int W>
ATTN_DEVICE void store_window(const AttnGdnConvArgs& a, int64_t slot, int d,
                              const float (&win)[W - 1]) {
#pragma unroll
  for (int j = 0; j < W - 1; ++j) {
    store_any(a.conv_state, state_at(a, slot, d, j), a.state_kind, win[j]);
  }
}

template <int W>
ATTN_DEVICE void load_taps(const AttnGdnConvArgs& a, int d, float (&w)[W], float& bias) {
#pragma unroll
  for (int j = 0; j < W; ++j) {
    w[j] = load_any(a.weight, d * a.weight_dim_stride + j * a.weight_tap_stride, a.weight_kind);
  }
  bias = a.bias != nullptr ? load_any(a.bias, d * a.bias_stride, a.bias_kind) : 0.f;
}

// Grid (ceil(dim / 128), N): thread (seq, channel) slides its window over the new tokens.
template <int W>
__global__ void __launch_bounds__(kThreads) conv_update(AttnGdnConvArgs a) {
  const ConvThread at = conv_thread(a);
  if (at.d >= a.dim) return;
  const int d = at.d, seq = at.seq;
  float w[W], bias;
  load_taps<W>(a, d, w, bias);
  float win[W - 1];
  load_window<W>(a, at.slot, d, at.valid, win);
  for (int t = 0; t < a.tokens; ++t) {
    const float xt = load_any(a.x, seq * a.x_stride0 + d * a.x_stride1 + t * a.x_stride2, a.x_kind);
    float acc = w[W - 1] * xt;
#pragma unroll
    for (int j = 0; j < W - 1; ++j) acc += w[j] * win[j];
    acc += bias;
    if (a.silu) acc = silu(acc);
    const int64_t o = seq * a.out_stride0 + d * a.out_stride1 + t * a.out_stride2;
    store_any(a.out, o, a.x_kind, at.valid ? acc : 0.f);
#pragma unroll
    for (int j = 0; j < W - 2; ++j) win[j] = win[j + 1];
    win[W - 2] = xt;
  }
  if (at.valid) store_window<W>(a, at.slot, d, win);
}

// The sequence holding token t: the last s with query_start_loc[s] <= t (empty ones skipped).
ATTN_DEVICE int sequence_of(const AttnGdnConvArgs& a, int t) {
  int lo = 0, hi = a.num_seqs;  // query_start_loc[lo] <= t < query_start_loc[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (load_index(a.query_start_loc, mid, a.offset_kind) <= t) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Grid (ceil(tokens / 16), ceil(dim / 128)): thread (tile, channel) writes 16 outputs; inputs
// before a sequence's first token come from its state slot (or are zeros).
template <int W>
__global__ void __launch_bounds__(kThreads) conv_prefill_out(AttnGdnConvArgs a) {
  const int d = blockIdx.y * kThreads + threadIdx.x;
  const int t0 = blockIdx.x * kConvTokens;
  if (d >= a.dim) return;
  float w[W], bias;
  load_taps<W>(a, d, w, bias);
  int seq = sequence_of(a, t0);
  int64_t start = load_index(a.query_start_loc, seq, a.offset_kind);
  int64_t next = load_index(a.query_start_loc, seq + 1, a.offset_kind);
  const int end = min(t0 + kConvTokens, a.tokens);
  for (int t = t0; t < end; ++t) {
    while (t >= next) {  // the next non-empty sequence
      ++seq;
      start = next;
      next = load_index(a.query_start_loc, seq + 1, a.offset_kind);
    }
    bool valid;
    const int64_t slot = conv_slot(a, seq, valid);
    const bool prior = valid && a.has_initial_state != nullptr && a.has_initial_state[seq] != 0;
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const int64_t pos = t - (W - 1) + j;
      float xv = 0.f;
      if (pos >= start) {
        xv = load_any(a.x, d * a.x_stride0 + pos * a.x_stride1, a.x_kind);
      } else if (prior) {
        const int at = static_cast<int>(W - 1 - (start - pos));
        xv = load_any(a.conv_state, state_at(a, slot, d, at), a.state_kind);
      }
      acc += w[j] * xv;
    }
    acc += bias;
    if (a.silu) acc = silu(acc);
    store_any(a.out, d * a.out_stride0 + t * a.out_stride1, a.x_kind, acc);
  }
}

// Grid (ceil(dim / 128), N): thread (seq, channel) writes its sequence's last W - 1 inputs
// (reaching into the old window for a sequence shorter than that) to the slot.
template <int W>
__global__ void __launch_bounds__(kThreads) conv_prefill_state(AttnGdnConvArgs a) {
  const ConvThread at = conv_thread(a);
  if (at.d >= a.dim || !at.valid) return;
  const int d = at.d, seq = at.seq;
  const int64_t start = load_index(a.query_start_loc, seq, a.offset_kind);
  const int64_t len = load_index(a.query_start_loc, seq + 1, a.offset_kind) - start;
  const bool prior = a.has_initial_state != nullptr && a.has_initial_state[seq] != 0;
  float win[W - 1];
  load_window<W>(a, at.slot, d, prior && len < W - 1, win);
  float fresh[W - 1];
#pragma unroll
  for (int j = 0; j < W - 1; ++j) {
    const int64_t f = len + j;  // position in [old window | tokens]
    float value = 0.f;
    if (f >= W - 1) {
      value = load_any(a.x, d * a.x_stride0 + (start + f - (W - 1)) * a.x_stride1, a.x_kind);
    } else {
#pragma unroll
      for (int m = 0; m < W - 1; ++m) value = m == f ? win[m] : value;
    }
    fresh[j] = value;
  }
  store_window<W>(a, at.slot, d, fresh);
}

typedef void (*DecodeKernel)(AttnGdnDecodeArgs);
typedef void (*ConvKernel)(AttnGdnConvArgs);

inline DecodeKernel decode_for(int head_k, bool key_last) {
  if (key_last) {
    return head_k == 64 ? decode_step<64, true> : head_k == 128 ? decode_step<128, true> : nullptr;
  }
  return head_k == 64 ? decode_step<64, false> : head_k == 128 ? decode_step<128, false> : nullptr;
}

// The pool's rows of one column contiguous and 16-byte aligned: the float4 body serves it.
inline bool key_last_pool(const AttnGdnDecodeArgs& a) {
  return a.state_k_stride == 1 && a.state_v_stride % 4 == 0 && a.state_head_stride % 4 == 0 &&
         a.state_slot_stride % 4 == 0 && reinterpret_cast<uintptr_t>(a.state_pool) % 16 == 0;
}

typedef void (*PrefillKernel)(AttnGdnPrefillArgs);

inline PrefillKernel prefill_for(int head_k) {
  return head_k == 64 ? recurrent_prefill<64> : head_k == 128 ? recurrent_prefill<128> : nullptr;
}

inline PrefillKernel chunked_for(int head_k) {
  return head_k == 64 ? chunked_prefill<64> : head_k == 128 ? chunked_prefill<128> : nullptr;
}

typedef void (*ChunkKernel)(AttnGdnPrefillArgs, ChunkSegment);

inline ChunkKernel chunk_prep_for(int head_k) {
  return head_k == 64 ? chunk_prep<64> : head_k == 128 ? chunk_prep<128> : nullptr;
}

inline ChunkKernel chunk_pass_for(int head_k) {
  return head_k == 64 ? chunk_pass<64> : head_k == 128 ? chunk_pass<128> : nullptr;
}

// The matrix-unit pair for 16-bit inputs (gated_delta_pair16.cuh): K = 128 only, NVIDIA only.
inline ChunkKernel chunk_prep16_for(int head_k, int kind) {
#if defined(ATTN_GDN_HAVE_PASS16)
  if (head_k == 128 && kind == kFloat16) return chunk_prep16<128, kFloat16>;
  if (head_k == 128 && kind == kBFloat16) return chunk_prep16<128, kBFloat16>;
#endif
  (void)head_k, (void)kind;
  return nullptr;
}

inline ChunkKernel chunk_pass16_for(int head_k, int kind) {
#if defined(ATTN_GDN_HAVE_PASS16)
  if (head_k == 128 && kind == kFloat16) return chunk_pass16<128, kFloat16>;
  if (head_k == 128 && kind == kBFloat16) return chunk_pass16<128, kBFloat16>;
#endif
  (void)head_k, (void)kind;
  return nullptr;
}

// `bytes` of dynamic shared memory for `kernel`, opted into on the current device (above the
// 48 KiB a launch gets by default): the bytes, 0 for no kernel, -1 if the opt-in failed.
inline int dynamic_smem(ChunkKernel kernel, int bytes) {
  if (kernel == nullptr) return 0;
  const cudaError_t rc = cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                              cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  return rc == cudaSuccess ? bytes : -1;
}

inline bool kind_ok(int kind) { return kind == kFloat32 || kind == kFloat16 || kind == kBFloat16; }
inline bool index_ok(int kind) { return kind == 0 || kind == 1; }

inline bool prefill_ok(const AttnGdnPrefillArgs& a) {
  return a.num_seqs >= 1 && a.num_seqs <= kMaxGrid && a.num_heads >= 1 &&
         a.num_value_heads % a.num_heads == 0 && a.num_value_heads <= kMaxGrid &&
         a.head_v >= kCols && a.head_v % kCols == 0 && a.cu_seqlens != nullptr &&
         kind_ok(a.qkv_kind) && kind_ok(a.g_kind) && kind_ok(a.beta_kind) &&
         index_ok(a.offset_kind);
}

// Each segment's chunk_prep, then its pass (grid (V / pass_cols, HV, width)).
inline int launch_pair(ChunkKernel prep, int prep_smem, ChunkKernel pass, int pass_cols,
                       int pass_threads, int pass_smem, const AttnGdnPrefillArgs& a,
                       const int32_t* segments, int num_segments, cudaStream_t st) {
  if (prep == nullptr || pass == nullptr || prep_smem < 0 || pass_smem < 0 || !prefill_ok(a) ||
      a.head_v % pass_cols != 0 || a.workspace == nullptr || a.seq_order == nullptr ||
      a.final_state == nullptr || segments == nullptr || num_segments < 1) {
    return cudaErrorInvalidValue;
  }
  for (int i = 0; i < num_segments; ++i) {
    const ChunkSegment seg = {segments[4 * i], segments[4 * i + 1], segments[4 * i + 2],
                              segments[4 * i + 3]};
    if (seg.base < 0 || seg.width < 1 || seg.base + seg.width > a.num_seqs || seg.p0 < 0 ||
        seg.depth < 1 || seg.depth > kMaxGrid || seg.width > kMaxGrid) {
      return cudaErrorInvalidValue;
    }
    prep<<<dim3(a.num_value_heads, seg.depth, seg.width), kPrepThreads, prep_smem, st>>>(a, seg);
    int rc = static_cast<int>(cudaGetLastError());
    if (rc != 0) return rc;
    pass<<<dim3(a.head_v / pass_cols, a.num_value_heads, seg.width), pass_threads, pass_smem,
           st>>>(a, seg);
    rc = static_cast<int>(cudaGetLastError());
    if (rc != 0) return rc;
  }
  return 0;
}

// One block per (kCols value columns, value head, sequence), each walking its whole sequence.
inline int launch_prefill(PrefillKernel kernel, const AttnGdnPrefillArgs& a, cudaStream_t stream) {
  if (kernel == nullptr || !prefill_ok(a)) return cudaErrorInvalidValue;
  const dim3 grid(a.head_v / kCols, a.num_value_heads, a.num_seqs);
  kernel<<<grid, kThreads, 0, stream>>>(a);
  return static_cast<int>(cudaGetLastError());
}

inline bool conv_ok(const AttnGdnConvArgs& a) {
  return a.num_seqs >= 1 && a.dim >= 1 && a.tokens >= 0 && a.width == kWidth &&
         kind_ok(a.x_kind) && kind_ok(a.weight_kind) &&
         (a.bias == nullptr || kind_ok(a.bias_kind)) &&
         (a.conv_state == nullptr || kind_ok(a.state_kind)) &&
         (a.indices == nullptr || index_ok(a.index_kind)) && a.num_seqs <= kMaxGrid;
}

}  // namespace gdn
}  // namespace attn

extern "C" {

ATTN_COMMON_EXPORTS(attn_gdn, ATTN_GDN_ABI_VERSION)

int attn_gdn_decode(const AttnGdnDecodeArgs* args, void* stream) {
  using namespace attn::gdn;
  const AttnGdnDecodeArgs& a = *args;
  const DecodeKernel kernel = decode_for(a.head_k, key_last_pool(a));
  const int group = a.num_heads > 0 ? a.num_value_heads / a.num_heads : 0;
  if (kernel == nullptr || a.num_seqs < 1 || a.num_seqs > kMaxGrid || group < 1 ||
      a.num_value_heads % a.num_heads != 0 || a.heads_per_block < 1 ||
      group % a.heads_per_block != 0 || a.num_value_heads / a.heads_per_block > kMaxGrid ||
      a.head_v < kCols || a.head_v % kCols != 0 || !kind_ok(a.qkv_kind) || !kind_ok(a.g_kind) ||
      !kind_ok(a.beta_kind) || !index_ok(a.index_kind)) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(a.head_v / kCols, a.num_value_heads / a.heads_per_block, a.num_seqs);
  kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a);
  return static_cast<int>(cudaGetLastError());
}

int attn_gdn_recurrent_prefill(const AttnGdnPrefillArgs* args, void* stream) {
  using namespace attn::gdn;
  return launch_prefill(prefill_for(args->head_k), *args, static_cast<cudaStream_t>(stream));
}

int attn_gdn_chunked_prefill(const AttnGdnPrefillArgs* args, void* stream) {
  using namespace attn::gdn;
  return launch_prefill(chunked_for(args->head_k), *args, static_cast<cudaStream_t>(stream));
}

int64_t attn_gdn_chunk_record_floats(int head_k, int head_v) {
  return attn::gdn::record_floats(head_k, head_v);
}

int attn_gdn_chunk_parallel_prefill(const AttnGdnPrefillArgs* args, const int32_t* segments,
                                    int num_segments, void* stream) {
  using namespace attn::gdn;
  const AttnGdnPrefillArgs& a = *args;
  return launch_pair(chunk_prep_for(a.head_k), 0, chunk_pass_for(a.head_k), kSlice, kPassThreads,
                     0, a, segments, num_segments, static_cast<cudaStream_t>(stream));
}

int64_t attn_gdn_chunk_record16_bytes(int head_k, int head_v) {
  using namespace attn::gdn;
#if defined(ATTN_GDN_HAVE_PASS16)
  if (chunk_prep16_for(head_k, attn::kBFloat16) != nullptr && head_v >= kSlice16 &&
      head_v % kSlice16 == 0 && head_v <= kMaxV16) {
    return record16_bytes(head_k, head_v);
  }
#endif
  (void)head_k, (void)head_v;
  return 0;
}

int attn_gdn_chunk_parallel_prefill16(const AttnGdnPrefillArgs* args, const int32_t* segments,
                                      int num_segments, void* stream) {
  using namespace attn::gdn;
  const AttnGdnPrefillArgs& a = *args;
  const ChunkKernel prep = chunk_prep16_for(a.head_k, a.qkv_kind);
  const ChunkKernel pass = chunk_pass16_for(a.head_k, a.qkv_kind);
  if (prep == nullptr || pass == nullptr) return cudaErrorNotSupported;
#if defined(ATTN_GDN_HAVE_PASS16)
  // whole 16-byte rows of k, q and v (asynchronous copies), V within chunk_prep16's tile
  const bool rows16 = reinterpret_cast<uintptr_t>(a.q) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(a.k) % 16 == 0 &&
                      reinterpret_cast<uintptr_t>(a.v) % 16 == 0 && a.q_tok_stride % 8 == 0 &&
                      a.q_head_stride % 8 == 0 && a.k_tok_stride % 8 == 0 &&
                      a.k_head_stride % 8 == 0 && a.v_tok_stride % 8 == 0 &&
                      a.v_head_stride % 8 == 0;
  if (!rows16 || a.head_v > kMaxV16) return cudaErrorInvalidValue;
  return launch_pair(prep, dynamic_smem(prep, Prep16Smem<128>::kBytes), pass, kSlice16,
                     kPass16Threads, dynamic_smem(pass, Pass16Smem<128>::kBytes), a, segments,
                     num_segments, static_cast<cudaStream_t>(stream));
#else
  (void)num_segments, (void)segments, (void)stream;
  return cudaErrorNotSupported;
#endif
}

int attn_gdn_conv_update(const AttnGdnConvArgs* args, void* stream) {
  using namespace attn::gdn;
  const AttnGdnConvArgs& a = *args;
  if (!conv_ok(a) || a.conv_state == nullptr) return cudaErrorInvalidValue;
  const dim3 grid((a.dim + kThreads - 1) / kThreads, a.num_seqs);
  const ConvKernel kernel = conv_update<kWidth>;  // named: the host rewrite takes a plain name
  kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a);
  return static_cast<int>(cudaGetLastError());
}

int attn_gdn_conv_prefill(const AttnGdnConvArgs* args, void* stream) {
  using namespace attn::gdn;
  const AttnGdnConvArgs& a = *args;
  if (!conv_ok(a) || a.query_start_loc == nullptr || !index_ok(a.offset_kind) ||
      (a.dim + kThreads - 1) / kThreads > kMaxGrid) {
    return cudaErrorInvalidValue;
  }
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int channel_blocks = (a.dim + kThreads - 1) / kThreads;
  if (a.tokens > 0) {
    const dim3 grid((a.tokens + kConvTokens - 1) / kConvTokens, channel_blocks);
    const ConvKernel outputs = conv_prefill_out<kWidth>;
    outputs<<<grid, kThreads, 0, s>>>(a);
    const int rc = static_cast<int>(cudaGetLastError());
    if (rc != 0) return rc;
  }
  if (a.conv_state == nullptr) return 0;
  const dim3 grid(channel_blocks, a.num_seqs);
  const ConvKernel states = conv_prefill_state<kWidth>;
  states<<<grid, kThreads, 0, s>>>(a);
  return static_cast<int>(cudaGetLastError());
}

int attn_gdn_kernel_info(int which, int head_k, AttnKernelInfo* info) {
  using namespace attn::gdn;
  const void* kernel = nullptr;
  if (which == 0) kernel = reinterpret_cast<const void*>(decode_for(head_k, false));
  if (which == 6) kernel = reinterpret_cast<const void*>(decode_for(head_k, true));
  if (which == 1) kernel = reinterpret_cast<const void*>(conv_update<kWidth>);
  if (which == 2) kernel = reinterpret_cast<const void*>(conv_prefill_out<kWidth>);
  if (which == 3) kernel = reinterpret_cast<const void*>(conv_prefill_state<kWidth>);
  if (which == 4) kernel = reinterpret_cast<const void*>(prefill_for(head_k));
  if (which == 5) kernel = reinterpret_cast<const void*>(chunked_for(head_k));
  if (which == 7) kernel = reinterpret_cast<const void*>(chunk_prep_for(head_k));
  if (which == 8) kernel = reinterpret_cast<const void*>(chunk_pass_for(head_k));
  int smem = 0;
#if defined(ATTN_GDN_HAVE_PASS16)
  if (which == 9 || which == 10) {
    const ChunkKernel k16 = which == 9 ? chunk_prep16_for(head_k, attn::kBFloat16)
                                       : chunk_pass16_for(head_k, attn::kBFloat16);
    smem = dynamic_smem(k16, which == 9 ? Prep16Smem<128>::kBytes : Pass16Smem<128>::kBytes);
    kernel = reinterpret_cast<const void*>(k16);
  }
#endif
  if (kernel == nullptr || smem < 0) return cudaErrorInvalidValue;
  const int threads = which == 7 || which == 9 ? kPrepThreads
                      : which == 8             ? kPassThreads
#if defined(ATTN_GDN_HAVE_PASS16)
                      : which == 10 ? kPass16Threads
#endif
                                    : kThreads;
  return attn::read_kernel_info(kernel, threads, info, smem);
}

}  // extern "C"
