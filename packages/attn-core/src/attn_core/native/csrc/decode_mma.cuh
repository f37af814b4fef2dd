// The decode partition on NVIDIA's matrix units: 16-bit queries over a cache of the same type
// or an fp8 cache.
//
// Included by paged_decode.cu (it uses that file's kThreads and kLog2e); its partition kernel
// runs this body where ATTN_DECODE_MMA is on, and the CUDA-core body elsewhere (fp32 queries,
// CoreX).
//
// Why: the CUDA-core body spends 2 x group x head FMAs per token and KV head (group 6, head 256:
// 3072 per 1 KiB of K+V) and waits on each tile's loads; at 1 x 100K on the H200 it ran at 56 %
// of the copy rate with about half its issue slots busy (ncu). Here the block's GQA heads are
// the rows of a 16-row matrix tile (group <= 8, the rest zero), so the score and P.V products
// are a few `wmma` 16x16x16 steps per tile, and keys and values stream into shared memory with
// asynchronous copies, kStages - 1 tiles ahead of the one being multiplied.
//
// One block: 4 warps, one (sequence, KV head, head group, partition), tiles of kTW tokens in a
// ring of kStages (dynamic shared memory: 64 KiB at head 256, so the launcher opts in). Per tile:
//   A. wait for this thread's copies of the tile, then a barrier: every thread's landed, and
//      every warp finished the previous tile's P.V, so that stage is free: the copies of the
//      tile kStages - 1 ahead are issued into it and fly during the rest of this tile;
//   1. S = Q K^T split over the head dims: warp w multiplies dims [w D/4, (w+1) D/4) and
//      stores its 16 x kTW partial (fp32);                                      barrier B;
//   2. softmax, 8 threads per row (kTW / 8 columns each): the partials summed, scaled (fp32:
//      scale x log2(e), never folded into 16-bit queries), ALiBi, masked past the tile's end,
//      running max and sum, probabilities stored as 16-bit, alpha per row;     barrier C;
//   3. O = alpha O + P V, warp w owning head dims [w D/4, (w+1) D/4) of every row.
// The fragments' element layout is unspecified, so each warp learns its accumulator rows once
// from an index matrix (as attn_mma.cuh's generic path does) and the result leaves through
// shared memory (store_matrix_sync). Keys past the tile's end are zeros (their scores -inf),
// values past it are zero-filled by the copies, so a reused page's inf/NaN never meets a zero
// probability.
//
// fp8 caches: the copies bring the raw bytes (half the traffic) into a ring of byte stages, and
// after barrier A each warp widens its own quarter of the head dims (the only K columns and V
// rows its products read) into one 16-bit tile, exactly (sm_89+ converts in hardware; older
// targets read e4m3 as value x 2^-8, folded into the fp32 scales; a scale is never applied to
// 16-bit data), then a __syncwarp: no extra block barrier. The CUDA-core body ran fp8 at
// 0.92-1.0x of its fp16 time (conversion and FMAs per byte, not bytes, bound it).
//
// Measured (H200, 2026-12-02, Qwen3.6 fp16, 1 x 102400, CUDA-graph replay): 0.150 ms against
// the CUDA-core body's 0.177; still 1.5x the copy-rate floor. With the copies alone (no
// products) the ring of two stages took 0.156 ms and the products alone (no copies) 0.087: the
// time is the copies' latency more than the arithmetic, and a third stage did not shorten it
// (two stages at 4 blocks per SM 0.1507, three at 3 blocks 0.1505, four at 2 blocks 0.156,
// 32-token tiles with two stages at 2 blocks 0.201). Three stages are the default because the
// split rule's fill-once partition count is their fastest at every row measured. Two barriers
// a tile instead of three (tile j's P.V and tile j + 1's scores in one phase) measured the same
// (0.150 ms; with four stages, two blocks per SM, 0.201), H200, 2026-12-03.
#pragma once

#include "attn_async.cuh"
#include "attn_convert.cuh"
#include "attn_mma.cuh"

// Tuning knobs (attn_core/native/facts.py mirrors the defaults; measurements above)
#ifndef ATTN_DECODE_TILE
#define ATTN_DECODE_TILE 16  // tokens per tile: 16 or 32
#endif
#ifndef ATTN_DECODE_STAGES
#define ATTN_DECODE_STAGES 3  // tiles in shared memory: STAGES - 1 of them in flight
#endif

#if defined(ATTN_HAVE_NV_WMMA) && defined(ATTN_ASYNC_COPY)
#define ATTN_DECODE_HAVE_MMA 1
#endif

#if defined(ATTN_DECODE_HAVE_MMA)
// sm_89+ widens two fp8 values per instruction (cvt.rn.f16x2.e4m3x2 / .e5m2x2, through
// cuda_fp8.h), exactly; older targets use attn_convert.cuh's bit moves (e4m3 as value x 2^-8).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#include <cuda_fp8.h>
#define ATTN_DECODE_HW_FP8 1
#else
#define ATTN_DECODE_HW_FP8 0
#endif

namespace attn {
namespace decode_mma {

constexpr int kRows = 16;    // matrix rows: the block's head slots (GROUP <= 8), zero past them
constexpr int kTW = ATTN_DECODE_TILE;
constexpr int kStages = ATTN_DECODE_STAGES;
constexpr int kWarps = 4;    // each owns a quarter of the head dims in both products
constexpr int kPages = 256;  // page ids staged per window (4096 tokens at block 16)
constexpr int kChunk = 8;    // tokens per 16-byte value copy (16-bit elements)
constexpr int kCols = kTW / 8;  // softmax columns per thread (8 threads per row)
static_assert(kTW == 16 || kTW == 32, "a tile is one or two wmma steps of tokens");
static_assert(kStages >= 2, "at least one tile in flight while one is multiplied");

// Whether a cache kind is staged as raw fp8 bytes and widened in shared memory.
__host__ __device__ constexpr bool raw_cache(int ckind) { return elem_bytes(ckind) == 1; }

// The block's shared memory (dynamic: above 48 KiB the kernel opts in). Every region a wmma
// pointer lands in starts on 32 bytes. 16-bit caches: the copies land in kStages 16-bit stages
// the products read. fp8 caches: they land in kStages byte stages (rk, rv) and each tile is
// widened into one 16-bit stage; the byte arrays are 16 bytes where unused.
template <int CKIND, int HEAD_MAX>
struct alignas(128) Smem {
  static constexpr bool kRaw = raw_cache(CKIND);
  static constexpr int kKP = HEAD_MAX + 8;  // Q and K row pitch: +16 B moves rows off a bank
  // V row pitch: a 16-token tile's fragment is one contiguous 512-byte block (conflict-free);
  // 32-token rows (64 B) would put a fragment's rows on two bank groups, so they are skewed
  static constexpr int kVP = kTW == 16 ? kTW : kTW + 8;
  static constexpr int kPP = kTW + 8;
  static constexpr int kWide = kRaw ? 1 : kStages;  // 16-bit stages
  static constexpr int kRawStages = kRaw ? kStages : 1;
  uint16_t q[kRows][kKP];            // raw query bits, zero past the group and the head size
  uint16_t k[kWide][kTW][kKP];       // per stage: one key per row
  uint16_t v[kWide][HEAD_MAX][kVP];  // per stage: one head dim per row
  // fp8 byte stages: keys [token][dim] (HEAD_MAX bytes a row), values [dim][token]
  alignas(16) uint8_t rk[kRawStages][kRaw ? kTW : 1][kRaw ? HEAD_MAX : 16];
  alignas(16) uint8_t rv[kRawStages][kRaw ? HEAD_MAX : 1][kRaw ? kTW : 16];
  float s[kWarps][kRows][kTW];       // per warp: partial scores; the index matrix at first
  uint16_t p[kRows][kPP];            // probabilities (P.V's A operand)
  float alpha[kRows];                // per row: rescale factor; at the end the sum
  float m[kRows];                    // per row at the end: the running max
  int pages[kPages];

  // The partition's unnormalised output, [kRows][HEAD_MAX] fp32, once every product is done:
  // over the stages the copies filled.
  ATTN_DEVICE float* out_tile() {
    if constexpr (kRaw) {
      static_assert(sizeof(float) * kRows * HEAD_MAX <= sizeof(rk) + sizeof(rv), "O fits");
      return reinterpret_cast<float*>(&rk[0][0][0]);  // rv follows rk (both 16-byte multiples)
    } else {
      static_assert(sizeof(float) * kRows * HEAD_MAX <= sizeof(k), "O fits the key stages");
      return reinterpret_cast<float*>(&k[0][0][0]);
    }
  }
};

// Bytes of dynamic shared memory the body needs (attn_core/native/facts.py mirrors it).
template <int CKIND, int HEAD_MAX>
__host__ __device__ constexpr int smem_bytes() {
  return static_cast<int>(sizeof(Smem<CKIND, HEAD_MAX>));
}

// One thread's share of every tile's copies, fixed for the whole partition. Each thread copies
// the key vectors of one token (t) and, for 16-bit caches, the values of one 8-token half (h)
// of the tile (fp8: all 16 tokens of its head dims, one 16-byte copy each, two 8-byte ones
// where pages hold 8 tokens), so one page lookup serves all its copies of a tile and the
// offsets inside a page are precomputed: with the offsets recomputed per copy (64-bit
// products, a page lookup each) the loop ran ~590 instructions per warp per tile, ~400 of them
// address arithmetic (ncu, H200, 1 x 100K). Destinations are byte offsets into a stage.
template <int CKIND, int HEAD_MAX>
struct Copier {
  using S = Smem<CKIND, HEAD_MAX>;
  static constexpr bool kRaw = raw_cache(CKIND);
  static constexpr int kX = 16 / elem_bytes(CKIND);  // elements per 16-byte key vector
  static constexpr int kKeyVecStep = kThreads / kTW;  // key vectors between copies
  static constexpr int kKeyCopies = (kTW * (HEAD_MAX / kX) + kThreads - 1) / kThreads;
  static constexpr int kKeyDst = kRaw ? 16 * kKeyVecStep : 2 * 8 * kKeyVecStep;
  // 16-bit values: 16-byte copies of kChunk tokens, two threads a head dim per 16-token tile;
  // fp8 values: one thread a head dim
  static constexpr int kValueThreadsPerDim = kRaw ? 1 : kTW / kChunk;
  static constexpr int kValueDimStep = kThreads / kValueThreadsPerDim;  // dims between copies
  static constexpr int kValueCopies = (HEAD_MAX + kValueDimStep - 1) / kValueDimStep;
  static constexpr int kValueDst = kRaw ? kValueDimStep * kTW : 2 * kValueDimStep * S::kVP;
  static_assert(!kRaw || kTW == 16, "fp8 value copies cover 16-token tiles");
  const uint8_t* k_head;
  const uint8_t* v_head;
  int64_t k_block_bytes, v_block_bytes;
  int bs_shift, bs_mask;
  int t, h;                // this thread's token (keys) and value half (16-bit caches)
  int k_off, k_step;       // byte offset inside a page of its first key copy, then the stride
  int v_off, v_step;
  int k_dst, v_dst;        // byte offsets inside a stage of its first copies
  int n_k, n_v;            // its copies inside the head size

  ATTN_DEVICE void init(int tid, int head_size, int block_size) {
    constexpr int kEB = elem_bytes(CKIND);
    t = tid % kTW;
    h = tid % kValueThreadsPerDim;
    const int c0 = tid / kTW, d0 = tid / kValueThreadsPerDim;
    k_off = c0 * block_size * 16;
    k_step = kKeyVecStep * block_size * 16;
    v_off = d0 * block_size * kEB;
    v_step = kValueDimStep * block_size * kEB;
    k_dst = kRaw ? t * HEAD_MAX + 16 * c0 : 2 * (t * S::kKP + 8 * c0);
    v_dst = kRaw ? d0 * kTW : 2 * (d0 * S::kVP + h * kChunk);
    n_k = c0 < head_size / kX ? (head_size / kX - c0 + kKeyVecStep - 1) / kKeyVecStep : 0;
    n_v = d0 < head_size ? (head_size - d0 + kValueDimStep - 1) / kValueDimStep : 0;
  }

  // Issue the copies of `len` (1..kTW) tokens from window offset `off` into `stage`; keys past
  // the tile's end and values past it are zeros (never a reused page's inf/NaN).
  ATTN_DEVICE void issue(S& s, int stage, int off, int len) const {
    uint8_t* kst = (kRaw ? &s.rk[stage][0][0] : reinterpret_cast<uint8_t*>(&s.k[stage][0][0]));
    uint8_t* vst = (kRaw ? &s.rv[stage][0][0] : reinterpret_cast<uint8_t*>(&s.v[stage][0][0]));
    kst += k_dst;
    vst += v_dst;
    if (t < len) {
      const int tok = off + t;
      const uint8_t* g = k_head + s.pages[tok >> bs_shift] * k_block_bytes +
                         ((tok & bs_mask) * 16 + k_off);
#pragma unroll
      for (int i = 0; i < kKeyCopies; ++i)
        if (i < n_k) copy16(kst + i * kKeyDst, g + i * k_step);
    } else {
#pragma unroll
      for (int i = 0; i < kKeyCopies; ++i)
        if (i < n_k) *reinterpret_cast<Vec16*>(kst + i * kKeyDst) = Vec16{{0u, 0u, 0u, 0u}};
    }
    if constexpr (kRaw) {
      if (bs_mask >= 15) {  // pages of >= 16 tokens: the tile is 16 bytes of one page per dim
        const uint8_t* g = v_head + s.pages[off >> bs_shift] * v_block_bytes +
                           ((off & bs_mask) + v_off);
#pragma unroll
        for (int i = 0; i < kValueCopies; ++i)
          if (i < n_v) copy16_zfill(vst + i * kValueDst, g + i * v_step, len);
      } else {  // 8-token pages: two 8-byte copies per dim (len >= 1: the first half is real)
        const int len1 = max(len - 8, 0);
        const uint8_t* g0 = v_head + s.pages[off >> bs_shift] * v_block_bytes + v_off;
        const uint8_t* g1 =
            v_head + s.pages[(len1 > 0 ? off + 8 : off) >> bs_shift] * v_block_bytes + v_off;
#pragma unroll
        for (int i = 0; i < kValueCopies; ++i) {
          if (i < n_v) {
            copy8_zfill(vst + i * kValueDst, g0 + i * v_step, min(len, 8));
            copy8_zfill(vst + i * kValueDst + 8, g1 + i * v_step, len1);
          }
        }
      }
      return;
    }
    const int valid = min(max(len - h * kChunk, 0), kChunk);  // tokens of this half
    const int tok = off + h * kChunk;
    const uint8_t* g = v_head + s.pages[(valid > 0 ? tok : off) >> bs_shift] * v_block_bytes +
                       ((tok & bs_mask) * 2 + v_off);
    if (valid == kChunk) {  // every tile but a sequence's last: one straight run of copies
#pragma unroll
      for (int i = 0; i < kValueCopies; ++i)
        if (i < n_v) copy16(vst + i * kValueDst, g + i * v_step);
    } else if (valid > 0) {
#pragma unroll
      for (int i = 0; i < kValueCopies; ++i)
        if (i < n_v) copy16_zfill(vst + i * kValueDst, g + i * v_step, 2 * valid);
    } else {
#pragma unroll
      for (int i = 0; i < kValueCopies; ++i)
        if (i < n_v) *reinterpret_cast<Vec16*>(vst + i * kValueDst) = Vec16{{0u, 0u, 0u, 0u}};
    }
  }
};

// The scale an fp8 cache's widened elements carry (e4m3 through bit moves: 2^-8).
template <int CKIND>
__device__ constexpr float widened_rescale() {
  return CKIND == kFp8E4M3 && !ATTN_DECODE_HW_FP8 ? kE4M3Rescale : 1.0f;
}

// Four fp8 bytes (element 0 lowest) as four 16-bit OUT elements, two per word.
template <int CKIND, int OUT>
ATTN_DEVICE void widen4(uint32_t four, uint32_t& lo, uint32_t& hi) {
#if ATTN_DECODE_HW_FP8
  constexpr __nv_fp8_interpretation_t kInterp = CKIND == kFp8E4M3 ? __NV_E4M3 : __NV_E5M2;
  const __half2_raw l =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(four), kInterp);
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(four >> 16), kInterp);
  lo = static_cast<uint32_t>(l.x) | (static_cast<uint32_t>(l.y) << 16);
  hi = static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
#else
  fp8x4_to_half2x2_bits<CKIND>(four, lo, hi);
#endif
  if (OUT == kBFloat16) {
    lo = half2_bits_to_exact_bf16x2_bits(lo);
    hi = half2_bits_to_exact_bf16x2_bits(hi);
  }
}

// 16 fp8 bytes -> 16 16-bit elements (two 16-byte vectors).
template <int CKIND, int OUT>
ATTN_DEVICE void widen16(const uint8_t* src, uint16_t* dst) {
  const Vec16 raw = load_vec<Vec16>(src);
  Vec16 wide[2];
#pragma unroll
  for (int w = 0; w < 4; ++w) widen4<CKIND, OUT>(raw.w[w], wide[w / 2].w[2 * (w % 2)],
                                                  wide[w / 2].w[2 * (w % 2) + 1]);
  reinterpret_cast<Vec16*>(dst)[0] = wide[0];
  reinterpret_cast<Vec16*>(dst)[1] = wide[1];
}

// fp8 caches: widen this warp's head dims [d0, d0 + SLICE) of byte stage `stage` (keys and
// values) into the 16-bit stage, 16 bytes a step (8-byte steps took ~240 instructions per warp
// and tile with the bit moves, 1 x 100K: 64 M against fp16's 39 M, ncu, H200, 2026-12-03); the
// warp's products read only these dims.
template <int CKIND, int QKIND, int HEAD_MAX, int SLICE>
ATTN_DEVICE void widen_slice(Smem<CKIND, HEAD_MAX>& s, int stage, int d0, int lane) {
  constexpr int kKeyUnits = kTW * SLICE / 16;  // 16 dims of one token
  constexpr int kValueUnits = SLICE;           // the tile's 16 tokens of one dim
  static_assert(kTW == 16, "a value unit is one dim's 16 tokens");
#pragma unroll
  for (int i = 0; i < (kKeyUnits + 31) / 32; ++i) {
    const int u = lane + 32 * i, tok = u / (SLICE / 16), d = d0 + 16 * (u % (SLICE / 16));
    if (kKeyUnits % 32 == 0 || u < kKeyUnits)
      widen16<CKIND, QKIND>(&s.rk[stage][tok][d], &s.k[0][tok][d]);
  }
#pragma unroll
  for (int i = 0; i < (kValueUnits + 31) / 32; ++i) {
    const int u = lane + 32 * i;
    if (kValueUnits % 32 == 0 || u < kValueUnits)
      widen16<CKIND, QKIND>(&s.rv[stage][d0 + u][0], &s.v[0][d0 + u][0]);
  }
}

template <int QKIND, int CKIND, int HEAD_MAX, int GROUP>
ATTN_DEVICE void partition_body(const AttnDecodeArgs& a, Smem<CKIND, HEAD_MAX>& s) {
  namespace wmma = nvcuda::wmma;
  using E = typename WmmaElem<QKIND>::T;
  using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, E, wmma::row_major>;
  using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, E, wmma::col_major>;
  using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
  using S = Smem<CKIND, HEAD_MAX>;
  constexpr bool kRaw = raw_cache(CKIND);
  static_assert(kRaw || CKIND == QKIND, "16-bit caches hold the queries' type");
  // what the widened elements carry (e4m3 by bit moves: x 2^-8): both scales undo it in fp32
  constexpr float kRescale = widened_rescale<CKIND>();
  constexpr int kSlice = HEAD_MAX / kWarps;  // head dims per warp
  constexpr int kSteps = kSlice / 16;         // 16-wide steps per warp
  static_assert(kThreads == kWarps * 32 && GROUP <= kRows, "4 warps of 32, <= 16 head slots");
  static_assert(FragC::num_elements <= 8, "rows are packed 4 bits per element in one word");

  // The block's work, as the CUDA-core body computes it (inline: routed through a struct
  // filled by a helper, the CUDA-core body lost its uniform registers and ran 40 % slower,
  // H200 1 x 100K: 0.246 ms against 0.176).
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int group = a.num_heads / a.num_kv_heads;
  const int head_groups = (group + GROUP - 1) / GROUP;
  const int kv_head = blockIdx.x / head_groups;
  const int g0 = (blockIdx.x % head_groups) * GROUP;
  const int G = min(GROUP, group - g0);  // real heads; rows G.. carry zero queries
  const int head0 = kv_head * group + g0;
  const int part = blockIdx.y;
  const int seq = blockIdx.z;
  const int D = a.head_size;
  const int seq_len = min(a.seq_lens[seq], a.table_width * a.block_size);
  const int start = part * a.partition_size;
  if (start >= seq_len) {
    if (a.num_partitions == 1) {  // an empty sequence: zeros, as the merge writes them
      for (int i = tid; i < G * D; i += kThreads) {
        store_elem<QKIND>(a.out, seq * a.out_seq_stride + (head0 + i / D) * a.out_head_stride +
                                     i % D, 0.0f);
      }
    }
    return;  // the merge reads only partitions that hold tokens
  }
  const int end = min(start + a.partition_size, seq_len);

  // queries (raw bits, exact), and zeros where copies never write: key columns and value rows
  // past the head size (a pad of NaN bits would poison 0 x NaN)
  const uint16_t* query = static_cast<const uint16_t*>(a.query);
  for (int i = tid; i < kRows * S::kKP; i += kThreads) {
    const int r = i / S::kKP, d = i % S::kKP;
    s.q[r][d] = r < G && d < D
                    ? query[seq * a.q_seq_stride + (head0 + r) * a.q_head_stride + d]
                    : static_cast<uint16_t>(0);
  }
  // (only head sizes below the bucket have such columns and rows: zeroing whole stages took ~200
  // two-byte stores per thread, a fixed cost that short partitions felt; fp8 byte stages widen
  // their zeros)
  const int pad = HEAD_MAX - D;
  // keys: kStages x kTW rows of pitch kp, columns D..; values: kStages x pad rows of pitch vp
  auto zero_pads = [&](auto* keys, int kp, auto* values, int vp) {
    for (int i = tid; i < kStages * kTW * pad; i += kThreads)
      keys[(i / pad) * kp + D + i % pad] = 0;
    for (int i = tid; i < kStages * pad * vp; i += kThreads) {
      const int st = i / (pad * vp), rest = i % (pad * vp);
      values[(st * HEAD_MAX + D + rest / vp) * vp + rest % vp] = 0;
    }
  };
  if constexpr (kRaw) {
    zero_pads(&s.rk[0][0][0], HEAD_MAX, &s.rv[0][0][0], kTW);
  } else {
    zero_pads(&s.k[0][0][0], S::kKP, &s.v[0][0][0], S::kVP);
  }
  // this warp's accumulator rows, learned from an index matrix (element (r, c) = 16 r + c)
  float* scratch = &s.s[warp][0][0];
  for (int i = lane; i < kRows * 16; i += 32) scratch[i] = static_cast<float>(i);
  __syncwarp();
  uint32_t rows = 0u;
  {
    FragC idx;
    wmma::load_matrix_sync(idx, scratch, 16, wmma::mem_row_major);
#pragma unroll
    for (int t = 0; t < FragC::num_elements; ++t)
      rows |= static_cast<uint32_t>(static_cast<int>(idx.x[t]) / 16) << (4 * t);
  }

  // softmax's thread: row r (a head slot), columns c0 .. c0 + kCols - 1 of each tile
  const int r = tid / 8, c0 = kCols * (tid % 8);
  const float qscale = a.scale * (kLog2e * kRescale);
  const float slope =
      a.alibi_slopes != nullptr && r < G ? a.alibi_slopes[head0 + r] * kLog2e : 0.0f;
  float m_run = -INFINITY, l_run = 0.0f;  // this thread's share of row r's sum

  int bs_shift = 0;
  while ((1 << bs_shift) < a.block_size) ++bs_shift;
  Copier<CKIND, HEAD_MAX> cp;
  constexpr int kEB = elem_bytes(CKIND);
  cp.k_head = static_cast<const uint8_t*>(a.key_cache) + kv_head * a.k_head_stride * kEB;
  cp.v_head = static_cast<const uint8_t*>(a.value_cache) + kv_head * a.v_head_stride * kEB;
  cp.k_block_bytes = a.k_block_stride * kEB;
  cp.v_block_bytes = a.v_block_stride * kEB;
  cp.bs_shift = bs_shift;
  cp.bs_mask = a.block_size - 1;
  cp.init(tid, D, a.block_size);
  const int32_t* table = a.block_tables + seq * a.table_stride;

  FragC o[kSteps];
#pragma unroll
  for (int i = 0; i < kSteps; ++i) wmma::fill_fragment(o[i], 0.0f);

  // The phases of a tile. fp8: `widen` first brings this warp's head dims of byte stage
  // `st` into the 16-bit stage (the previous tile there was read only by this warp, and it is
  // past that tile's P.V).
  auto widen = [&](int st) {
    if constexpr (kRaw) {
      widen_slice<CKIND, QKIND, HEAD_MAX, kSlice>(s, st, warp * kSlice, lane);
      __syncwarp();
    }
  };
  // 1. this warp's partial scores over its head dims, from 16-bit stage `wst`
  auto scores = [&](int wst) {
    FragC sc[kTW / 16];
#pragma unroll
    for (int n = 0; n < kTW / 16; ++n) wmma::fill_fragment(sc[n], 0.0f);
#pragma unroll
    for (int i = 0; i < kSteps; ++i) {
      // queries reloaded per tile (a few shared-memory loads): held in registers they took
      // 32 more and ptxas went from 128 to 158 (bf16, head 256), 3 blocks per SM, not 4; at
      // three blocks per SM (three stages) held queries measured 1-3 % slower (fp16), 3 %
      // faster (fp8), H200, 2026-12-03
      FragA qf;
      wmma::load_matrix_sync(qf, reinterpret_cast<const E*>(&s.q[0][warp * kSlice + 16 * i]),
                             S::kKP);
#pragma unroll
      for (int n = 0; n < kTW / 16; ++n) {
        FragB kb;  // B(k = dim, n = token) = K[token][dim]: column-major
        wmma::load_matrix_sync(
            kb, reinterpret_cast<const E*>(&s.k[wst][16 * n][warp * kSlice + 16 * i]), S::kKP);
        wmma::mma_sync(sc[n], qf, kb, sc[n]);
      }
    }
#pragma unroll
    for (int n = 0; n < kTW / 16; ++n)
      wmma::store_matrix_sync(&s.s[warp][0][16 * n], sc[n], kTW, wmma::mem_row_major);
  };
  // 2. softmax on row r, columns c0 .. c0 + kCols - 1 of the tile at token `tok0`
  auto softmax = [&](int tok0, int len) {
    float x[kCols];
    float m_tile = -INFINITY;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      float sum = 0.0f;
#pragma unroll
      for (int q = 0; q < kWarps; ++q) sum += s.s[q][r][c0 + c];
      const float rel = static_cast<float>(tok0 + c0 + c - seq_len + 1);
      x[c] = c0 + c < len ? fmaf(slope, rel, sum * qscale) : -INFINITY;
      m_tile = fmaxf(m_tile, x[c]);
    }
    m_tile = fmaxf(m_tile, __shfl_xor_sync(0xffffffffu, m_tile, 1));
    m_tile = fmaxf(m_tile, __shfl_xor_sync(0xffffffffu, m_tile, 2));
    m_tile = fmaxf(m_tile, __shfl_xor_sync(0xffffffffu, m_tile, 4));
    const float m_new = fmaxf(m_run, m_tile);  // finite: the tile holds a real token
    const float alpha = exp2f(m_run - m_new);
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const float pc = exp2f(x[c] - m_new);
      sum += pc;
      s.p[r][c0 + c] = to_bits16<QKIND>(pc);
    }
    l_run = l_run * alpha + sum;
    m_run = m_new;
    if (c0 == 0) s.alpha[r] = alpha;
  };
  // 3. O = alpha O + P V on this warp's head dims, from 16-bit stage `wst`
  auto pv = [&](int wst) {
    float al[FragC::num_elements];
    bool same = true;  // no row's maximum moved: alpha is exactly 1 (most tiles)
#pragma unroll
    for (int t = 0; t < FragC::num_elements; ++t) {
      al[t] = s.alpha[(rows >> (4 * t)) & 15u];
      same = same && al[t] == 1.0f;
    }
    if (!same) {
#pragma unroll
      for (int i = 0; i < kSteps; ++i)
#pragma unroll
        for (int t = 0; t < FragC::num_elements; ++t) o[i].x[t] *= al[t];
    }
#pragma unroll
    for (int kk = 0; kk < kTW / 16; ++kk) {
      FragA pa;
      wmma::load_matrix_sync(pa, reinterpret_cast<const E*>(&s.p[0][16 * kk]), S::kPP);
#pragma unroll
      for (int i = 0; i < kSteps; ++i) {
        FragB vb;  // B(k = token, n = dim) = V[dim][token]: column-major
        wmma::load_matrix_sync(
            vb, reinterpret_cast<const E*>(&s.v[wst][warp * kSlice + 16 * i][16 * kk]), S::kVP);
        wmma::mma_sync(o[i], pa, vb, o[i]);
      }
    }
  };

  const int window_tokens = kPages << bs_shift;
  for (int w0 = start; w0 < end; w0 += window_tokens) {
    const int wend = min(w0 + window_tokens, end);
    const int n_pages = (wend - w0 + cp.bs_mask) >> bs_shift;
    __syncthreads();  // the previous window's tiles are multiplied (and, first, the zeros)
    for (int i = tid; i < n_pages; i += kThreads) s.pages[i] = table[(w0 >> bs_shift) + i];
    __syncthreads();  // pages visible
    const int n_tiles = (wend - w0 + kTW - 1) / kTW;
#pragma unroll
    for (int j = 0; j < kStages - 1; ++j) {  // the first tiles in flight
      if (j < n_tiles) cp.issue(s, j, j * kTW, min(kTW, wend - w0 - j * kTW));
      async_commit();  // one group per tile, empty past the end: the waits below count them
    }
    int st = 0;  // the stage of tile j
    for (int j = 0; j < n_tiles; ++j) {
      const int off = j * kTW, len = min(kTW, wend - w0 - off);
      async_wait<kStages - 2>();  // this thread's copies of tile j landed
      __syncthreads();  // A: every thread's did; every warp finished tile j - 1's P.V
      {
        const int ahead = j + kStages - 1;  // into the stage tile j - 1 used
        if (ahead < n_tiles) {
          cp.issue(s, st == 0 ? kStages - 1 : st - 1, ahead * kTW,
                   min(kTW, wend - w0 - ahead * kTW));
        }
        async_commit();
      }
      widen(st);
      scores(kRaw ? 0 : st);
      __syncthreads();  // B: partials visible
      softmax(w0 + off, len);
      __syncthreads();  // C: probabilities and alphas visible
      pv(kRaw ? 0 : st);
      st = st == kStages - 1 ? 0 : st + 1;
    }
  }

  // Row sums over the 8 threads of a row; O through shared memory (the stages are free).
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 1);
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 2);
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 4);
  __syncthreads();  // every warp's last P.V read the stages
  if (c0 == 0) {
    s.alpha[r] = l_run;  // >= 1: the max token gives 2^0
    s.m[r] = m_run;
  }
  float* out_tile = s.out_tile();  // [kRows][HEAD_MAX] fp32
#pragma unroll
  for (int i = 0; i < kSteps; ++i)
    wmma::store_matrix_sync(out_tile + warp * kSlice + 16 * i, o[i], HEAD_MAX, wmma::mem_row_major);
  __syncthreads();
  const bool single = a.num_partitions == 1;
  for (int i = tid; i < G * D; i += kThreads) {
    const int g = i / D, d = i % D;
    const float v = out_tile[g * HEAD_MAX + d] * (a.v_scale * kRescale / s.alpha[g]);
    if (single) {
      store_elem<QKIND>(a.out, seq * a.out_seq_stride + (head0 + g) * a.out_head_stride + d, v);
    } else {
      const int64_t row = (static_cast<int64_t>(seq) * a.num_heads + head0 + g) * a.num_partitions;
      a.part_out[(row + part) * D + d] = v;
    }
  }
  if (!single && tid < G) {
    const int64_t row = (static_cast<int64_t>(seq) * a.num_heads + head0 + tid) * a.num_partitions;
    a.part_lse[row + part] = s.m[tid] + log2f(s.alpha[tid]);
  }
}

}  // namespace decode_mma
}  // namespace attn
#endif  // ATTN_DECODE_HAVE_MMA
