// Paged decode attention reading vLLM 0.6.3's cache in place: GQA-gridded split-KV.
//
// Two partition bodies share the grid, the partials and the merge: on NVIDIA, 16-bit queries
// over a cache of their own type or an fp8 one run decode_warp.cuh's (four independent warp
// streams on the m16n8k16 matrix instruction); fp32 queries and every CoreX build run the
// CUDA-core body below.
//
// Grid of the partition kernel: (num_kv_heads x head_groups, num_partitions, num_seqs); one
// block of 128 threads reads its partition's K and V pages once for GROUP query heads of one
// KV head. GROUP (1-8) is fixed at compile time, one library per value (ATTN_GROUP_SLOTS):
// every loop over heads is then straight-line code whose FMA chains interleave. With a runtime
// `if (g >= G) break` each head was its own basic block, an 8-deep dependent FMA chain, and the
// H200 issued one instruction per 6.4 cycles per warp (ncu, 1 x 100K): 0.191 ms. Padding the
// group to 8 slots removed the branches but cost a third more FMAs for Qwen's 6 (0.211 ms);
// the exact count gave 0.177 ms (bench/native_tune.py, H200;
// docs/benchmarks.md#decode-kernel-choices). Groups above 8 span several blocks of
// ceil(group / blocks) heads; a last block with fewer real heads computes zero-query rows it
// never writes.
//
// The partition's page ids are staged in shared memory once per window of kPageWindow pages
// (one window covers every partition the planner makes up to 16K tokens at block 16). Per tile
// of kTile tokens:
//   1. scores: one token per thread, its 16-byte key vectors against the group's queries
//      (fp32, prescaled by scale * log2(e), broadcast from shared memory), in chunks of
//      kKeyChunk vectors: the next chunk's loads are issued before the current one is
//      multiplied, and the last chunk's slot issues the tile's first value loads instead;
//   2. tile max per head through shared memory, online-softmax rescale (base 2); the scores
//      and probabilities live in one of two buffers by tile parity, so a tile needs three
//      barriers and none for the next tile's writes;
//   3. P.V: each thread owns head dimensions and walks the tile's value vectors (16 bytes =
//      8 fp16 tokens of one dimension, contiguous in the value layout), again one chunk ahead;
//      before it starts, the next tile's first key chunk is requested, so loads stay in flight
//      across the softmax barriers and the P.V phase.
// Every loop under `#pragma unroll` has a compile-time trip count (the head bucket, not the
// head size) and predicated bodies, never a `break`: nvcc and clang alike keep every register
// array in registers (no local memory; ci/clang_check.py checks it for every kernel).
// Every partial is fp32. With one partition the block normalises and writes the output; with
// several it writes the partition's normalised output and base-2 log-sum-exp, and a second
// kernel merges the valid partitions of each (sequence, query head); on sm_90 and later a small
// merge is a programmatic dependent of the partition kernel (launch_merge).
//
// No host sync and no allocation: lengths are read on the device, so a CUDA graph captured at
// one max_seq_len stays exact for any seq_lens up to it. Tokens past a sequence's end are never
// loaded from pages it does not own and are masked inside its last page (value slots there may
// hold inf/NaN).

#include "attn_convert.cuh"
#include "attn_decode_abi.h"
#include "attn_platform.cuh"

#include <atomic>

namespace attn {

// Tuning knobs, fixed at compile time (bench/native_tune.py builds variants with -D). The
// defaults are the measured best on the H200 (docs/benchmarks.md#decode-kernel-choices).
// ATTN_THREADS: the CUDA-core body's block (the matrix-unit body's is decode_warp::warps_for;
// the merge's kMergeThreads).
#ifndef ATTN_THREADS
#define ATTN_THREADS 128
#endif
#ifndef ATTN_KEY_LOADS
#define ATTN_KEY_LOADS 4  // 16-byte key loads per chunk (two chunks in flight per thread)
#endif
#ifndef ATTN_VALUE_LOADS
#define ATTN_VALUE_LOADS 4  // value loads per chunk (two chunks in flight per thread)
#endif
#ifndef ATTN_MIN_BLOCKS
#define ATTN_MIN_BLOCKS 0  // > 0: ask the compiler for this many resident blocks per SM
#endif

constexpr int kThreads = ATTN_THREADS;
constexpr int kTile = kThreads;  // tokens per tile: one per thread in the score phase
constexpr int kGroupMax = 8;     // query heads one block serves at most
constexpr int kReducersPerHead = kThreads / kGroupMax;       // 16 threads reduce one head's tile
constexpr int kTokensPerReducer = kTile / kReducersPerHead;  // 8 scores each
constexpr int kMinBlockSize = 8;
// Page ids staged per window: 4 KiB, so the largest block (group 8, fp32, head 256) stays at
// 20.5 KiB of the BI-V100's 32 KiB.
constexpr int kPageWindow = 1024;
constexpr float kLog2e = 1.4426950408889634f;
// The merge: one block per (query head, sequence, slice of merge_dims() dimensions), its
// kMergeThreads threads forming kMergeThreads / merge_dims() streams, each folding every stream-th
// partition into its own running maximum, weight and sum as the partitions arrive (a
// partition's log-sum-exp and partial are requested together, kMergeLoads at a time); the
// streams meet once, at the end.
// One block per (head, sequence) walking every partition was latency-bound: 13-20 us (ncu, H200)
// for 6-24 heads over 64-131 partitions, a fixed cost that put the tensor-parallel
// slices at batch 1 at 1.3-1.9x their floor.
constexpr int kMergeThreads = 128;  // whatever ATTN_THREADS is
constexpr int kMergeLoads = 8;  // partitions in flight per thread
// Slices of 16 dimensions (8 streams) from kMergeNarrowAt partitions on, else 32 (4 streams):
// against a first pass over the log-sum-exps with 32-dimension slices, the streaming merge with
// 16 took 1.4-1.5 us off 128-131 partitions (6 / 1 heads at 1 x 32K and 1 x 100K) and 0.9-1.0 us
// off 64-66 (12 / 2 at 1 x 100K, 24 / 4 at 1 x 32K), 8 (16 streams) no more; below 48
// partitions the narrower slices' extra blocks cost more than their shorter chains save (24 / 4
// at 8 x 100K, 8 partitions: +2.8 us with 16, +7.2 with 8; native_ab.py, H200;
// docs/benchmarks.md#decode-kernel-choices).
// Python mirrors it (attn_core.native.split.merge_dims).
constexpr int kMergeNarrowAt = 48;
constexpr int kMergeNarrowDims = 16, kMergeWideDims = 32;
__host__ __device__ constexpr int merge_dims(int num_partitions) {
  return num_partitions >= kMergeNarrowAt ? kMergeNarrowDims : kMergeWideDims;
}
static_assert(kMergeThreads % kMergeWideDims == 0 && kMergeWideDims % kMergeNarrowDims == 0,
              "slices");
static_assert(kThreads % kGroupMax == 0 && kTile % (kThreads / kGroupMax) == 0, "reducers");

constexpr int cmin(int a, int b) { return a < b ? a : b; }
constexpr int cmax(int a, int b) { return a > b ? a : b; }

template <int GROUP, int HEAD_MAX>
struct alignas(16) PartitionSmem {
  float q[GROUP][HEAD_MAX];  // scaled queries, zero past the head size and the group; then a
                             // fold buffer
  float p[2][GROUP][kTile];  // by tile parity: scores, then probabilities; then per-thread sums
  float red[GROUP][kReducersPerHead];
  int pages[kPageWindow];  // the window's page ids
};

// Compile-time shape of one instantiation.
template <int CKIND, int HEAD_MAX, int VEC_BYTES>
struct Layout {
  static constexpr int kBytes = elem_bytes(CKIND);
  static constexpr int kX = 16 / kBytes;               // elements per 16-byte key vector
  static constexpr int kKeyVecs = HEAD_MAX / kX;       // key vectors per token (head bucket)
  static constexpr int kKeyChunk = cmin(ATTN_KEY_LOADS, kKeyVecs);
  static constexpr int kKeyChunks = kKeyVecs / kKeyChunk;
  static constexpr int kDims = HEAD_MAX > kThreads ? HEAD_MAX / kThreads : 1;
  static constexpr int kTokenGroups = HEAD_MAX < kThreads ? kThreads / HEAD_MAX : 1;
  static constexpr int kDimThreads = kThreads / kTokenGroups;
  static constexpr int kVTokens = VEC_BYTES / kBytes;  // tokens per value vector (4, 8 or 16)
  static constexpr int kVWords = VEC_BYTES / 4;
  static constexpr int kVVecs = kTile / (kVTokens * kTokenGroups);  // value vectors per dim
  static constexpr int kVChunk = cmin(cmax(ATTN_VALUE_LOADS / kDims, 1), kVVecs);
  static constexpr int kVChunks = kVVecs / kVChunk;
  static_assert(kKeyVecs % kKeyChunk == 0 && kVVecs % kVChunk == 0, "chunks divide");
  static_assert(HEAD_MAX % kThreads == 0 || kThreads % HEAD_MAX == 0, "dimension mapping");
  static_assert(kX % 4 == 0 && kVTokens % 4 == 0, "four elements at a time");
};

// Where one thread's loads come from; everything here is fixed for the whole partition.
struct Source {
  const uint8_t* k_head;
  const uint8_t* v_head;
  int64_t k_block_bytes, v_block_bytes;
  const int* pages;  // the window's page ids (shared memory)
  int bs_shift, bs_mask;
  int head_size;
};

// kKeyChunk key vectors (c0, c0 + 1, ...) of the token at window offset `tok`; zeros for an
// invalid token or vectors past the head size.
template <int N>
ATTN_DEVICE void load_keys(uint32_t (&raw)[N][4], const Source& src, int tok, bool valid,
                           int c0, int n_vec) {
  const int64_t page = valid ? src.pages[tok >> src.bs_shift] : 0;
  const uint8_t* k_tok = src.k_head + page * src.k_block_bytes +
                         static_cast<int64_t>(tok & src.bs_mask) * 16;
  const int64_t vec_stride = static_cast<int64_t>(src.bs_mask + 1) * 16;
#pragma unroll
  for (int u = 0; u < N; ++u) {
    if (valid && c0 + u < n_vec) {
      const Vec16 v = load_vec<Vec16>(k_tok + (c0 + u) * vec_stride);
#pragma unroll
      for (int w = 0; w < 4; ++w) raw[u][w] = v.w[w];
    } else {
#pragma unroll
      for (int w = 0; w < 4; ++w) raw[u][w] = 0u;
    }
  }
}

// score[g] += q[g] . key over the chunk's vectors (queries past the head size are zero), four
// elements at a time: one 16-byte shared-memory read of each query per four FMAs.
template <int CKIND, int GROUP, int HEAD_MAX, int N>
ATTN_DEVICE void score_chunk(const uint32_t (&raw)[N][4], const float (&q)[GROUP][HEAD_MAX],
                             int c0, float (&score)[GROUP]) {
  constexpr int kX = 16 / elem_bytes(CKIND);
#pragma unroll
  for (int u = 0; u < N; ++u) {
#pragma unroll
    for (int sub = 0; sub < kX / 4; ++sub) {
      float k[4];
      unpack4<CKIND>(raw[u], sub, k);
      const int d0 = (c0 + u) * kX + sub * 4;
      // straight-line code over every head slot: the GROUP FMA chains interleave
#pragma unroll
      for (int g = 0; g < GROUP; ++g) {
#pragma unroll
        for (int i = 0; i < 4; ++i) score[g] = fmaf(q[g][d0 + i], k[i], score[g]);
      }
    }
  }
}

// First token (tile-relative) of value vector u for this thread.
template <class L>
ATTN_DEVICE int value_token(int u, int token_group) {
  return (u * L::kTokenGroups + token_group) * L::kVTokens;
}

// Value vectors u0 .. u0 + kVChunk - 1 of every dimension this thread owns; zeros past the tile
// or the head size.
template <class L>
ATTN_DEVICE void load_values(uint32_t (&raw)[L::kVChunk][L::kDims][L::kVWords],
                             const Source& src, int tile_off, int tile_len, int token_group,
                             int dim0, int u0) {
  const int block_size = src.bs_mask + 1;
#pragma unroll
  for (int u = 0; u < L::kVChunk; ++u) {
    const int j = value_token<L>(u0 + u, token_group);
    const bool in_tile = j < tile_len;
    const int tok = tile_off + j;
    const int64_t page = in_tile ? src.pages[tok >> src.bs_shift] : 0;
    const uint8_t* base = src.v_head + page * src.v_block_bytes +
                          static_cast<int64_t>(tok & src.bs_mask) * L::kBytes;
#pragma unroll
    for (int k = 0; k < L::kDims; ++k) {
      const int d = dim0 + k * L::kDimThreads;
      if (in_tile && d < src.head_size) {
        const uint8_t* p = base + static_cast<int64_t>(d) * block_size * L::kBytes;
        if (L::kVWords == 4) {
          const Vec16 v = load_vec<Vec16>(p);
#pragma unroll
          for (int w = 0; w < L::kVWords; ++w) raw[u][k][w] = v.w[w];
        } else {
          const Vec8 v = load_vec<Vec8>(p);
#pragma unroll
          for (int w = 0; w < L::kVWords; ++w) raw[u][k][w] = v.w[w];
        }
      } else {
#pragma unroll
        for (int w = 0; w < L::kVWords; ++w) raw[u][k][w] = 0u;
      }
    }
  }
}

// acc[g][k] += sum_i p[g][j + i] * value[k][i] over the chunk's vectors, four tokens at a time.
template <class L, int CKIND, int GROUP>
ATTN_DEVICE void pv_chunk(const uint32_t (&raw)[L::kVChunk][L::kDims][L::kVWords],
                          const float (&p)[GROUP][kTile], int tile_len, int token_group, int u0,
                          float (&acc)[GROUP][L::kDims]) {
  const bool partial = tile_len < kTile;
#pragma unroll
  for (int u = 0; u < L::kVChunk; ++u) {
#pragma unroll
    for (int sub = 0; sub < L::kVTokens / 4; ++sub) {
      const int j = value_token<L>(u0 + u, token_group) + sub * 4;
      float v[L::kDims][4];
#pragma unroll
      for (int k = 0; k < L::kDims; ++k) {
        unpack4<CKIND>(raw[u][k], sub, v[k]);
        // slots past the tile inside the last page may hold inf/NaN: never multiply them by 0
        if (partial) {
#pragma unroll
          for (int i = 0; i < 4; ++i) v[k][i] = j + i < tile_len ? v[k][i] : 0.0f;
        }
      }
      // straight-line code over every head slot: the GROUP x kDims FMA chains interleave
#pragma unroll
      for (int g = 0; g < GROUP; ++g) {
        float probs[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) probs[i] = p[g][j + i];
#pragma unroll
        for (int k = 0; k < L::kDims; ++k) {
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[g][k] = fmaf(probs[i], v[k][i], acc[g][k]);
        }
      }
    }
  }
}

template <int N, int M>
ATTN_DEVICE void copy_words(uint32_t (&to)[N][M], const uint32_t (&from)[N][M]) {
#pragma unroll
  for (int a = 0; a < N; ++a) {
#pragma unroll
    for (int b = 0; b < M; ++b) to[a][b] = from[a][b];
  }
}

template <int N, int M, int W>
ATTN_DEVICE void copy_words(uint32_t (&to)[N][M][W], const uint32_t (&from)[N][M][W]) {
#pragma unroll
  for (int a = 0; a < N; ++a) copy_words(to[a], from[a]);
}

// The merge as a programmatic dependent of the partition kernel (NVIDIA sm_90+, batch-1-sized
// merges: launch_merge): launched with cudaLaunchAttributeProgrammaticStreamSerialization, its
// blocks are placed on SMs as partition blocks leave them and wait in wait_for_partitions()
// until the whole partition grid is done and its stores are visible, so the merge's launch is
// not a gap between the two kernels. Every partition block releases it as it starts
// (release_merge): the merge's blocks are queued only once the partition grid is resident.
// Elsewhere (CoreX, older GPUs, a merge compiled for compute < 9.0) both are empty and the merge
// launches after the partition grid. ATTN_MERGE_OVERLAP=0 builds the plain launch everywhere.
#ifndef ATTN_MERGE_OVERLAP
#define ATTN_MERGE_OVERLAP 1
#endif
#if ATTN_MERGE_OVERLAP && !defined(__ILUVATAR__) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define ATTN_GRID_DEPENDENCY 1  // griddepcontrol (PTX 7.8, sm_90)
#else
#define ATTN_GRID_DEPENDENCY 0
#endif

ATTN_DEVICE void release_merge() {
#if ATTN_GRID_DEPENDENCY
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

ATTN_DEVICE void wait_for_partitions() {
#if ATTN_GRID_DEPENDENCY
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

#if ATTN_MIN_BLOCKS > 0
#define ATTN_PARTITION_BOUNDS(THREADS) __launch_bounds__(THREADS, ATTN_MIN_BLOCKS)
#else
#define ATTN_PARTITION_BOUNDS(THREADS) __launch_bounds__(THREADS)
#endif

// One partition of one (sequence, KV head, head group); VEC_BYTES is the value load width: 16,
// or 8 for fp8 caches with 8-token blocks (a 16-byte vector would span two pages).
template <int QKIND, int CKIND, int HEAD_MAX, int GROUP, int VEC_BYTES>
ATTN_DEVICE void partition_body(const AttnDecodeArgs& a, PartitionSmem<GROUP, HEAD_MAX>& s) {
  using L = Layout<CKIND, HEAD_MAX, VEC_BYTES>;
  constexpr float kRescale = CKIND == kFp8E4M3 ? kE4M3Rescale : 1.0f;

  const int tid = threadIdx.x;
  const int group = a.num_heads / a.num_kv_heads;
  const int head_groups = (group + GROUP - 1) / GROUP;
  const int kv_head = blockIdx.x / head_groups;
  const int g0 = (blockIdx.x % head_groups) * GROUP;
  const int G = min(GROUP, group - g0);  // real heads; slots G..GROUP-1 carry zero queries
  const int head0 = kv_head * group + g0;
  const int part = blockIdx.y;
  const int seq = blockIdx.z;
  const int D = a.head_size;

  // Lengths beyond the table row are clamped: memory-safe whatever the caller passed.
  const int seq_len = min(a.seq_lens[seq], a.table_width * a.block_size);
  const int start = part * a.partition_size;
  if (start >= seq_len) {
    if (a.num_partitions == 1) {  // an empty sequence: zeros, as the merge writes them
      for (int i = tid; i < G * D; i += kThreads) {
        const int g = i / D;
        store_elem<QKIND>(a.out, seq * a.out_seq_stride + (head0 + g) * a.out_head_stride + i % D,
                          0.0f);
      }
    }
    return;  // the merge reads only partitions that hold tokens
  }
  const int end = min(start + a.partition_size, seq_len);

  const float qscale = a.scale * kLog2e * kRescale;
  for (int i = tid; i < GROUP * HEAD_MAX; i += kThreads) {
    const int g = i / HEAD_MAX, d = i % HEAD_MAX;
    s.q[g][d] = g < G && d < D ? load_elem<QKIND>(a.query, seq * a.q_seq_stride +
                                                               (head0 + g) * a.q_head_stride + d) *
                                     qscale
                               : 0.0f;
  }
  float slope[GROUP];  // vLLM's ALiBi bias: slope * (position - seq_len + 1), in log2 units
#pragma unroll
  for (int g = 0; g < GROUP; ++g) {
    slope[g] = a.alibi_slopes != nullptr && g < G ? a.alibi_slopes[head0 + g] * kLog2e : 0.0f;
  }

  int bs_shift = 0;
  while ((1 << bs_shift) < a.block_size) ++bs_shift;
  Source src;
  src.k_head = static_cast<const uint8_t*>(a.key_cache) + kv_head * a.k_head_stride * L::kBytes;
  src.v_head = static_cast<const uint8_t*>(a.value_cache) + kv_head * a.v_head_stride * L::kBytes;
  src.k_block_bytes = a.k_block_stride * L::kBytes;
  src.v_block_bytes = a.v_block_stride * L::kBytes;
  src.pages = s.pages;
  src.bs_shift = bs_shift;
  src.bs_mask = a.block_size - 1;
  src.head_size = D;
  const int n_vec = D / L::kX;  // key vectors per token
  const int32_t* table = a.block_tables + seq * a.table_stride;

  float m_run[GROUP], l_run[GROUP], acc[GROUP][L::kDims];
#pragma unroll
  for (int g = 0; g < GROUP; ++g) {
    m_run[g] = -INFINITY;
    l_run[g] = 0.0f;
#pragma unroll
    for (int k = 0; k < L::kDims; ++k) acc[g][k] = 0.0f;
  }
  const int token_group = L::kTokenGroups == 1 ? 0 : tid / L::kDimThreads;
  const int dim0 = L::kTokenGroups == 1 ? tid : tid % L::kDimThreads;

  uint32_t kpre[L::kKeyChunk][4];  // the tile's first key chunk, requested ahead
  const int window_tokens = kPageWindow << bs_shift;
  int tile = 0;
  for (int w0 = start; w0 < end; w0 += window_tokens) {
    const int wend = min(w0 + window_tokens, end);
    const int n_pages = (wend - w0 + src.bs_mask) >> bs_shift;
    __syncthreads();  // the previous window's P.V read its pages
    for (int i = tid; i < n_pages; i += kThreads) s.pages[i] = table[(w0 >> bs_shift) + i];
    __syncthreads();  // pages (and, in the first window, the queries) visible
    load_keys(kpre, src, tid, tid < min(kTile, wend - w0), 0, n_vec);

    for (int t0 = w0; t0 < wend; t0 += kTile, ++tile) {
      const int tile_len = min(kTile, wend - t0);
      const int tile_off = t0 - w0;
      const bool valid = tid < tile_len;
      float (&sp)[GROUP][kTile] = s.p[tile & 1];

      // 1. one token's scores per thread, one key chunk ahead; the last slot asks for values
      float score[GROUP];
#pragma unroll
      for (int g = 0; g < GROUP; ++g) score[g] = 0.0f;
      uint32_t vcur[L::kVChunk][L::kDims][L::kVWords];
      uint32_t kcur[L::kKeyChunk][4];
      copy_words(kcur, kpre);
#pragma unroll
      for (int c = 0; c < L::kKeyChunks; ++c) {
        uint32_t knext[L::kKeyChunk][4];
        if (c + 1 < L::kKeyChunks) {
          load_keys(knext, src, tile_off + tid, valid, (c + 1) * L::kKeyChunk, n_vec);
        } else {
          load_values<L>(vcur, src, tile_off, tile_len, token_group, dim0, 0);
        }
        score_chunk<CKIND>(kcur, s.q, c * L::kKeyChunk, score);
        if (c + 1 < L::kKeyChunks) copy_words(kcur, knext);
      }
      if (a.alibi_slopes != nullptr) {
        const float rel = static_cast<float>(t0 + tid - seq_len + 1);
#pragma unroll
        for (int g = 0; g < GROUP; ++g) score[g] = fmaf(slope[g], rel, score[g]);
      }
#pragma unroll
      for (int g = 0; g < GROUP; ++g) sp[g][tid] = valid ? score[g] : -INFINITY;
      __syncthreads();  // A: scores visible

      // 2. the tile's max per head: 16 threads per head, 8 scores each
      {
        const int g = tid / kReducersPerHead, r = tid % kReducersPerHead;
        if (g < GROUP) {
          float m = -INFINITY;
#pragma unroll
          for (int i = 0; i < kTokensPerReducer; ++i) m = fmaxf(m, sp[g][r * kTokensPerReducer + i]);
          s.red[g][r] = m;
        }
      }
      __syncthreads();  // B: partial maxima visible, scores read
#pragma unroll
      for (int g = 0; g < GROUP; ++g) {
        float m_tile = -INFINITY;
#pragma unroll
        for (int r = 0; r < kReducersPerHead; ++r) m_tile = fmaxf(m_tile, s.red[g][r]);
        const float m_new = fmaxf(m_run[g], m_tile);  // finite: the tile holds a real token
        const float alpha = exp2f(m_run[g] - m_new);
        const float prob = valid ? exp2f(score[g] - m_new) : 0.0f;
        sp[g][tid] = prob;
        l_run[g] = l_run[g] * alpha + prob;
#pragma unroll
        for (int k = 0; k < L::kDims; ++k) acc[g][k] *= alpha;
        m_run[g] = m_new;
      }
      __syncthreads();  // C: probabilities visible

      // 3. P.V over this thread's dimensions, one value chunk ahead; the next tile's first
      // key chunk is requested first, so it lands while this tile computes
      {
        const int next = t0 + kTile;
        const int next_len = min(kTile, wend - next);
        if (next < wend) load_keys(kpre, src, next - w0 + tid, tid < next_len, 0, n_vec);
      }
#pragma unroll
      for (int c = 0; c < L::kVChunks; ++c) {
        uint32_t vnext[L::kVChunk][L::kDims][L::kVWords];
        if (c + 1 < L::kVChunks) {
          load_values<L>(vnext, src, tile_off, tile_len, token_group, dim0,
                         (c + 1) * L::kVChunk);
        }
        pv_chunk<L, CKIND>(vcur, sp, tile_len, token_group, c * L::kVChunk, acc);
        if (c + 1 < L::kVChunks) copy_words(vcur, vnext);
      }
    }
  }

  // Sums: every thread holds its own tokens' share, rescaled as the max moved.
  __syncthreads();  // the last P.V read s.p
#pragma unroll
  for (int g = 0; g < GROUP; ++g) s.p[0][g][tid] = l_run[g];
  __syncthreads();
  {
    const int g = tid / kReducersPerHead, r = tid % kReducersPerHead;
    if (g < GROUP) {
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < kTokensPerReducer; ++i) sum += s.p[0][g][r * kTokensPerReducer + i];
      s.red[g][r] = sum;
    }
  }
  __syncthreads();
  // Fold token groups 1.. into group 0 through the (no longer needed) query buffer, one group
  // at a time: with kTokenGroups > 1 each thread owns one dimension (kDims == 1).
#pragma unroll
  for (int from = 1; from < L::kTokenGroups; ++from) {
    if (token_group == from) {
#pragma unroll
      for (int g = 0; g < GROUP; ++g) s.q[g][dim0] = acc[g][0];
    }
    __syncthreads();
    if (token_group == 0) {
#pragma unroll
      for (int g = 0; g < GROUP; ++g) acc[g][0] += s.q[g][dim0];
    }
    __syncthreads();
  }
  if (token_group > 0) return;

  const bool single = a.num_partitions == 1;
#pragma unroll
  for (int g = 0; g < GROUP; ++g) {
    if (g < G) {  // zero-query slots: computed alongside, never written
      float l = 0.0f;
#pragma unroll
      for (int r = 0; r < kReducersPerHead; ++r) l += s.red[g][r];
      const float inv = a.v_scale * kRescale / l;  // l >= 1: the max token gives 2^0
      const int head = head0 + g;
      const int64_t row =
          (static_cast<int64_t>(seq) * a.num_heads + head) * a.num_partitions + part;
#pragma unroll
      for (int k = 0; k < L::kDims; ++k) {
        const int d = dim0 + k * L::kDimThreads;
        if (d < D) {
          if (single) {
            store_elem<QKIND>(a.out, seq * a.out_seq_stride + head * a.out_head_stride + d,
                              acc[g][k] * inv);
          } else {
            a.part_out[row * D + d] = acc[g][k] * inv;
          }
        }
      }
      if (!single && tid == 0) a.part_lse[row] = m_run[g] + log2f(l);
    }
  }
}

}  // namespace attn
#include "decode_warp.cuh"  // the matrix-unit body (uses kThreads and kLog2e above)
namespace attn {

// ATTN_DECODE_MMA (on by default where the body builds): 16-bit queries over a cache of their
// own type or an fp8 one take the matrix-unit body; fp32 queries, and CoreX, the CUDA-core one.
#if !defined(ATTN_DECODE_MMA)
#if defined(ATTN_DECODE_HAVE_MMA)
#define ATTN_DECODE_MMA 1
#else
#define ATTN_DECODE_MMA 0
#endif
#endif
#if ATTN_DECODE_MMA && !defined(ATTN_DECODE_HAVE_MMA)
#error "ATTN_DECODE_MMA needs NVIDIA's mma.sync (decode_warp.cuh)"
#endif

// The CUDA-core body with its shared memory.
template <int QKIND, int CKIND, int HEAD_MAX, int GROUP>
ATTN_DEVICE void cuda_core_partition(const AttnDecodeArgs& a) {
  __shared__ PartitionSmem<GROUP, HEAD_MAX> s;
  if constexpr (elem_bytes(CKIND) == 1) {
    if (a.block_size < 16) {
      partition_body<QKIND, CKIND, HEAD_MAX, GROUP, 8>(a, s);
      return;
    }
  }
  partition_body<QKIND, CKIND, HEAD_MAX, GROUP, 16>(a, s);
}

// Whether a (query, cache) pair takes the matrix-unit body (attn_core/native/facts.py mirrors
// it): 16-bit queries over a cache of their own type or an fp8 one.
template <int QKIND, int CKIND>
__host__ __device__ constexpr bool mma_body() {
  return ATTN_DECODE_MMA && (QKIND == kFloat16 || QKIND == kBFloat16) &&
         (CKIND == QKIND || elem_bytes(CKIND) == 1);
}

// A partition block's threads: the matrix-unit body's warp streams, else kThreads. Python
// mirrors it (attn_core.native.facts.partition_threads).
template <int QKIND, int CKIND, int HEAD_MAX>
__host__ __device__ constexpr int partition_threads() {
#if ATTN_DECODE_MMA
  if constexpr (mma_body<QKIND, CKIND>()) return decode_warp::warps_for<HEAD_MAX>() * 32;
#endif
  return kThreads;
}

// Internal linkage from here on: several of these libraries share a process (one per GQA group,
// tuning variants beside them), and vague-linkage symbols (template instances and their
// function-local statics, which GCC makes STB_GNU_UNIQUE) would be unified across them even
// under RTLD_LOCAL: two variants loaded together shared a kernel-setup function's static flag,
// and the second's kernel launched without its opt-in (an invalid-argument error on the H200).
namespace {

// ATTN_DECODE_SMEM_SPILL (on by default): nvcc 13+ may spill the CUDA-core body's kernels of
// 2 or more head slots to shared memory, not local (CUDA 13's "enable_smem_spilling", a PTX
// pragma of the kernel). At slots 2-4 it removed every spill store ptxas reported (26 of 363,
// 4-20 B of block-uniform values read once a block) and, by lowering the register
// targets, raised occupancy: 16/4 fp32 queries 9-12 % faster at their own split, no fp32 row
// slower beyond noise (docs/benchmarks.md#cuda-core-body). Slots 5-8 never spilled; there it
// lowers the register targets alone (group 6 fp32 at head 256: 112 -> 96). ptxas reserves
// shared memory for the spill area, which kernel_facts.json's nvcc records carry; CoreX and
// clang never see the pragma, and the facts' CoreX stand-in is built with it off
// (facts.COREX_DEFINES).
#if !defined(ATTN_DECODE_SMEM_SPILL)
#define ATTN_DECODE_SMEM_SPILL 1
#endif

template <int GROUP>
ATTN_DEVICE void allow_smem_spilling() {
#if ATTN_DECODE_SMEM_SPILL && defined(__CUDA_ARCH__) && defined(__CUDACC_VER_MAJOR__) && \
    !defined(__ILUVATAR__) && !defined(__clang__)
#if __CUDACC_VER_MAJOR__ >= 13
  if constexpr (GROUP >= 2) asm volatile(".pragma \"enable_smem_spilling\";");
#endif
#endif
}

template <int QKIND, int CKIND, int HEAD_MAX, int GROUP>
__global__ void ATTN_PARTITION_BOUNDS((partition_threads<QKIND, CKIND, HEAD_MAX>()))
    partition_kernel(const AttnDecodeArgs a) {
  release_merge();
#if ATTN_DECODE_MMA
  if constexpr (mma_body<QKIND, CKIND>()) {
    __shared__ decode_warp::Smem<HEAD_MAX> s;
    if (a.block_size == decode_warp::kTok && a.head_size == HEAD_MAX) {
      decode_warp::partition_body<QKIND, CKIND, HEAD_MAX, GROUP, decode_warp::kTok>(a, s);
    } else {
      decode_warp::partition_body<QKIND, CKIND, HEAD_MAX, GROUP, 0>(a, s);
    }
  } else {
    allow_smem_spilling<GROUP>();
    cuda_core_partition<QKIND, CKIND, HEAD_MAX, GROUP>(a);
  }
#else
  allow_smem_spilling<GROUP>();
  cuda_core_partition<QKIND, CKIND, HEAD_MAX, GROUP>(a);
#endif
}

// Merge the partitions of one (query head, sequence) for merge_dims() of its dimensions
// (blockIdx.z picks which): weights 2^(lse - max), fp32. No pass over the log-sum-exps comes
// first: each thread rescales its own sums whenever its maximum moves, so the partials' loads
// start at once, and the streams' maxima meet in the final combine.
template <int QKIND>
__global__ void __launch_bounds__(kMergeThreads) merge_kernel(const AttnDecodeArgs a) {
  constexpr int kMaxStreams = kMergeThreads / kMergeNarrowDims;
  __shared__ float stream_max[kMaxStreams], stream_weight[kMaxStreams];
  __shared__ float stream_sum[kMergeThreads];  // [stream][dim of the slice]
  const int tid = threadIdx.x;
  const int head = blockIdx.x, seq = blockIdx.y;
  const int dims = merge_dims(a.num_partitions);
  const int streams = kMergeThreads / dims;
  const int stream = tid / dims, lane_dim = tid % dims;
  const int d = blockIdx.z * dims + lane_dim;
  const int D = a.head_size;
  wait_for_partitions();  // before any read: the partials are the partition kernel's
  const int seq_len = min(a.seq_lens[seq], a.table_width * a.block_size);
  const int n = seq_len <= 0 ? 0
                             : min(a.num_partitions,
                                   (seq_len + a.partition_size - 1) / a.partition_size);
  const int64_t row0 = (static_cast<int64_t>(seq) * a.num_heads + head) * a.num_partitions;
  const bool in_head = d < D;
  const float* lse = a.part_lse + row0;
  const float* o = a.part_out + row0 * D + d;

  float m = -INFINITY, weight = 0.0f, sum = 0.0f;
  for (int i0 = stream; i0 < n; i0 += kMergeLoads * streams) {
    float l[kMergeLoads], part[kMergeLoads];
#pragma unroll
    for (int u = 0; u < kMergeLoads; ++u) {
      const int i = i0 + u * streams;
      l[u] = i < n ? lse[i] : -INFINITY;
      part[u] = i < n && in_head ? o[static_cast<int64_t>(i) * D] : 0.0f;
    }
    float m_new = m;
#pragma unroll
    for (int u = 0; u < kMergeLoads; ++u) m_new = fmaxf(m_new, l[u]);
    const float alpha = exp2f(m - m_new);  // m_new is finite: partition i0 is real
    weight *= alpha;
    sum *= alpha;
#pragma unroll
    for (int u = 0; u < kMergeLoads; ++u) {
      const float w = exp2f(l[u] - m_new);  // 0 past the last partition
      weight += w;
      sum = fmaf(w, part[u], sum);
    }
    m = m_new;
  }
  if (lane_dim == 0) {
    stream_max[stream] = m;
    stream_weight[stream] = weight;
  }
  stream_sum[tid] = sum;
  __syncthreads();
  if (stream == 0 && in_head) {
    float top = -INFINITY;
    for (int k = 0; k < streams; ++k) top = fmaxf(top, stream_max[k]);
    float total = 0.0f, weights = 0.0f;
    if (n > 0) {  // top is finite; a stream without partitions has -inf and weighs 0
      for (int k = 0; k < streams; ++k) {
        const float scale = exp2f(stream_max[k] - top);
        total = fmaf(stream_sum[k * dims + lane_dim], scale, total);
        weights = fmaf(stream_weight[k], scale, weights);
      }
    }
    store_elem<QKIND>(a.out, seq * a.out_seq_stride + head * a.out_head_stride + d,
                      n > 0 ? total / weights : 0.0f);
  }
}

// ------------------------------------------------------------------------------ dispatch
using KernelPtr = void (*)(const AttnDecodeArgs);
struct PartitionLaunch {  // a partition kernel and its block size (nullptr: none built)
  KernelPtr kernel;
  int threads;
};

#ifndef ATTN_GROUP_SLOTS
#error "build one library per head-slot count: -DATTN_GROUP_SLOTS=1..8 (attn_core/native/build.py)"
#endif
static_assert(ATTN_GROUP_SLOTS >= 1 && ATTN_GROUP_SLOTS <= kGroupMax, "1 <= slots <= 8");

}  // namespace

// GQA group -> head slots per block: the group itself up to 8, else the group spread evenly over
// ceil(group / 8) blocks (12 -> 2 x 6, 9 -> 5 + 4). Python mirrors it (abi.group_slots).
int group_slots(int group) {
  const int blocks = (group + kGroupMax - 1) / kGroupMax;
  return (group + blocks - 1) / blocks;
}

namespace {

template <int QKIND, int CKIND, int HEAD_MAX, int GROUP>
PartitionLaunch launch_of() {
  return {partition_kernel<QKIND, CKIND, HEAD_MAX, GROUP>,
          partition_threads<QKIND, CKIND, HEAD_MAX>()};
}

template <int QKIND, int HEAD_MAX, int GROUP>
PartitionLaunch pick_cache(int cache_kind) {
  if (cache_kind == QKIND) return launch_of<QKIND, QKIND, HEAD_MAX, GROUP>();
  if (cache_kind == kFp8E4M3) return launch_of<QKIND, kFp8E4M3, HEAD_MAX, GROUP>();
  if (cache_kind == kFp8E5M2) return launch_of<QKIND, kFp8E5M2, HEAD_MAX, GROUP>();
  return {nullptr, 0};
}

template <int HEAD_MAX, int GROUP>
PartitionLaunch pick_query(int query_kind, int cache_kind) {
  switch (query_kind) {
    case kFloat32: return pick_cache<kFloat32, HEAD_MAX, GROUP>(cache_kind);
    case kFloat16: return pick_cache<kFloat16, HEAD_MAX, GROUP>(cache_kind);
    case kBFloat16: return pick_cache<kBFloat16, HEAD_MAX, GROUP>(cache_kind);
    default: return {nullptr, 0};
  }
}

PartitionLaunch partition_for(int query_kind, int cache_kind, int head_bucket, int slots) {
  if (slots != ATTN_GROUP_SLOTS) return {nullptr, 0};  // another library serves this group
  constexpr int G = ATTN_GROUP_SLOTS;
#ifdef ATTN_TUNING_ONLY  // bench/native_tune.py: fp16 queries, head bucket 256, every cache kind
  if (query_kind != kFloat16 || head_bucket != 256) return {nullptr, 0};
  return pick_query<256, G>(query_kind, cache_kind);
#else
  switch (head_bucket) {
    case 64: return pick_query<64, G>(query_kind, cache_kind);
    case 128: return pick_query<128, G>(query_kind, cache_kind);
    case 256: return pick_query<256, G>(query_kind, cache_kind);
    default: return {nullptr, 0};
  }
#endif
}

// How the merge launches on this device (see release_merge). Measured on the H200
// (bench/native_ab.py, docs/benchmarks.md#decode-kernel-choices), 14 rows, against the plain
// launch:
// - released early with nothing else: +0.6 to +2.8 us on every batch-1 row but one: the merge's
//   small blocks (16 fit an SM) crowded onto the first SMs its partition blocks left, 96 blocks
//   of 6 / 1 heads on a handful of SMs, each then waiting on L2 in series;
// - released at the partition blocks' exit (no release_merge): -0.3 to +0.4 us, nothing;
// - released early with dynamic shared memory that lets two merge blocks share an SM:
//   -0.65 to -0.90 us on every batch-1 row (6 / 1 1 x 100K 0.0373 -> 0.0365 ms), one a SM the
//   same at 6 / 1 and worse at 24 / 4 (192 blocks, two rounds); but +1.4 to +3.8 us at batch 8,
//   where 768-1536 merge blocks then take several rounds of two a SM.
// So: two a SM, for a merge grid of at most two blocks per SM; the plain launch above that.
#if ATTN_MERGE_OVERLAP && !defined(__ILUVATAR__) && CUDART_VERSION >= 11080
#define ATTN_HOST_GRID_DEPENDENCY 1
constexpr int kMaxDevices = 64;
constexpr int kMergeBlocksPerSm = 2;
struct MergeOverlap {
  int max_blocks;  // the largest merge grid launched as a dependent (0: never)
  int smem_bytes;  // dynamic shared memory that keeps kMergeBlocksPerSm blocks on an SM
};
// Read from the driver once per device and merge kernel, then cached (no driver query in a
// steady-state call): a GPU of compute capability 9.0 or later, a merge compiled for one (a
// merge JIT-compiled from older PTX has no griddepcontrol.wait and must wait in the stream),
// and the shared memory opt-in that placement needs.
MergeOverlap merge_overlap(KernelPtr merge, int query_kind) {
  static std::atomic<int> known[kMaxDevices][3][2];  // {max_blocks + 1, smem_bytes}; 0 unknown
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices ||
      query_kind < 0 || query_kind > 2) {
    return {0, 0};
  }
  std::atomic<int>* slot = known[device][query_kind];
  const int cached = slot[0].load(std::memory_order_acquire);
  if (cached != 0) return {cached - 1, slot[1].load(std::memory_order_relaxed)};
  int major = 0, sms = 0, per_sm = 0, reserved = 0, optin = 0;
  cudaFuncAttributes attr;
  bool ok =
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) ==
          cudaSuccess &&
      cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device) ==
          cudaSuccess &&
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) ==
          cudaSuccess &&
      cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(merge)) == cudaSuccess &&
      major >= 9 && attr.ptxVersion >= 90;
  // the most a block may take for kMergeBlocksPerSm of them to fit, and not one more
  const int smem = ok ? per_sm / kMergeBlocksPerSm - reserved - static_cast<int>(attr.sharedSizeBytes)
                      : 0;
  ok = ok && smem > 0 && smem <= optin &&
       (kMergeBlocksPerSm + 1) * (smem + reserved + static_cast<int>(attr.sharedSizeBytes)) >
           per_sm &&
       cudaFuncSetAttribute(reinterpret_cast<const void*>(merge),
                            cudaFuncAttributeMaxDynamicSharedMemorySize, smem) == cudaSuccess;
  const MergeOverlap overlap = ok ? MergeOverlap{kMergeBlocksPerSm * sms, smem} : MergeOverlap{0, 0};
  slot[1].store(overlap.smem_bytes, std::memory_order_relaxed);
  slot[0].store(overlap.max_blocks + 1, std::memory_order_release);
  return overlap;
}
#else
#define ATTN_HOST_GRID_DEPENDENCY 0
#endif

// The merge after the partition kernel on stream s: a programmatic dependent where the device
// allows it and the grid is small enough (merge_overlap), else an ordinary launch.
cudaError_t launch_merge(KernelPtr merge, const AttnDecodeArgs& a, dim3 grid, cudaStream_t s) {
#if ATTN_HOST_GRID_DEPENDENCY
  const MergeOverlap overlap = merge_overlap(merge, a.query_kind);
  if (static_cast<int64_t>(grid.x) * grid.y * grid.z <= overlap.max_blocks) {
    cudaLaunchAttribute dependent[1];
    dependent[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    dependent[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = dim3(kMergeThreads);
    config.dynamicSmemBytes = static_cast<size_t>(overlap.smem_bytes);
    config.stream = s;
    config.attrs = dependent;
    config.numAttrs = 1;
    return cudaLaunchKernelEx(&config, merge, a);
  }
#endif
  merge<<<grid, kMergeThreads, 0, s>>>(a);
  return cudaGetLastError();
}

KernelPtr merge_for(int query_kind) {
  switch (query_kind) {
    case kFloat32: return merge_kernel<kFloat32>;
    case kFloat16: return merge_kernel<kFloat16>;
    case kBFloat16: return merge_kernel<kBFloat16>;
    default: return nullptr;
  }
}

}  // namespace

}  // namespace attn

extern "C" {

ATTN_COMMON_EXPORTS(attn_native, ATTN_NATIVE_ABI_VERSION)

int attn_native_group_slots(void) { return ATTN_GROUP_SLOTS; }

int attn_native_decode(const AttnDecodeArgs* args, void* stream) {
  using namespace attn;
  const AttnDecodeArgs& a = *args;
  const int group = a.num_kv_heads > 0 ? a.num_heads / a.num_kv_heads : 0;
  const bool block_size_ok = a.block_size >= kMinBlockSize && a.block_size <= kTile &&
                             (a.block_size & (a.block_size - 1)) == 0;
  if (a.num_seqs < 1 || group < 1 || a.num_heads % a.num_kv_heads != 0 || a.head_size < 1 ||
      a.head_size > 256 || a.head_size % (16 / elem_bytes(a.cache_kind)) != 0 ||
      !block_size_ok || a.num_partitions < 1 || a.partition_size < a.block_size ||
      a.partition_size % a.block_size != 0 ||
      (a.num_partitions > 1 && (a.part_out == nullptr || a.part_lse == nullptr))) {
    return cudaErrorInvalidValue;
  }
  const int slots = group_slots(group);
  const PartitionLaunch partition =
      partition_for(a.query_kind, a.cache_kind, head_bucket(a.head_size), slots);
  const KernelPtr merge = merge_for(a.query_kind);
  if (partition.kernel == nullptr || merge == nullptr) return cudaErrorInvalidValue;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int head_groups = (group + slots - 1) / slots;
  const dim3 grid(a.num_kv_heads * head_groups, a.num_partitions, a.num_seqs);
  partition.kernel<<<grid, partition.threads, 0, s>>>(a);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || a.num_partitions == 1) return err;
  const int dims = merge_dims(a.num_partitions);
  const int slices = (a.head_size + dims - 1) / dims;
  return launch_merge(merge, a, dim3(a.num_heads, a.num_seqs, slices), s);
}

int attn_native_kernel_info(int which, int query_kind, int cache_kind, int head_bucket,
                            int group, AttnKernelInfo* info) {
  using namespace attn;
  const PartitionLaunch launch =
      which == 0 ? partition_for(query_kind, cache_kind, head_bucket, group_slots(group))
                 : PartitionLaunch{merge_for(query_kind), kMergeThreads};
  return read_kernel_info(reinterpret_cast<const void*>(launch.kernel), launch.threads, info);
}

}  // extern "C"
