// Chunked prefill over vLLM 0.6.3's paged cache, read in place: a flash-attention forward.
//
// Grid: (query tiles, num_seqs x num_kv_heads, num_splits). One block serves M GQA-packed
// query rows (row r = token (r / group), head (r % group) of one KV head: M / group tokens of
// one sequence) against a range of key tiles of N keys: first the sequence's cached context
// (pages via block_tables), then the chunk's own keys from `key` / `value`, only the tiles the
// causal mask and the sliding window leave. Every K/V byte of a tile is read once per KV head
// per query tile, for the whole group. With num_splits > 1 the tiles are divided evenly among
// the splits, each writes fp32 partials (normalised output, base-2 log-sum-exp) and
// merge_kernel weighs them.
//
// Per key tile:
//   1. S = Q K^T on the matrix layer (attn_mma.cuh), fp32 in shared memory (or, where the layer
//      keeps scores in registers, in this warp's fragments: steps 2 and 3 then work on them);
//   2. softmax rows: T / M threads per row, each over N / (T / M) columns (rotated so a warp's
//      reads hit distinct banks); scale, mask (causal, window, tile end), ALiBi, running max
//      (exchanged through shared memory), probabilities, per-row rescale factor alpha;
//   3. O = alpha * O + P V on the matrix layer; O stays in registers (fp32) for all tiles.
// Loads (16-byte vectors) overlap compute where the platform has asynchronous copies. Scores
// in registers (NVIDIA wmma): with two K / V buffers (where the device's opt-in shared memory
// holds them), one barrier a tile and the next tile's copies issued a pair per Q K^T step; with
// one, V(i)'s copies go out through Q K(i)^T and K(i + 1)'s through P V(i). Issued in one burst
// the copies held their address registers while the memory pipe drained, and every warp
// waited at once (ncu source counters, H200: 12-19 % of stall samples; spreading them took
// 100K / 8192 from 116 to 88 ms). Other warp-rows configs (CoreX wmma): this tile's V at the
// first barrier, the next K at the second. Others: the next K after this tile's S, the next V
// after its P V (a SHARED_KV config alternates K and V in one buffer to fit 32 KiB), five
// barriers a tile.
//
// fp8 caches: bytes are decoded to the query's 16-bit type when staged (e4m3 as value / 256,
// exact; attn_convert.cuh) and the scales act in fp32 only: k_scale (and the 256) on the
// context tiles' scores, v_scale (and the 256) on the accumulator once, when the chunk's
// tiles begin (or at the end). The chunk's own K/V are never scaled (vLLM's semantics).
// Masked keys are zero in shared memory (a reused page may hold NaN past a sequence's end).

#include <atomic>

#include "attn_async.cuh"
#include "attn_convert.cuh"
#include "attn_mma.cuh"
#include "attn_platform.cuh"
#include "attn_prefill_abi.h"

#ifndef ATTN_PREFILL_MMA
#error "build one library per matrix layer: -DATTN_PREFILL_MMA=0 (FMA), 1 (wmma), 2 (CoreX wmma)"
#endif

namespace attn {

constexpr float kLog2eP = 1.4426950408889634f;
constexpr int kMergeThreads = 256;

// The tile configurations. Large (config 0): 128 rows x 64 keys, 146 KiB at head 256 with the
// scores in registers and one K / V buffer (214.5 KiB with two; 190 KiB with S and P in shared
// memory), one block per SM on the H200, in two warp layouts:
// - RowsCfg (the wmma layers): 8 warps, warp w owns rows 16w..16w+15 of S, P and O (O at head
//   256: 16 fragments, 128 fp32 registers), so softmax is warp-local, in registers. H200,
//   Qwen3.6 shape, 100K / 8192: 128 ms, ~13K cycles per key tile with S and P in
//   shared memory; 119-120 ms with the scores kept in fragments (NVIDIA); 85 ms with two
//   buffers, the copies spread through Q K^T and subnormals flushed (see the schedule in the
//   kernel). ncu before those (30K / 2048, S in shared memory): 2 warps per scheduler with 0.32
//   eligible; stalls on shared-memory results (26 %), fixed latency (24 %), global loads
//   (16 %); issue slots 25 % busy: latency-bound at one block per SM. Tried without gain: page
//   ids prefetched a phase early (+0 %), 8 threads per key row in the K copy (+4 %), QK unroll
//   1 or 4 (+-0.5 %), 64 rows x 4 warps so two blocks share an SM (+38 % at 100K / 8192, +70 %
//   at 100K / 2048: each block loads every K/V tile for half the rows).
// - LargeCfg (the FMA layer, and the wmma layers before): 16 warps, S 8 x 2 warps of 1 x 2
//   fragments, O 4 x 4 warps of 2 x (head / 64) fragments, five block barriers a tile: 175 ms
//   at 100K / 8192 on wmma (ncu: issue slots 47 % busy, ALU the busiest pipe).
// Small (config 1): 16 rows x 32 keys, one warp, K and V sharing a buffer, no V row skew: 28.6
// KiB at head 256, inside BI-V100's 32 KiB.
template <int DM>
using LargeCfg = TileCfg<128, 64, DM, 16 / (ATTN_HW_WARP_SIZE / 32), 8 / (ATTN_HW_WARP_SIZE / 32),
                         4 / (ATTN_HW_WARP_SIZE / 32), false>;
template <int DM>
using SmallCfg = TileCfg<16, 32, DM, 1, 1, 1, true, 0>;
// (8 warps of 32 lanes; on a 64-lane warp, 4 warps of 32 rows.)
template <int DM>
using RowsCfg = TileCfg<128, 64, DM, 8 / (ATTN_HW_WARP_SIZE / 32), 8 / (ATTN_HW_WARP_SIZE / 32),
                        8 / (ATTN_HW_WARP_SIZE / 32), false>;
template <int MMA, int DM>
using LargeFor = typename std::conditional<MMA == kMmaFma, LargeCfg<DM>, RowsCfg<DM>>::type;

// Which step sequence a (layer, tile) pair runs; the kernel and its shared-memory plan both
// read it, so the plan is sized for the path that actually runs.
template <class L, class C>
struct PathFor {
  // Each warp owns whole rows of S, P and O (and softmax's rows: row = tid / kTPR gives warp w
  // the same M / WARPS rows), so a row's steps need only that warp in step.
  static constexpr bool kWarpRows =
      L::kWantsP16 && C::QK_WC == 1 && C::PV_WC == 1 && !C::SHARED_KV;
  // Scores in registers (attn_mma.cuh): softmax on S's fragments, no S or P in shared memory.
  static constexpr bool kFragSoftmax = kWarpRows && L::kScoresInRegs;
};

// BUFS: K and V buffers each (2: the scores-in-registers schedule with the next tile's copies
// a whole tile ahead; 214.5 KiB at head 256, so only where the device's opt-in allows it).
template <class C, bool P16, bool REGS, int BUFS = 1>
struct SmemPlan {
  // 128-byte region starts: wmma fragment pointers must be 32-byte aligned
  static constexpr int up16(int b) { return (b + 127) / 128 * 128; }
  static_assert(BUFS == 1 || (BUFS == 2 && REGS), "two buffers: the scores-in-registers path");
  static constexpr int kBufs = BUFS;
  static constexpr int kQ = 0;
  static constexpr int kK = up16(kQ + C::M * C::QP * 2);
  static constexpr int kKBytes = up16(C::N * C::QP * 2), kVBytes = up16(C::DM * C::VP * 2);
  static constexpr int kV = C::SHARED_KV ? kK : up16(kK + kBufs * kKBytes);
  static constexpr int kS = C::SHARED_KV ? up16(kK + (kKBytes > kVBytes ? kKBytes : kVBytes))
                                         : up16(kV + kBufs * kVBytes);
  // REGS (scores in registers): S is only the fragment-index scratch, 16 x 16 fp32 per warp
  static constexpr int kP = up16(kS + (REGS ? C::WARPS * 256 : C::M * C::SP) * 4);
  static constexpr int kAlpha = up16(kP + (P16 && !REGS ? C::M * C::PP * 2 : 0));
  static constexpr int kRow = up16(kAlpha + C::M * 4);  // per-row 1 / l, then lse
  static constexpr int kRed = up16(kRow + 2 * C::M * 4);
  static constexpr int kBytes = up16(kRed + C::T * 4);
  static_assert(C::M * C::SP >= C::WARPS * 256, "S doubles as the fragment index scratch");
  static_assert(!C::SHARED_KV || kBytes <= 32 * 1024, "the shared-K/V config is the 32 KiB one");
};

template <int QKIND>
ATTN_DEVICE void store8(uint16_t* dst, const float* v) {  // 8 elements, 16 bytes
  Vec16 o;
#pragma unroll
  for (int w = 0; w < 4; ++w)
    o.w[w] = to_bits16<QKIND>(v[2 * w]) | (static_cast<uint32_t>(to_bits16<QKIND>(v[2 * w + 1])) << 16);
  *reinterpret_cast<Vec16*>(dst) = o;
}

ATTN_DEVICE void zero16(void* dst) { *reinterpret_cast<Vec16*>(dst) = Vec16{{0u, 0u, 0u, 0u}}; }

// Where (token, head)'s partials start: [num_tokens, num_heads, num_splits] (lse; x head_size
// for outputs), the decode kernel's layout with tokens for sequences (attn_core.native.abi).
ATTN_DEVICE int64_t partial_row(const AttnPrefillArgs& a, int tok, int head) {
  return (static_cast<int64_t>(tok) * a.num_heads + head) * a.num_splits;
}

// Where one block's tiles come from.
struct TileSrc {
  bool context;  // from the cache pages, else from the chunk's key / value
  int base;      // context: first key position; chunk: first chunk-token index
  int valid;     // keys of the tile that exist (the rest are zero)
};

template <int QKIND, int CKIND, class C>
struct Loader {
  static constexpr int kCB = elem_bytes(CKIND);
  static constexpr int kX = 16 / kCB;  // the cache layout's x
  static constexpr int kG = C::N / 8;  // 8-key groups of a V row
  static_assert(C::T % C::N == 0, "a thread keeps one key of every K tile");
  static_assert(C::T % kG == 0, "a thread keeps one key group of every V tile");
  // Constant trip counts at head size DM, unrolled; not in a 512-thread block, whose 128
  // registers then spilled (the FMA tile: 56 bytes at head 128, ptxas 13.0 sm_90).
  static constexpr bool kUnrollFull = C::T <= 256;
  // Only indices are kept: base pointers are recomputed from the kernel parameters (constant
  // memory) at each tile, as 8 more live registers made the 16-warp tile spill at head 256.
  const AttnPrefillArgs& a;
  int kvh, seq, q0, tid;
  // log2(block_size) (a power of two, checked at launch): a position's page and offset by
  // shifts; the divisions by a runtime block size were ~60 instructions of every tile's loads
  int shift;

  // The page holding this thread's key of K tile `t` (key tid % N) / its 8-key group of V
  // tile `t` (keys from 8 (tid % (N / 8))); 0 where the thread copies nothing from the cache.
  // Separate from the copies so a caller can look the next tile's pages up a tile early.
  ATTN_DEVICE int page_k(const TileSrc& t) const {
    const int key = tid % C::N;
    return t.context && key < t.valid ? page(t.base + key) : 0;
  }
  ATTN_DEVICE int page_v(const TileSrc& t) const {
    const int g = tid % kG;
    return t.context && g * 8 < t.valid ? page(t.base + g * 8) : 0;
  }
  ATTN_DEVICE int page(int pos) const {
    return a.block_tables[seq * a.table_stride + (pos >> shift)];
  }

  // K[key][dim] for dims < D (and zero pad columns up to DM); `pg` = page_k(t).
  //
  // Context tiles: thread t always serves key t % N of the tile (T is a multiple of N);
  // consecutive threads take consecutive keys of a page (16 contiguous bytes each in the
  // cache's [dim / x][block pos][x] layout). FULL: D == DM, so every loop has a constant trip
  // count and unrolls.
  template <bool FULL>
  ATTN_DEVICE void load_k_as(uint16_t* Ks, const TileSrc& t, int pg) const {
    constexpr int kVecs = C::DM / 8;  // 16-byte vectors of a smem row
    const int D = FULL ? C::DM : a.head_size, bs = a.block_size;
    if (t.context) {
      const int key = tid % C::N, vecs = D / kX;
      uint16_t* dst = Ks + key * C::QP;
      if (key >= t.valid) {
        for (int c = tid / C::N; c < vecs; c += C::T / C::N) {
          zero16(dst + c * kX);
          if (kCB == 1) zero16(dst + c * kX + 8);
        }
      } else {
        const int pos = t.base + key;
        const uint8_t* src = static_cast<const uint8_t*>(a.key_cache) +
                             (kvh * a.kc_head_stride + static_cast<int64_t>(pg) * a.kc_block_stride) *
                                 kCB +
                             (pos & (bs - 1)) * 16;
        for (int c = tid / C::N; c < vecs; c += C::T / C::N) {
          const uint8_t* at = src + static_cast<int64_t>(c * 16) * bs;
          if (kCB == 2) {
            copy16(dst + c * kX, at);
          } else {
            const Vec16 raw = load_vec<Vec16>(at);
            float f[16];
            unpack<CKIND, 4>(raw.w, f);
            store8<QKIND>(dst + c * kX, f);
            store8<QKIND>(dst + c * kX + 8, f + 8);
          }
        }
      }
    } else {
      const uint16_t* kn =
          static_cast<const uint16_t*>(a.key) + q0 * a.k_tok_stride + kvh * a.k_head_stride;
      for (int v = tid; v < C::N * kVecs; v += C::T) {
        const int c = v % kVecs, key = v / kVecs;  // consecutive threads: one key's dims
        if (c * 8 >= D) continue;  // a pad column (below)
        uint16_t* dst = Ks + key * C::QP + c * 8;
        if (key < t.valid) copy16(dst, kn + (t.base + key) * a.k_tok_stride + c * 8);
        else zero16(dst);
      }
    }
    if (!FULL && D < C::DM) {
      for (int v = tid; v < C::N * kVecs; v += C::T) {
        const int c = v % kVecs;
        if (c * 8 >= D) zero16(Ks + (v / kVecs) * C::QP + c * 8);
      }
    }
  }
  ATTN_DEVICE void load_k(uint16_t* Ks, const TileSrc& t, int pg) const {
    if (kUnrollFull && a.head_size == C::DM) load_k_as<true>(Ks, t, pg);
    else load_k_as<false>(Ks, t, pg);
  }

  // Vt[dim][key] for dims < D; `pg` = page_v(t). Context tiles: thread t always serves the
  // 8-key group t % (N / 8) (8 keys of one page: block sizes are multiples of 8).
  template <bool FULL>
  ATTN_DEVICE void load_v_as(uint16_t* Vt, const TileSrc& t, int pg) const {
    const int D = FULL ? C::DM : a.head_size, bs = a.block_size;
    if (t.context) {
      const int g = tid % kG, n = min(8, t.valid - g * 8);
      uint16_t* dst = Vt + g * 8;
      if (n <= 0) {
        for (int d = tid / kG; d < D; d += C::T / kG) zero16(dst + d * C::VP);
        return;
      }
      const int pos = t.base + g * 8;
      const uint8_t* src = static_cast<const uint8_t*>(a.value_cache) +
                           (kvh * a.vc_head_stride + static_cast<int64_t>(pg) * a.vc_block_stride +
                            (pos & (bs - 1))) *
                               kCB;
      if (kCB == 2 && n == 8) {  // a whole group: a copy with a constant size (a runtime
        // zero-fill size makes the pipeline primitive branch over every size, each copy)
        for (int d = tid / kG; d < D; d += C::T / kG)
          copy16(dst + d * C::VP, src + static_cast<int64_t>(d * kCB) * bs);
        return;
      }
      for (int d = tid / kG; d < D; d += C::T / kG) {
        const uint8_t* at = src + static_cast<int64_t>(d * kCB) * bs;
        if (kCB == 2) {
          copy16_zfill(dst + d * C::VP, at, n * 2);
        } else {
          const Vec8 raw = load_vec<Vec8>(at);
          float f[8];
          unpack<CKIND, 2>(raw.w, f);
#pragma unroll
          for (int i = 0; i < 8; ++i) f[i] = i < n ? f[i] : 0.0f;
          store8<QKIND>(dst + d * C::VP, f);
        }
      }
    } else {
      const uint16_t* vn =
          static_cast<const uint16_t*>(a.value) + q0 * a.v_tok_stride + kvh * a.v_head_stride;
      const int vecs = D / 8;
      for (int v = tid; v < C::N * vecs; v += C::T) {
        const int key = v % C::N, c = v / C::N;
        Vec16 raw = {{0u, 0u, 0u, 0u}};
        if (key < t.valid) raw = load_vec<Vec16>(vn + (t.base + key) * a.v_tok_stride + c * 8);
#pragma unroll
        for (int i = 0; i < 8; ++i)
          Vt[(c * 8 + i) * C::VP + key] = static_cast<uint16_t>(raw.w[i / 2] >> (16 * (i % 2)));
      }
    }
  }
  ATTN_DEVICE void load_v(uint16_t* Vt, const TileSrc& t, int pg) const {
    if (kUnrollFull && a.head_size == C::DM) load_v_as<true>(Vt, t, pg);
    else load_v_as<false>(Vt, t, pg);
  }

  // A whole context tile of a 16-bit cache at head size DM, in kCopies copies of K and of V
  // per thread that the caller may issue one pair at a time (spread through Q K^T instead of
  // in one burst: ncu showed the burst's copies holding their address registers while the
  // memory pipe drained, 12-19 % of the warps' stall samples).
  static constexpr int kCopies = C::DM / 8 / (C::T / C::N);
  static_assert(C::DM / (C::T / kG) == kCopies, "as many V copies as K copies per thread");
  struct Spread {
    const uint8_t* k;
    const uint8_t* v;
  };
  ATTN_DEVICE bool can_spread(const TileSrc& t) const {
    return kCB == 2 && t.context && t.valid == C::N && a.head_size == C::DM;
  }
  // (A caller issuing only K or only V copies passes 0 for the other page: that pointer is
  // then unused and compiled away. The address arithmetic repeats load_k_as / load_v_as's on
  // purpose: shared helpers cost the two-buffer fp16 tile 4-20 bytes of spills at 255
  // registers, ptxas 13.0 sm_90.)
  ATTN_DEVICE Spread spread(const TileSrc& t, int pk, int pv) const {
    const int key = tid % C::N, g = tid % kG, bs = a.block_size;
    const uint8_t* kc = static_cast<const uint8_t*>(a.key_cache);
    const uint8_t* vc = static_cast<const uint8_t*>(a.value_cache);
    return {kc + (kvh * a.kc_head_stride + static_cast<int64_t>(pk) * a.kc_block_stride) * kCB +
                ((t.base + key) & (bs - 1)) * 16 + static_cast<int64_t>((tid / C::N) * 16) * bs,
            vc + (kvh * a.vc_head_stride + static_cast<int64_t>(pv) * a.vc_block_stride +
                  ((t.base + g * 8) & (bs - 1))) * kCB +
                static_cast<int64_t>((tid / kG) * kCB) * bs};
  }
  // Copy j (< kCopies) of K / of V.
  ATTN_DEVICE void spread_k(const Spread& sp, int j, uint16_t* Ks) const {
    const int key = tid % C::N, c = tid / C::N + j * (C::T / C::N);
    copy16(Ks + key * C::QP + c * kX,
           sp.k + static_cast<int64_t>(j * (C::T / C::N) * 16) * a.block_size);
  }
  ATTN_DEVICE void spread_v(const Spread& sp, int j, uint16_t* Vt) const {
    const int g = tid % kG, d = tid / kG + j * (C::T / kG);
    copy16(Vt + d * C::VP + g * 8,
           sp.v + static_cast<int64_t>(j * (C::T / kG) * kCB) * a.block_size);
  }
  ATTN_DEVICE void spread_copy(const Spread& sp, int j, uint16_t* Ks, uint16_t* Vt) const {
    spread_k(sp, j, Ks);
    spread_v(sp, j, Vt);
  }
};

template <int QKIND, int CKIND, int MMA, class C, int BUFS>
__global__ void __launch_bounds__(C::T) prefill_kernel(const AttnPrefillArgs a) {
  using L = typename MmaSelect<MMA, QKIND, C>::type;
  using Plan = SmemPlan<C, L::kWantsP16, PathFor<L, C>::kFragSoftmax, BUFS>;
  constexpr int kTPR = C::T / C::M;      // softmax threads per row
  constexpr int kCols = C::N / kTPR;     // columns per softmax thread
  static_assert(C::T % C::M == 0 && C::N % kTPR == 0, "softmax mapping");
  constexpr bool kWarpRows = PathFor<L, C>::kWarpRows;
  constexpr int kRW = C::M / C::WARPS;  // rows per warp (kWarpRows)
  static_assert(!kWarpRows || kRW * kTPR == ATTN_HW_WARP_SIZE, "a warp's threads cover its rows");
  constexpr bool kFragSoftmax = PathFor<L, C>::kFragSoftmax;
  static_assert(kFragSoftmax || Plan::kP - Plan::kS >= C::M * C::SP * 4,
                "a shared-memory softmax needs the whole S region");
  auto rows_sync = [] {
    if constexpr (kWarpRows) ATTN_WARP_SYNC();
    else __syncthreads();
  };
  extern __shared__ __align__(128) unsigned char smem[];
  uint16_t* Qs = reinterpret_cast<uint16_t*>(smem + Plan::kQ);
  uint16_t* Ks = reinterpret_cast<uint16_t*>(smem + Plan::kK);
  uint16_t* Vt = reinterpret_cast<uint16_t*>(smem + Plan::kV);
  float* S = reinterpret_cast<float*>(smem + Plan::kS);
  uint16_t* P = reinterpret_cast<uint16_t*>(smem + Plan::kP);
  float* alpha = reinterpret_cast<float*>(smem + Plan::kAlpha);
  float* rowv = reinterpret_cast<float*>(smem + Plan::kRow);
  float* red = reinterpret_cast<float*>(smem + Plan::kRed);

  const int tid = threadIdx.x;
  const int G = a.num_heads / a.num_kv_heads;
  const int tokens_per_tile = C::M / G;
  const int kvh = blockIdx.y % a.num_kv_heads, seq = blockIdx.y / a.num_kv_heads;
  const int split = blockIdx.z;
  const int q0 = a.query_start_loc[seq];
  const int qlen = a.query_start_loc[seq + 1] - q0;
  const int t0 = blockIdx.x * tokens_per_tile;
  if (t0 >= qlen) return;
  const int ntok = min(tokens_per_tile, qlen - t0);
  const int nrows = ntok * G;
  // Lengths beyond the table row are clamped: memory-safe whatever the caller passed.
  const int ctx = max(0, min(a.context_lens[seq], a.table_width * a.block_size));
  const int D = a.head_size;

  // This block's key tiles: context tiles [c_begin, c_end) then chunk tiles [j_begin, j_end),
  // minus what the window excludes for every row; divided evenly among the splits.
  const int lo = a.sliding_window > 0 ? max(0, ctx + t0 - a.sliding_window + 1) : 0;
  const int c_end = (ctx + C::N - 1) / C::N;
  const int c_begin = lo < ctx ? lo / C::N : c_end;
  const int j_begin = max(lo - ctx, 0) / C::N;
  const int j_end = (t0 + ntok + C::N - 1) / C::N;
  const int nc = c_end - c_begin, n_tiles = nc + (j_end - j_begin);
  const int per = (n_tiles + a.num_splits - 1) / a.num_splits;
  const int b = split * per, e = min(n_tiles, b + per);
  // Softmax's threads: kTPR per row, each over kCols columns. Warp-rows configs give lane l
  // of warp w row w * kRW + l % kRW and columns from (l / kRW) * kCols, so the 16-byte reads of
  // eight consecutive lanes fall on eight different rows (distinct banks); the others give
  // thread t row t / kTPR.
  const int row = kWarpRows ? (tid / ATTN_HW_WARP_SIZE) * kRW + tid % kRW : tid / kTPR;
  const int part = kWarpRows ? (tid % ATTN_HW_WARP_SIZE) / kRW : tid % kTPR;
  auto red_at = [](int r, int p) {  // the thread index of row r's part p
    return kWarpRows ? (r / kRW) * ATTN_HW_WARP_SIZE + r % kRW + p * kRW : r * kTPR + p;
  };
  if (b >= e) {  // an empty split: nothing to merge from it
    if (part == 0 && row < nrows) {
      const int tok = q0 + t0 + row / G, head = kvh * G + row % G;
      a.part_lse[partial_row(a, tok, head) + split] = -INFINITY;
    }
    return;
  }

  constexpr float kRescale = CKIND == kFp8E4M3 ? kE4M3Rescale : 1.0f;
  const Loader<QKIND, CKIND, C> ld{a, kvh, seq, q0, tid, 31 - __clz(a.block_size)};
  auto tile = [&](int i) -> TileSrc {
    if (i < nc) {
      const int base = (c_begin + i) * C::N;
      return {true, base, min(C::N, ctx - base)};
    }
    const int base = (j_begin + i - nc) * C::N;
    return {false, base, min(C::N, qlen - base)};
  };

  // Queries: rows past the tile's tokens and dims past D are zero.
  {
    const uint16_t* q = static_cast<const uint16_t*>(a.query);
    constexpr int kVecs = C::DM / 8;
    for (int v = tid; v < C::M * kVecs; v += C::T) {
      const int c = v % kVecs, r = v / kVecs;
      uint16_t* dst = Qs + r * C::QP + c * 8;
      if (r < nrows && c * 8 < D) {
        const int tok = q0 + t0 + r / G, head = kvh * G + r % G;
        copy16(dst, q + tok * a.q_tok_stride + head * a.q_head_stride + c * 8);
      } else {
        zero16(dst);
      }
    }
  }
  ld.load_k(Ks, tile(b), ld.page_k(tile(b)));
  constexpr bool kDbuf = Plan::kBufs == 2;
  if ((!C::SHARED_KV && !kWarpRows) || kDbuf) ld.load_v(Vt, tile(b), ld.page_v(tile(b)));
  async_commit();

  typename L::Acc acc;
  L::zero(acc, S, tid);

  // This thread's softmax row.
  const bool row_valid = row < nrows;
  const int qpos = ctx + t0 + (row_valid ? row / G : 0);
  const float slope = a.alibi_slopes != nullptr && row_valid
                          ? a.alibi_slopes[kvh * G + row % G] * kLog2eP
                          : 0.0f;
  const float ctx_scale = a.scale * a.k_scale * kRescale * kLog2eP;
  const float new_scale = a.scale * kLog2eP;
  const float v_ctx = a.v_scale * kRescale;
  const int lo_key = a.sliding_window > 0 ? qpos - a.sliding_window + 1 : 0;
  float m_run = -INFINITY, l_part = 0.0f;
  bool v_applied = false;  // v_ctx folded into the accumulator yet
  // rotate each thread's column order so a warp's S reads fall on distinct banks
  const int rot = ((row >> 3) * kTPR + part) % kCols;
  float* srow = S + row * C::SP + part * kCols;
  uint16_t* prow = P + row * C::PP + part * kCols;

  // Both shared-memory softmax steps below end a tile the same way. advance_max exchanges the
  // row maximum of this thread's columns `mx` among the row's threads and moves the running
  // maximum on: it returns the exponent's offset for the tile's probabilities and sets `al`,
  // the factor that rescales what the row holds so far. commit_row adds the tile's sum and
  // publishes `al` (with the context's v scale on the first chunk tile).
  auto advance_max = [&](float mx, float& al) ATTN_INLINE_LAMBDA {
    red[tid] = mx;
    rows_sync();
    float m_new = m_run;
#pragma unroll
    for (int p = 0; p < kTPR; ++p) m_new = fmaxf(m_new, red[red_at(row, p)]);
    const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // a row with no key yet
    al = exp2f(m_run - m_use);
    m_run = m_new;
    return m_use;
  };
  auto commit_row = [&](const TileSrc& t, float al, float sum) ATTN_INLINE_LAMBDA {
    l_part = l_part * al + sum;
    if (!t.context && !v_applied) {  // first chunk tile: the context part takes its v scale
      al *= v_ctx;
      v_applied = true;
    }
    if (part == 0) alpha[row] = al;
  };

  // Step 2 of a tile: scale and mask this thread's columns of S, exchange the row maximum,
  // write the probabilities and the row's rescale factor. Its two barriers order only the
  // rows' own threads: one warp where the warp owns its rows (kWarpRows), else the block.
  auto softmax = [&](const TileSrc& t) ATTN_INLINE_LAMBDA {
    const int kpos0 = t.context ? t.base : ctx + t.base;
    const float sc = t.context ? ctx_scale : new_scale;
    const int hi_key = min(qpos, kpos0 + t.valid - 1);  // causal and tile end
    float mx = -INFINITY;
#pragma unroll 8
    for (int j = 0; j < kCols; ++j) {
      const int c = (j + rot) % kCols;
      const int kpos = kpos0 + part * kCols + c;
      float s = -INFINITY;
      if (row_valid && kpos <= hi_key && kpos >= lo_key)
        s = fmaf(slope, static_cast<float>(kpos - qpos), srow[c] * sc);
      srow[c] = s;
      mx = fmaxf(mx, s);
    }
    float al;
    const float m_use = advance_max(mx, al);
    float sum = 0.0f;
#pragma unroll 8
    for (int j = 0; j < kCols; ++j) {
      const int c = (j + rot) % kCols;
      const float p = exp2f(srow[c] - m_use);
      sum += p;
      if (L::kWantsP16) prow[c] = to_bits16<QKIND>(p);
      else srow[c] = p;
    }
    commit_row(t, al, sum);
  };

  // The same step for warp-rows configs, in registers: this thread's kCols scores read once
  // (16-byte reads), no scores written back. A tile every row sees whole (every key valid,
  // causal and window satisfied for every row of the block, no ALiBi) skips the mask.
  const int q_first = ctx + t0, q_last = ctx + t0 + ntok - 1;
  auto softmax_regs = [&](const TileSrc& t) ATTN_INLINE_LAMBDA {
    const int kpos0 = (t.context ? t.base : ctx + t.base) + part * kCols;
    const float sc = t.context ? ctx_scale : new_scale;
    const int tile0 = t.context ? t.base : ctx + t.base;
    const bool whole = t.valid == C::N && tile0 + C::N - 1 <= q_first &&
                       (a.sliding_window <= 0 || tile0 >= q_last - a.sliding_window + 1) &&
                       a.alibi_slopes == nullptr;
    float v[kCols];
#pragma unroll
    for (int j = 0; j < kCols; j += 4) {
      const float4 f = *reinterpret_cast<const float4*>(srow + j);
      v[j] = f.x, v[j + 1] = f.y, v[j + 2] = f.z, v[j + 3] = f.w;
    }
    float mx = -INFINITY;
    if (whole) {
#pragma unroll
      for (int j = 0; j < kCols; ++j) {
        v[j] *= sc;
        mx = fmaxf(mx, v[j]);
      }
    } else {
      const int hi_key = row_valid ? min(qpos, tile0 + t.valid - 1) : -1;  // causal, tile end
#pragma unroll
      for (int j = 0; j < kCols; ++j) {
        const int kpos = kpos0 + j;
        const float s = fmaf(slope, static_cast<float>(kpos - qpos), v[j] * sc);
        v[j] = kpos <= hi_key && kpos >= lo_key ? s : -INFINITY;
        mx = fmaxf(mx, v[j]);
      }
    }
    float al;
    const float m_use = advance_max(mx, al);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kCols; j += 8) {
      float p[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        p[k] = exp2f(v[j + k] - m_use);
        sum += p[k];
      }
      store8<QKIND>(prow + j, p);
    }
    commit_row(t, al, sum);
  };

  // Scores in registers: lane l of warp w holds rows fr0 = w * kRW + l / 4 and fr0 + 8 of S, P
  // and O (h = 0, 1), 16 of each row's columns per tile; a row's four lanes share its maximum
  // and sum by shuffles. Per row h: its query position, running maximum and this lane's part
  // of the running sum (all four lanes rescale by the same maxima, so the parts add up at the
  // end).
  const int fr0 = (tid / ATTN_HW_WARP_SIZE) * kRW + (tid % ATTN_HW_WARP_SIZE) / 4;
  int fq[2];
  float fm[2] = {-INFINITY, -INFINITY}, fl[2] = {0.0f, 0.0f};
#pragma unroll
  for (int h = 0; h < 2; ++h) fq[h] = ctx + t0 + (fr0 + 8 * h < nrows ? (fr0 + 8 * h) / G : 0);

  if constexpr (kFragSoftmax) {
    const int lane = tid % ATTN_HW_WARP_SIZE;
    // Step 2 on the fragments: scale, mask (skipped on whole tiles, as softmax_regs), row
    // maxima, probabilities in place, the two rows' rescale factors.
    auto softmax_frags = [&](const TileSrc& t, typename L::Scores& sc,
                             float (&al)[2]) ATTN_INLINE_LAMBDA {
      const float scl = t.context ? ctx_scale : new_scale;
      const int tile0 = t.context ? t.base : ctx + t.base;
      const bool whole = t.valid == C::N && tile0 + C::N - 1 <= q_first &&
                         (a.sliding_window <= 0 || tile0 >= q_last - a.sliding_window + 1) &&
                         a.alibi_slopes == nullptr;
      constexpr int kF = C::N / 16, kE = L::kElems;
      float mx[2] = {-INFINITY, -INFINITY};
      // The factor still to apply to a score in its exponent. A whole tile's maxima are taken
      // on the raw scores (the scale is positive) and the scale folds into the exponent's FMA:
      // per score a max, an FMA and exp2 (a bare MUFU.EX2 in the library built with
      // subnormals flushed, toolchain.py), where scaling first cost a multiply more.
      float mul = 1.0f;
      if (whole) {
#pragma unroll
        for (int j = 0; j < kF; ++j)
#pragma unroll
          for (int u = 0; u < kE; ++u) mx[(u / 2) % 2] = fmaxf(mx[(u / 2) % 2], sc.s[0][j].x[u]);
        mx[0] *= scl;
        mx[1] *= scl;
        mul = scl;
      } else {
        int hi[2], lo[2];
        float sl[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = fr0 + 8 * h;
          hi[h] = r < nrows ? min(fq[h], tile0 + t.valid - 1) : -1;  // causal, tile end
          lo[h] = a.sliding_window > 0 ? fq[h] - a.sliding_window + 1 : 0;
          sl[h] = a.alibi_slopes != nullptr && r < nrows ? a.alibi_slopes[kvh * G + r % G] * kLog2eP
                                                         : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < kF; ++j)
#pragma unroll
          for (int u = 0; u < kE; ++u) {
            const int h = (u / 2) % 2;
            const int kpos = tile0 + 16 * j + L::frag_col(lane, u);
            float& x = sc.s[0][j].x[u];
            const float s = fmaf(sl[h], static_cast<float>(kpos - fq[h]), x * scl);
            x = kpos <= hi[h] && kpos >= lo[h] ? s : -INFINITY;
            mx[h] = fmaxf(mx[h], x);
          }
      }
      float m_use[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float m_new = fmaxf(fm[h], L::quad_max(mx[h]));
        m_use[h] = m_new == -INFINITY ? 0.0f : m_new;  // a row with no key yet
        al[h] = exp2f(fm[h] - m_use[h]);
        fm[h] = m_new;
      }
#pragma unroll
      for (int j = 0; j < kF; ++j)
#pragma unroll
        for (int u = 0; u < kE; ++u) {
          float& x = sc.s[0][j].x[u];
          x = exp2f(fmaf(x, mul, -m_use[(u / 2) % 2]));
          sum[(u / 2) % 2] += x;
        }
#pragma unroll
      for (int h = 0; h < 2; ++h) fl[h] = fl[h] * al[h] + sum[h];
      if (!t.context && !v_applied) {  // first chunk tile: the context part takes its v scale
        al[0] *= v_ctx;
        al[1] *= v_ctx;
        v_applied = true;
      }
    };
    if constexpr (kDbuf) {
      // One barrier a tile: tile i's K and V landed and every warp is past tile i - 1, whose
      // buffers then take tile i + 1 (a whole tile to land), its copies spread through Q K^T
      // where the tile is a whole 16-bit context tile. The pages of tile i + 2 are looked up
      // here too, a tile before their copies need them.
      constexpr int kKStride = Plan::kKBytes / 2, kVStride = Plan::kVBytes / 2;
      int pk = b + 1 < e ? ld.page_k(tile(b + 1)) : 0;
      int pv = b + 1 < e ? ld.page_v(tile(b + 1)) : 0;
      for (int i = b; i < e; ++i) {
        const TileSrc t = tile(i);
        const int cur = (i - b) & 1;
        async_wait<0>();
        __syncthreads();
        uint16_t* const k_next = Ks + (cur ^ 1) * kKStride;
        uint16_t* const v_next = Vt + (cur ^ 1) * kVStride;
        typename L::Scores sc;
        bool spread = false;
        if (i + 1 < e) {
          const TileSrc tn = tile(i + 1);
          spread = ld.can_spread(tn);
          if (!spread) {
            ld.load_k(k_next, tn, pk);
            ld.load_v(v_next, tn, pv);
          }
        }
        if (spread) {
          // one K and one V copy every (steps / copies) k steps of Q K^T
          constexpr int kEvery = (C::DM / 16) / decltype(ld)::kCopies;
          const auto sp = ld.spread(tile(i + 1), pk, pv);
          L::qk_frags(sc.s, Qs, Ks + cur * kKStride, tid, [&](int step) ATTN_INLINE_LAMBDA {
            if (step % kEvery == 0) ld.spread_copy(sp, step / kEvery, k_next, v_next);
          });
        } else {
          L::qk_frags(sc.s, Qs, Ks + cur * kKStride, tid);
        }
        async_commit();
        if (i + 2 < e) {
          pk = ld.page_k(tile(i + 2));
          pv = ld.page_v(tile(i + 2));
        }
        float al[2];
        softmax_frags(t, sc, al);
        L::rescale_pv_regs(acc, al, sc, Vt + cur * kVStride);
      }
    } else {
    // One buffer each: the warp-rows schedule below (barriers X and Y), with no shared-memory
    // step between Q K^T and P V. Whole 16-bit context tiles: V(i)'s copies spread through
    // Q K(i)^T, K(i + 1)'s through P V(i), each page looked up a phase before its copies.
    constexpr int kQkEvery = (C::DM / 16) / decltype(ld)::kCopies;
    constexpr int kPvEvery = (C::N / 16) * (C::DM / 16) / decltype(ld)::kCopies;
    int pv = ld.page_v(tile(b));
    for (int i = b; i < e; ++i) {
      const TileSrc t = tile(i);
      async_wait<0>();
      __syncthreads();  // X
      const int pk = i + 1 < e ? ld.page_k(tile(i + 1)) : 0;
      typename L::Scores sc;
      if (ld.can_spread(t)) {
        const auto sp = ld.spread(t, 0, pv);
        L::qk_frags(sc.s, Qs, Ks, tid, [&](int step) ATTN_INLINE_LAMBDA {
          if (step % kQkEvery == 0) ld.spread_v(sp, step / kQkEvery, Vt);
        });
      } else {
        ld.load_v(Vt, t, pv);
        L::qk_frags(sc.s, Qs, Ks, tid);
      }
      async_commit();
      float al[2];
      softmax_frags(t, sc, al);
      async_wait<0>();
      __syncthreads();  // Y
      if (i + 1 < e) pv = ld.page_v(tile(i + 1));
      if (i + 1 < e && ld.can_spread(tile(i + 1))) {
        const auto sp = ld.spread(tile(i + 1), pk, 0);
        L::rescale_pv_regs(acc, al, sc, Vt, [&](int step) ATTN_INLINE_LAMBDA {
          if (step % kPvEvery == 0) ld.spread_k(sp, step / kPvEvery, Ks);
        });
      } else {
        if (i + 1 < e) ld.load_k(Ks, tile(i + 1), pk);
        L::rescale_pv_regs(acc, al, sc, Vt);
      }
      async_commit();
    }
    }
  } else if constexpr (kWarpRows) {
    // Two barriers per tile, each load hidden behind half a tile of compute:
    //   X: K(i) landed and visible; every warp is past P V(i-1), so V(i) may overwrite Vt.
    //   Y: V(i) landed and visible; every warp is past Q K(i)^T, so K(i+1) may overwrite Ks.
    for (int i = b; i < e; ++i) {
      const TileSrc t = tile(i);
      async_wait<0>();
      __syncthreads();  // X
      ld.load_v(Vt, t, ld.page_v(t));
      async_commit();
      L::qk(S, Qs, Ks, tid);  // this warp's rows of S
      rows_sync();
      softmax_regs(t);
      rows_sync();  // this warp's P and alpha
      async_wait<0>();
      __syncthreads();  // Y
      if (i + 1 < e) ld.load_k(Ks, tile(i + 1), ld.page_k(tile(i + 1)));
      async_commit();
      L::rescale_pv(acc, alpha, S, P, Vt, tid);
    }
  } else {
    async_wait<0>();
    __syncthreads();
    for (int i = b; i < e; ++i) {
      const TileSrc t = tile(i);
      // 1. scores
      L::qk(S, Qs, Ks, tid);
      __syncthreads();  // S complete; K free
      if (C::SHARED_KV) ld.load_v(Vt, t, ld.page_v(t));
      else if (i + 1 < e) ld.load_k(Ks, tile(i + 1), ld.page_k(tile(i + 1)));
      async_commit();
      // 2. softmax over this thread's columns of its row
      softmax(t);
      if (C::SHARED_KV) async_wait<0>();
      else async_wait<1>();  // this tile's V (the next K may still be in flight)
      __syncthreads();  // P, alpha and V visible
      // 3. O = alpha O + P V
      L::rescale_pv(acc, alpha, S, P, Vt, tid);
      __syncthreads();  // V, P, S free
      if (i + 1 < e) {
        if (C::SHARED_KV) ld.load_k(Ks, tile(i + 1), ld.page_k(tile(i + 1)));
        else ld.load_v(Vt, tile(i + 1), ld.page_v(tile(i + 1)));
      }
      async_commit();
      if (C::SHARED_KV) async_wait<0>();
      else async_wait<1>();  // the next K
      __syncthreads();
    }
  }
  // v_applied is uniform across the block (it follows the tile sequence), so the out scale is.
  const float out_scale = v_applied ? 1.0f : v_ctx;

  // Row sums, then the output (or this split's partials).
  if constexpr (kFragSoftmax) {
    const bool first = tid % 4 == 0;  // the first of each row's four lanes
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float l = L::quad_sum(fl[h]);
      if (first) {
        rowv[fr0 + 8 * h] = l > 0.0f ? out_scale / l : 0.0f;
        rowv[C::M + fr0 + 8 * h] = l > 0.0f ? fm[h] + log2f(l) : -INFINITY;
      }
    }
  } else {
    red[tid] = l_part;
    __syncthreads();
    if (part == 0) {
      float l = 0.0f;
#pragma unroll
      for (int p = 0; p < kTPR; ++p) l += red[red_at(row, p)];
      rowv[row] = l > 0.0f ? out_scale / l : 0.0f;
      rowv[C::M + row] = l > 0.0f ? m_run + log2f(l) : -INFINITY;
    }
  }
  __syncthreads();
  const bool single = a.num_splits == 1;
  for (int r = tid; !single && r < nrows; r += C::T) {
    const int tok = q0 + t0 + r / G, head = kvh * G + r % G;
    a.part_lse[partial_row(a, tok, head) + split] = rowv[C::M + r];
  }
  L::for_each(acc, tid, S, [&](int r, int col, float value) {
    if (r >= nrows || col >= D) return;
    const int tok = q0 + t0 + r / G, head = kvh * G + r % G;
    const float o = value * rowv[r];
    if (single) {
      store_elem<QKIND>(a.out, tok * a.out_tok_stride + head * a.out_head_stride + col, o);
    } else {
      a.part_out[(partial_row(a, tok, head) + split) * D + col] = o;
    }
  });
}

// out[token, head, :] = sum_s 2^(lse_s - max) o_s / sum_s 2^(lse_s - max), fp32; one block
// per token, threads over (head, dim).
template <int QKIND>
__global__ void __launch_bounds__(kMergeThreads) merge_kernel(const AttnPrefillArgs a) {
  const int tok = blockIdx.x, D = a.head_size;
  for (int i = threadIdx.x; i < a.num_heads * D; i += kMergeThreads) {
    const int head = i / D, d = i % D;
    const int64_t at = partial_row(a, tok, head);
    float m = -INFINITY;
    for (int s = 0; s < a.num_splits; ++s) m = fmaxf(m, a.part_lse[at + s]);
    float num = 0.0f, den = 0.0f;
    if (m != -INFINITY) {
      for (int s = 0; s < a.num_splits; ++s) {
        const float lse = a.part_lse[at + s];
        if (lse == -INFINITY) continue;  // an empty split wrote no output
        const float w = exp2f(lse - m);
        den += w;
        num = fmaf(w, a.part_out[(at + s) * D + d], num);
      }
    }
    store_elem<QKIND>(a.out, tok * a.out_tok_stride + head * a.out_head_stride + d,
                      den > 0.0f ? num / den : 0.0f);
  }
}

// ------------------------------------------------------------------------------ dispatch
using KernelPtr = void (*)(const AttnPrefillArgs);

struct Kernel {
  KernelPtr fn;
  int threads, smem;
};

// {nullptr} where the layer is missing, or BUFS == 2 on a path that has one buffer.
template <int QKIND, int CKIND, class C, int BUFS>
Kernel make_kernel() {
  using L = typename MmaSelect<ATTN_PREFILL_MMA, QKIND, C>::type;
  if constexpr (std::is_same<L, void>::value) {
    return {nullptr, 0, 0};
  } else if constexpr (BUFS == 2 && !PathFor<L, C>::kFragSoftmax) {
    return {nullptr, 0, 0};
  } else {
    return {prefill_kernel<QKIND, CKIND, ATTN_PREFILL_MMA, C, BUFS>, C::T,
            SmemPlan<C, L::kWantsP16, PathFor<L, C>::kFragSoftmax, BUFS>::kBytes};
  }
}

// The large tile with two K / V buffers where it has them and they fit the device's opt-in
// shared memory, else with one. H200, 100K / 8192: 85.4 ms with two, 92.2 ms with one
// (docs/benchmarks.md#native-chunked-prefill; the spread copies of the next K can only start
// once every warp is past Q K^T).
// ATTN_PREFILL_MAX_BUFS=1 builds a library that always takes one buffer: how the H200 tests
// the path devices with less shared memory run.
#ifndef ATTN_PREFILL_MAX_BUFS
#define ATTN_PREFILL_MAX_BUFS 2
#endif
template <int QKIND, int CK, int DM>
Kernel large_kernel(int smem_optin) {
  const Kernel two = make_kernel<QKIND, CK, LargeFor<ATTN_PREFILL_MMA, DM>, 2>();
  if (ATTN_PREFILL_MAX_BUFS >= 2 && two.fn != nullptr && two.smem <= smem_optin) return two;
  return make_kernel<QKIND, CK, LargeFor<ATTN_PREFILL_MMA, DM>, 1>();
}

template <int QKIND, int DM>
Kernel pick_cache(int config, int cache_kind, int smem_optin) {
#define ATTN_CFG(CK) \
  (config == 0 ? large_kernel<QKIND, CK, DM>(smem_optin) \
               : make_kernel<QKIND, CK, SmallCfg<DM>, 1>())
  if (cache_kind == QKIND) return ATTN_CFG(QKIND);
  if (cache_kind == kFp8E4M3) return ATTN_CFG(kFp8E4M3);
  if (cache_kind == kFp8E5M2) return ATTN_CFG(kFp8E5M2);
#undef ATTN_CFG
  return {nullptr, 0, 0};
}

template <int DM>
Kernel pick_query(int config, int query_kind, int cache_kind, int smem_optin) {
  switch (query_kind) {
    case kFloat16: return pick_cache<kFloat16, DM>(config, cache_kind, smem_optin);
    case kBFloat16: return pick_cache<kBFloat16, DM>(config, cache_kind, smem_optin);
    default: return {nullptr, 0, 0};  // fp32 queries: the torch path
  }
}

// The current device's opt-in shared memory per block (0 if it cannot be read: one buffer),
// read once per device ordinal below 64 (every launch asks).
int smem_optin() {
  static std::atomic<int> known[64];  // bytes + 1; 0: not read yet
  int device = 0, bytes = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  if (device < 64) {
    const int seen = known[device].load(std::memory_order_relaxed);
    if (seen != 0) return seen - 1;
  }
  if (cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
      cudaSuccess) {
    return 0;
  }
  if (device < 64) known[device].store(bytes + 1, std::memory_order_relaxed);
  return bytes;
}

// The kernel that serves (config, kinds, head bucket) on the current device.
Kernel kernel_for(int config, int query_kind, int cache_kind, int head_bucket) {
  if (config != 0 && config != 1) return {nullptr, 0, 0};
  const int optin = smem_optin();
#ifdef ATTN_PREFILL_ONLY_BUCKET  // a quick register / spill check of one head bucket
  if (head_bucket != ATTN_PREFILL_ONLY_BUCKET) return {nullptr, 0, 0};
  return pick_query<ATTN_PREFILL_ONLY_BUCKET>(config, query_kind, cache_kind, optin);
#else
  switch (head_bucket) {
    case 64: return pick_query<64>(config, query_kind, cache_kind, optin);
    case 128: return pick_query<128>(config, query_kind, cache_kind, optin);
    case 256: return pick_query<256>(config, query_kind, cache_kind, optin);
    default: return {nullptr, 0, 0};
  }
#endif
}

int config_rows(int config) {
  return config == 0 ? LargeFor<ATTN_PREFILL_MMA, 64>::M : SmallCfg<64>::M;
}

KernelPtr merge_for(int query_kind) {
  if (query_kind == kFloat16) return merge_kernel<kFloat16>;
  if (query_kind == kBFloat16) return merge_kernel<kBFloat16>;
  return nullptr;
}

cudaError_t prepare(const Kernel& k) {
  // above 48 KiB the kernel must opt in (once per process is enough; repeating is cheap)
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(k.fn),
                              cudaFuncAttributeMaxDynamicSharedMemorySize, k.smem);
}

}  // namespace attn

extern "C" {

ATTN_COMMON_EXPORTS(attn_prefill, ATTN_PREFILL_ABI_VERSION)

int attn_prefill_mma(void) { return ATTN_PREFILL_MMA; }

int attn_prefill(const AttnPrefillArgs* args, void* stream) {
  using namespace attn;
  const AttnPrefillArgs& a = *args;
  const int group = a.num_kv_heads > 0 ? a.num_heads / a.num_kv_heads : 0;
  const int rows = config_rows(a.config);
  const int x = 16 / elem_bytes(a.cache_kind);
  if (a.num_seqs < 1 || a.num_tokens < 1 || group < 1 || a.num_heads % a.num_kv_heads != 0 ||
      group > rows || a.head_size < 8 || a.head_size > 256 || a.head_size % 8 != 0 ||
      a.head_size % x != 0 || a.block_size < 8 || a.block_size > 256 ||
      (a.block_size & (a.block_size - 1)) != 0 || a.max_query_len < 1 || a.num_splits < 1 ||
      a.sliding_window < 0 || (a.num_splits > 1 && (a.part_out == nullptr || a.part_lse == nullptr))) {
    return cudaErrorInvalidValue;
  }
  const Kernel k = kernel_for(a.config, a.query_kind, a.cache_kind, head_bucket(a.head_size));
  const KernelPtr merge = merge_for(a.query_kind);
  if (k.fn == nullptr || merge == nullptr) return cudaErrorInvalidValue;
  cudaError_t err = prepare(k);
  if (err != cudaSuccess) return err;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int tokens_per_tile = rows / group;
  const dim3 grid((a.max_query_len + tokens_per_tile - 1) / tokens_per_tile,
                  a.num_seqs * a.num_kv_heads, a.num_splits);
  k.fn<<<grid, k.threads, k.smem, s>>>(a);
  err = cudaGetLastError();
  if (err != cudaSuccess || a.num_splits == 1) return err;
  merge<<<a.num_tokens, kMergeThreads, 0, s>>>(a);
  return cudaGetLastError();
}

int attn_prefill_config_info(int config, int query_kind, int cache_kind, int head_bucket,
                             AttnPrefillConfig* info) {
  using namespace attn;
  if (info == nullptr) return cudaErrorInvalidValue;
  const Kernel k = kernel_for(config, query_kind, cache_kind, head_bucket);
  *info = AttnPrefillConfig{};
  info->rows = config_rows(config);
  info->keys = config == 0 ? LargeCfg<64>::N : SmallCfg<64>::N;
  if (k.fn == nullptr) return cudaSuccess;  // available = 0
  cudaError_t err = prepare(k);
  if (err != cudaSuccess) return err;
  cudaFuncAttributes attr;
  err = cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(k.fn));
  if (err != cudaSuccess) return err;
  int blocks = 0;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, reinterpret_cast<const void*>(k.fn),
                                                      k.threads, k.smem);
  if (err != cudaSuccess) return err;
  info->threads = k.threads;
  info->smem_bytes = k.smem;
  info->num_regs = attr.numRegs;
  info->local_bytes = static_cast<int32_t>(attr.localSizeBytes);
  info->blocks_per_sm = blocks;
  info->available = 1;
  return cudaSuccess;
}

}  // extern "C"
