// The decode partition on NVIDIA's matrix units: 16-bit queries over a cache of the same type
// or an fp8 one, as independent warp streams on the m16n8k16 instruction (eight a block at head
// bucket 256, four below: warps_for).
//
// Included by paged_decode.cu (it uses that file's kLog2e); its partition kernel
// runs this body where ATTN_DECODE_MMA is on, and the CUDA-core body elsewhere (fp32 queries,
// CoreX).
//
// Why: the body before this one (wmma over a shared-memory ring, in git history) walked
// 16-token tiles with all four warps splitting the head dims, so every tile
// cost three block barriers, a round trip of partial scores through shared memory and ~1500
// warp instructions per block (ncu, H200, 1 x 100K); a block advanced one tile per ~2 us:
// 0.150 ms against a 0.101 ms floor. A kernel that only streams the same pages through the
// same kind of ring reads them in 0.093 ms (bench/paged_read_bound.py, H200), so
// the bytes were not what bound it.
//
// Here each of a block's W warps owns whole 16-token tiles (tiles w, w + W, ...) over
// every head dim, loads its keys and values straight into registers and keeps its own running
// max, sum and output; the warps meet once, at the end, to merge (the same log-sum-exp
// weighting the merge kernel applies across partitions). No block barrier and no shared memory
// in the tile loop but one 256-byte per-warp transpose of the probabilities.
//
// The products, transposed so the GQA heads are the 8-wide N side of m16n8k16 (group <= 8):
//   S^T[token][head] = K[token][dims] . Q^T[dims][head]   (M = 16 tokens, K = 16 dims a step)
//   O^T[dim][head]  += V^T[dim][tokens] . P^T[tokens][head] (M = 16 dims, K = the 16 tokens)
// A dot product does not care in which order its terms are summed, so each lane's fragment
// slots are mapped onto whatever the cache layout delivers in one load: for S, lane (g, t)
// (g = lane / 4, t = lane % 4) loads one 16-byte key vector (vLLM's x-group 4p + t: 8 dims of
// a 16-bit cache, 16 of an fp8 one) of tokens g and g + 8, which fills its A slots of two
// (fp8: four) k steps; for P.V it loads tokens 4t .. 4t + 3 (8 bytes, fp8 4) of dims g and
// g + 8 of each 16-dim tile. The queries' B fragments and the probabilities' B fragment follow
// the same slot -> dim / token maps. Dims past the head size are zeros; keys past the tile's
// end are zeros (or, in the specialised body, their page's stale slots, whose scores are
// masked); values of tokens past the end are zeroed in registers (a reused page's inf/NaN
// never meets a zero probability).
//
// fp8 caches are widened in registers as their products read them, exactly (sm_89+ converts in
// hardware; older targets read e4m3 as value x 2^-8, folded into the fp32 scales: a scale is
// never applied to 16-bit data).
#pragma once

#include "attn_convert.cuh"
#include "attn_m16n8k16.cuh"
#include "attn_platform.cuh"

#if !defined(__ILUVATAR__)  // mma.sync (sm_80+) and warp shuffles: NVIDIA only
#define ATTN_DECODE_HAVE_MMA 1

// sm_89+ widens two fp8 values per instruction (cvt.rn.f16x2.e4m3x2 / .e5m2x2, through
// cuda_fp8.h), exactly; older targets use attn_convert.cuh's bit moves (e4m3 as value x 2^-8).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#include <cuda_fp8.h>
#define ATTN_DECODE_HW_FP8 1
#else
#define ATTN_DECODE_HW_FP8 0
#endif

namespace attn {
namespace decode_warp {

// Warp streams per block: eight at head bucket 256, four below. At head 256 a warp holds a tile
// of keys and values in registers (251-255 of them), so a block of four is two per SM and a step
// with one or two KV heads at batch 1 had one block of four warps per SM; eight warps a block
// took 0.8-5.7 us off every 16-bit and fp8 shape timed from 1 x 8K to 8 x 100K and 64 x 8K, each
// at its own split (half the partitions: one block per SM), but 6 / 1 heads at 8 x 100K (+1.9 us,
// 0.9 %) (H200, docs/benchmarks.md#decode-kernel-choices). Heads 64 and 128 keep four:
// three or four blocks of four per SM there, not measured with eight. ATTN_DECODE_WARPS_256=4
// builds the previous block for an A/B.
#ifndef ATTN_DECODE_WARPS_256
#define ATTN_DECODE_WARPS_256 8
#endif
template <int HEAD_MAX>
__host__ __device__ constexpr int warps_for() {
  return HEAD_MAX == 256 ? ATTN_DECODE_WARPS_256 : 4;
}
static_assert(ATTN_DECODE_WARPS_256 == 4 || ATTN_DECODE_WARPS_256 == 8, "four or eight warps");
constexpr int kTok = 16;  // tokens per warp tile
constexpr int kTokShift = 4;
static_assert(1 << kTokShift == kTok, "kTokShift");
constexpr int kHeads = 8;  // the N side of m16n8k16: head slots per block (GROUP <= 8)

// The block's shared memory (static): the queries, one 256-byte transpose per warp, and the
// warps' states for the final merge.
template <int HEAD_MAX>
struct alignas(16) Smem {
  static constexpr int kWarps = warps_for<HEAD_MAX>();
  // warps whose final states the buffers hold at once: eight warps' would need 66 KiB at head
  // 256, past the 48 KiB of static shared memory, so warps 4..7 fold into 0..3 first
  static constexpr int kStates = kWarps < 4 ? kWarps : 4;
  // query rows padded by 64 bytes: the 8 rows a phase of 16-byte loads touches fall on
  // distinct banks
  static constexpr int kQP = HEAD_MAX + 32;
  static constexpr int kOP = HEAD_MAX + 4;  // O rows: lanes t = 0..3 write 4 rows at once
  uint16_t q[kHeads][kQP];
  uint16_t p[kWarps][kHeads][kTok];  // per warp: P[head][token], 16-bit
  float o[kStates][kHeads][kOP];  // per warp at the end: unnormalised O[head][dim]
  float m[kStates][kHeads], l[kStates][kHeads];
};

// Zero the tokens >= len of one lane's values of one dim: tokens tok .. tok + 3, as loaded
// (EB = 2: two words of two 16-bit tokens; EB = 1: one word of four fp8 bytes).
template <int EB>
ATTN_DEVICE void keep_values(uint32_t* w, int tok, int len) {
  const int keep = min(max(len - tok, 0), 4);  // tokens of the four that are real
  if constexpr (EB == 1) {
    w[0] &= keep == 4 ? 0xFFFFFFFFu : (1u << (8 * keep)) - 1u;
  } else {
    w[0] &= keep >= 2 ? 0xFFFFFFFFu : keep == 1 ? 0xFFFFu : 0u;
    w[1] &= keep == 4 ? 0xFFFFFFFFu : keep == 3 ? 0xFFFFu : 0u;
  }
}

// 2^x in one instruction (the matrix-unit body's softmax; exp2f adds a denormal-range fixup
// of five instructions): x = -inf gives 0, results below 2^-126 flush to 0.
ATTN_DEVICE float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

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

// The body, for any block size and head size (FIXED_BS = 0), or specialised (FIXED_BS = 16) for
// vLLM's default block of 16 tokens and a head that fills its bucket (a.head_size == HEAD_MAX;
// the caller checks both). Specialised, a tile is exactly one page, every load's offset is a
// constant and no load needs a predicate: the general loop spent ~840 of its 1773 instructions
// per tile on value addresses, predicates and the branches around predicated loads (SASS, fp16
// head 256); issue, not DRAM, bound it (ncu, H200 1 x 100K: 40 % of issue slots
// busy with ~2 warps per scheduler, "wait" the main stall, DRAM 57 % of peak). Specialised:
// ~460 a tile, and 1 x 100K 0.132 -> 0.114 ms, fp8 0.114 -> 0.070 (H200).
template <int QKIND, int CKIND, int HEAD_MAX, int GROUP, int FIXED_BS>
ATTN_DEVICE void partition_body(const AttnDecodeArgs& a, Smem<HEAD_MAX>& s) {
  constexpr int kWarps = Smem<HEAD_MAX>::kWarps;
  constexpr int kBlockThreads = kWarps * 32;
  constexpr int kMergeWarps = Smem<HEAD_MAX>::kStates;
  static_assert(GROUP <= kHeads && kWarps % kMergeWarps == 0, "<= 8 head slots, whole folds");
  static_assert(FIXED_BS == 0 || FIXED_BS == kTok, "specialised for one page per tile");
  constexpr bool kFixed = FIXED_BS != 0;
  constexpr int kEB = elem_bytes(CKIND);
  constexpr bool kFp8 = kEB == 1;
  static_assert(kFp8 || CKIND == QKIND, "16-bit caches hold the queries' type");
  constexpr int kVecDims = 16 / kEB;  // dims of one 16-byte key vector (vLLM's x)
  constexpr int kKeyVecs = HEAD_MAX / (4 * kVecDims);  // key vectors per token and lane
  constexpr int kDimTiles = HEAD_MAX / 16;  // 16-dim tiles of O
  constexpr int kVWords = kFp8 ? 1 : 2;  // one lane's 4 tokens of one dim: 4 or 8 bytes
  // what the widened fp8 elements carry (e4m3 by bit moves: x 2^-8): undone in the fp32 scales
  constexpr float kRescale = widened_rescale<CKIND>();

  // The block's work, as the CUDA-core body computes it (inline: routed through a struct
  // filled by a helper, the CUDA-core body lost its uniform registers and ran 40 % slower,
  // H200 1 x 100K: 0.246 ms against 0.176).
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int group = a.num_heads / a.num_kv_heads;
  const int head_groups = (group + GROUP - 1) / GROUP;
  const int kv_head = blockIdx.x / head_groups;
  const int g0 = (blockIdx.x % head_groups) * GROUP;
  const int G = min(GROUP, group - g0);  // real heads; slots G.. carry zero queries
  const int head0 = kv_head * group + g0;
  const int part = blockIdx.y;
  const int seq = blockIdx.z;
  const int D = kFixed ? HEAD_MAX : a.head_size;
  const int start = part * a.partition_size;
  int bs_shift = kFixed ? kTokShift : 0;
  if (!kFixed) {
    while ((1 << bs_shift) < a.block_size) ++bs_shift;
  }
  const int bs_mask = (1 << bs_shift) - 1;
  const int32_t* table = a.block_tables + seq * a.table_stride;

  // The prologue's reads go out together, none waiting on another: the sequence's length, the
  // block's queries (into registers, staged in shared memory once the first tile's loads are
  // out) and the page ids of the warp's first two tiles, read before the length is known
  // (bounded by the table's width; ids of tokens past the end are dropped once it is: keep).
  // Read after it, and the queries after the first tile's loads, three latencies stood in
  // series before a warp's first product, the queries' behind every SM's first burst of keys
  // and values in the DRAM queues: the queries were ready 5.4 us into a block at 6 / 1 heads
  // 1 x 100K, 3.5 us at 24 / 4 1 x 8K (globaltimer stamps, H200); read together, 1.5-1.7 us
  // (docs/benchmarks.md#decode-kernel-choices).
  const int seq_len_stored = a.seq_lens[seq];
  struct Pages {  // one lane's page ids of a tile: keys of tokens g, g + 8, values of 4t ..
    int a, b, v;
  };
  auto table_pages = [&](int j) ATTN_INLINE_LAMBDA {
    auto id = [&](int tok) ATTN_INLINE_LAMBDA {
      const int i = tok >> bs_shift;
      return i < a.table_width ? table[i] : 0;
    };
    const int tok0 = start + j * kTok;
    if constexpr (kFixed) {  // one page a tile (the partition starts on a page): one read
      const int page = id(tok0);
      return Pages{page, page, page};
    }
    return Pages{id(tok0 + g), id(tok0 + g + 8), id(tok0 + 4 * t)};
  };
  constexpr int kQueryLoads = kHeads * HEAD_MAX / kBlockThreads;  // per thread
  static_assert(kHeads * HEAD_MAX % kBlockThreads == 0, "whole query loads");
  const uint16_t* query = static_cast<const uint16_t*>(a.query);
  uint16_t q_early[kQueryLoads];
#pragma unroll
  for (int u = 0; u < kQueryLoads; ++u) {
    const int i = tid + u * kBlockThreads, r = i / HEAD_MAX, d = i % HEAD_MAX;
    q_early[u] = r < G && d < D ? query[seq * a.q_seq_stride + (head0 + r) * a.q_head_stride + d]
                                : static_cast<uint16_t>(0);
  }
  const Pages first_read = table_pages(warp), ahead_read = table_pages(warp + kWarps);

  const int seq_len = min(seq_len_stored, a.table_width * a.block_size);
  if (start >= seq_len) {
    if (a.num_partitions == 1) {  // an empty sequence: zeros, as the merge writes them
      for (int i = tid; i < G * D; i += kBlockThreads) {
        store_elem<QKIND>(a.out, seq * a.out_seq_stride + (head0 + i / D) * a.out_head_stride +
                                     i % D, 0.0f);
      }
    }
    return;  // the merge reads only partitions that hold tokens
  }
  const int end = min(start + a.partition_size, seq_len);

  const uint8_t* k_head =
      static_cast<const uint8_t*>(a.key_cache) + kv_head * a.k_head_stride * kEB;
  const uint8_t* v_head =
      static_cast<const uint8_t*>(a.value_cache) + kv_head * a.v_head_stride * kEB;
  const int64_t k_block_bytes = a.k_block_stride * kEB, v_block_bytes = a.v_block_stride * kEB;
  const int block_size = kFixed ? FIXED_BS : a.block_size;
  const int k_group_bytes = block_size * 16;  // one x-group (16 bytes a token) of a page
  const int v_dim_bytes = block_size * kEB;   // one dim of a page's values
  const float qscale = a.scale * (kLog2e * kRescale);
  float slope[2];  // this lane's heads 2t, 2t + 1
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int h = 2 * t + e;
    slope[e] = a.alibi_slopes != nullptr && h < G ? a.alibi_slopes[head0 + h] * kLog2e : 0.0f;
  }

  float o[kDimTiles][4];  // O^T: (dim 16 i + g (+8), head 2t (+1))
#pragma unroll
  for (int i = 0; i < kDimTiles; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};  // heads 2t, 2t + 1

  // The warp's tiles are j = warp, warp + kWarps, ...; a tile's loads are in flight while the
  // previous one computes: the keys of tile j + kWarps are requested as soon as tile j's scores
  // have read its keys, its values as soon as tile j's P.V has read its values, so the
  // registers that hold them are the same and only their lifetimes move. Page ids are read two
  // tiles ahead of their loads: a table read in front of a tile's own loads put two memory
  // latencies in series per tile (1 x 100K: 0.195 ms on the H200 against the wmma body's
  // 0.151).
  const int n_tiles = (end - start + kTok - 1) / kTok;
  auto tile_len = [&](int j) ATTN_INLINE_LAMBDA {
    return j < n_tiles ? min(kTok, end - (start + j * kTok)) : 0;
  };
  // ids read by table_pages, with those of tokens past the partition's end set to 0 (nothing
  // is loaded from them; pages_of's result)
  auto keep = [&](const Pages& read, int j) ATTN_INLINE_LAMBDA {
    if constexpr (kFixed) return j < n_tiles ? read : Pages{0, 0, 0};
    const int len = tile_len(j);
    return Pages{g < len ? read.a : 0, g + 8 < len ? read.b : 0, 4 * t < len ? read.v : 0};
  };
  // this lane's page ids of tile j: keys of tokens g and g + 8, values of tokens 4t .. 4t + 3
  // (0 past the partition's end, where nothing is loaded)
  auto pages_of = [&](int j) ATTN_INLINE_LAMBDA {
    if constexpr (kFixed) {  // one page a tile (the partition starts on a page): one read
      const int page = j < n_tiles ? table[(start >> kTokShift) + j] : 0;
      return Pages{page, page, page};
    }
    const int tok0 = start + j * kTok, len = tile_len(j);
    return Pages{g < len ? table[(tok0 + g) >> bs_shift] : 0,
                 g + 8 < len ? table[(tok0 + g + 8) >> bs_shift] : 0,
                 4 * t < len ? table[(tok0 + 4 * t) >> bs_shift] : 0};
  };
  // keys of tokens g and g + 8, x-groups 4p + t (16-bit: dims 32p + 8t .. + 7; fp8: 64p + 16t
  // .. + 15)
  Vec16 ka[kKeyVecs], kb[kKeyVecs];
  auto load_keys = [&](int j, const Pages& pg) ATTN_INLINE_LAMBDA {
    if constexpr (kFixed) {  // tokens past the end are read from their (real) page and masked
      const uint8_t* src = k_head + pg.a * k_block_bytes + g * 16 + t * k_group_bytes;
#pragma unroll
      for (int p = 0; p < kKeyVecs; ++p) {
        ka[p] = load_vec<Vec16>(src + 4 * p * k_group_bytes);
        kb[p] = load_vec<Vec16>(src + 4 * p * k_group_bytes + 8 * 16);
      }
      return;
    }
    const int tok0 = start + j * kTok, len = tile_len(j);
    const uint8_t* a_src = k_head + pg.a * k_block_bytes + ((tok0 + g) & bs_mask) * 16;
    const uint8_t* b_src = k_head + pg.b * k_block_bytes + ((tok0 + g + 8) & bs_mask) * 16;
#pragma unroll
    for (int p = 0; p < kKeyVecs; ++p) {
      const int xg = 4 * p + t;
      const bool in_head = kVecDims * xg < D;
      const Vec16 zero{{0, 0, 0, 0}};
      ka[p] = g < len && in_head ? load_vec<Vec16>(a_src + xg * k_group_bytes) : zero;
      kb[p] = g + 8 < len && in_head ? load_vec<Vec16>(b_src + xg * k_group_bytes) : zero;
    }
  };
  // values of tokens 4t .. 4t + 3, dims 16 i + g (v0) and 16 i + g + 8 (v1), as loaded
  struct alignas(4 * kVWords) ValueWords {
    uint32_t w[kVWords];
  };
  ValueWords v0[kDimTiles], v1[kDimTiles];
  auto load_values = [&](int j, const Pages& pg) ATTN_INLINE_LAMBDA {
    if constexpr (kFixed) {  // tokens past the end: read, then zeroed in the last tile
      const uint8_t* src = v_head + pg.v * v_block_bytes + 4 * t * kEB + g * v_dim_bytes;
#pragma unroll
      for (int i = 0; i < kDimTiles; ++i) {
        v0[i] = load_vec<ValueWords>(src + 16 * i * v_dim_bytes);
        v1[i] = load_vec<ValueWords>(src + (16 * i + 8) * v_dim_bytes);
      }
      return;
    }
    const int tok0 = start + j * kTok;
    const bool ok = 4 * t < tile_len(j);
    const uint8_t* src = v_head + pg.v * v_block_bytes + ((tok0 + 4 * t) & bs_mask) * kEB;
#pragma unroll
    for (int i = 0; i < kDimTiles; ++i) {
      const int d0 = 16 * i + g, d1 = d0 + 8;
      v0[i] = ok && d0 < D ? load_vec<ValueWords>(src + d0 * v_dim_bytes) : ValueWords{};
      v1[i] = ok && d1 < D ? load_vec<ValueWords>(src + d1 * v_dim_bytes) : ValueWords{};
    }
  };

  Pages ahead = keep(ahead_read, warp + kWarps);  // the warp's next tile's page ids, a tile early
  {
    const Pages first = keep(first_read, warp);
    load_keys(warp, first);
    load_values(warp, first);
  }
  // The queries reach shared memory after the first tile's loads are out: a barrier is a fence
  // the compiler does not move loads across (H200:
  // staged before them, 6 / 1 heads 1 x 8K 0.0149 ms, after 0.0137).
#pragma unroll
  for (int u = 0; u < kQueryLoads; ++u) {
    const int i = tid + u * kBlockThreads;
    s.q[i / HEAD_MAX][i % HEAD_MAX] = q_early[u];
  }
  __syncthreads();  // the queries, the only data the warps share before the merge
  for (int j = warp; j < n_tiles; j += kWarps) {
    const int tok0 = start + j * kTok;
    const int len = tile_len(j);
    const Pages next = ahead;
    ahead = pages_of(j + 2 * kWarps);

    // S^T = K Q^T: (token g (+8), head 2t (+1)), as two independent chains of products (one
    // chain put every product's latency in series: 16 at head 256)
    float sc2[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int p = 0; p < kKeyVecs; ++p) {
      const Vec16* q = reinterpret_cast<const Vec16*>(&s.q[g][4 * kVecDims * p + kVecDims * t]);
      if constexpr (kFp8) {  // 16 dims a vector: widened into 8 words, four k steps
        const Vec16 q0 = q[0], q1 = q[1];
        uint32_t wa[8], wb[8];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          widen4<CKIND, QKIND>(ka[p].w[r], wa[2 * r], wa[2 * r + 1]);
          widen4<CKIND, QKIND>(kb[p].w[r], wb[2 * r], wb[2 * r + 1]);
        }
        const uint32_t qw[8] = {q0.w[0], q0.w[1], q0.w[2], q0.w[3],
                                q1.w[0], q1.w[1], q1.w[2], q1.w[3]};
#pragma unroll
        for (int st = 0; st < 4; ++st) {
          m16n8k16::mma<QKIND>(sc2[st % 2], wa[2 * st], wb[2 * st], wa[2 * st + 1],
                               wb[2 * st + 1], qw[2 * st], qw[2 * st + 1]);
        }
      } else {  // 8 dims a vector: two k steps
        const Vec16 q0 = q[0];
        m16n8k16::mma<QKIND>(sc2[0], ka[p].w[0], kb[p].w[0], ka[p].w[1], kb[p].w[1], q0.w[0],
                             q0.w[1]);
        m16n8k16::mma<QKIND>(sc2[1], ka[p].w[2], kb[p].w[2], ka[p].w[3], kb[p].w[3], q0.w[2],
                             q0.w[3]);
      }
    }
    float sc[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) sc[i] = sc2[0][i] + sc2[1][i];
    if (j + kWarps < n_tiles) load_keys(j + kWarps, next);

    // online softmax per head over the warp's tokens (base 2, fp32 scale)
    float x[4], m_tile[2];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int tok = g + 8 * (i / 2);
      const float rel = static_cast<float>(tok0 + tok - seq_len + 1);
      x[i] = tok < len ? fmaf(slope[i % 2], rel, sc[i] * qscale) : -INFINITY;
    }
#pragma unroll
    for (int e = 0; e < 2; ++e) m_tile[e] = m16n8k16::col_max(fmaxf(x[e], x[e + 2]));
    float alpha[2], prob[4];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float m_new = fmaxf(m_run[e], m_tile[e]);  // finite: the tile holds a real token
      alpha[e] = fast_exp2(m_run[e] - m_new);
      prob[e] = fast_exp2(x[e] - m_new);
      prob[e + 2] = fast_exp2(x[e + 2] - m_new);
      l_run[e] = l_run[e] * alpha[e] + (prob[e] + prob[e + 2]);  // this lane's tokens
      m_run[e] = m_new;
    }
    // P^T's B fragment wants head g and tokens 4t .. 4t + 3: transposed through 256 bytes
    __syncwarp();  // the previous tile's reads of s.p are done
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s.p[warp][2 * t + i % 2][g + 8 * (i / 2)] = to_bits16<QKIND>(prob[i]);
    }
    __syncwarp();
    const Vec8 pf = *reinterpret_cast<const Vec8*>(&s.p[warp][g][4 * t]);

    if (len < kTok) {  // the partition's last tile: tokens past the end may be inf/NaN
#pragma unroll
      for (int i = 0; i < kDimTiles; ++i) {
        keep_values<kEB>(v0[i].w, 4 * t, len);
        keep_values<kEB>(v1[i].w, 4 * t, len);
      }
    }

    // O^T = alpha O^T + V^T P^T
#pragma unroll
    for (int i = 0; i < kDimTiles; ++i) {
      uint32_t x0[2], x1[2];  // tokens (4t, 4t + 1), (4t + 2, 4t + 3) of dims g and g + 8
      if constexpr (kFp8) {
        widen4<CKIND, QKIND>(v0[i].w[0], x0[0], x0[1]);
        widen4<CKIND, QKIND>(v1[i].w[0], x1[0], x1[1]);
      } else {
        x0[0] = v0[i].w[0], x0[1] = v0[i].w[1], x1[0] = v1[i].w[0], x1[1] = v1[i].w[1];
      }
      o[i][0] *= alpha[0];
      o[i][1] *= alpha[1];
      o[i][2] *= alpha[0];
      o[i][3] *= alpha[1];
      m16n8k16::mma<QKIND>(o[i], x0[0], x1[0], x0[1], x1[1], pf.w[0], pf.w[1]);
    }
    if (j + kWarps < n_tiles) load_values(j + kWarps, next);
  }

  // Each warp's state (sums over its lanes' tokens first), then the merge of the warps.
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    l_run[e] = m16n8k16::col_sum(l_run[e]);
  }
  // This warp's state into slot `slot` of the merge's buffers: m = -inf with l = 0 for a warp
  // that had no tile.
  auto store_state = [&](int slot) ATTN_INLINE_LAMBDA {
    if (g == 0) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        s.m[slot][2 * t + e] = m_run[e];
        s.l[slot][2 * t + e] = l_run[e];
      }
    }
#pragma unroll
    for (int i = 0; i < kDimTiles; ++i) {
      s.o[slot][2 * t][16 * i + g] = o[i][0];
      s.o[slot][2 * t + 1][16 * i + g] = o[i][1];
      s.o[slot][2 * t][16 * i + g + 8] = o[i][2];
      s.o[slot][2 * t + 1][16 * i + g + 8] = o[i][3];
    }
  };
  // whether this warp's state goes into the merge's buffers (every warp's, with four)
  const bool merge_warp = kWarps == kMergeWarps || warp < kMergeWarps;
  // Eight warps: warps 4..7 hand their states to warps 0..3 through the merge's buffers
  // (weights 2^(m - max); a warp that had no tile weighs 0).
#pragma unroll
  for (int r = 1; r < kWarps / kMergeWarps; ++r) {
    const int slot = warp % kMergeWarps;
    if (warp / kMergeWarps == r) store_state(slot);
    __syncthreads();
    if (merge_warp) {
      float self[2], other[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float m_other = s.m[slot][2 * t + e];
        const float m_new = fmaxf(m_run[e], m_other);  // -inf where neither had a tile
        self[e] = m_run[e] == -INFINITY ? 0.0f : exp2f(m_run[e] - m_new);
        other[e] = m_other == -INFINITY ? 0.0f : exp2f(m_other - m_new);
        l_run[e] = l_run[e] * self[e] + s.l[slot][2 * t + e] * other[e];
        m_run[e] = m_new;
      }
#pragma unroll
      for (int i = 0; i < kDimTiles; ++i) {
        o[i][0] = o[i][0] * self[0] + s.o[slot][2 * t][16 * i + g] * other[0];
        o[i][1] = o[i][1] * self[1] + s.o[slot][2 * t + 1][16 * i + g] * other[1];
        o[i][2] = o[i][2] * self[0] + s.o[slot][2 * t][16 * i + g + 8] * other[0];
        o[i][3] = o[i][3] * self[1] + s.o[slot][2 * t + 1][16 * i + g + 8] * other[1];
      }
    }
    __syncthreads();  // the buffers are free again
  }
  if (merge_warp) store_state(warp);
  __syncthreads();
  const bool single = a.num_partitions == 1;
  for (int i = tid; i < G * D; i += kBlockThreads) {
    const int h = i / D, d = i % D;
    float m = s.m[0][h];
#pragma unroll
    for (int w = 1; w < kMergeWarps; ++w) m = fmaxf(m, s.m[w][h]);  // finite: warp 0 had a tile
    float num = 0.0f, den = 0.0f;
#pragma unroll
    for (int w = 0; w < kMergeWarps; ++w) {
      const float wt = exp2f(s.m[w][h] - m);
      num = fmaf(wt, s.o[w][h][d], num);
      den = fmaf(wt, s.l[w][h], den);
    }
    const float v = num * (a.v_scale * kRescale / den);  // den >= 1: the max token gives 2^0
    if (single) {
      store_elem<QKIND>(a.out, seq * a.out_seq_stride + (head0 + h) * a.out_head_stride + d, v);
    } else {
      const int64_t row = (static_cast<int64_t>(seq) * a.num_heads + head0 + h) * a.num_partitions;
      a.part_out[(row + part) * D + d] = v;
      if (d == 0) {
        a.part_lse[row + part] = m + log2f(den);
      }
    }
  }
}

}  // namespace decode_warp
}  // namespace attn
#endif  // ATTN_DECODE_HAVE_MMA
