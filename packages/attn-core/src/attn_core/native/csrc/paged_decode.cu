// Paged decode attention reading vLLM 0.6.3's cache in place: GQA-gridded split-KV.
//
// Grid of the partition kernel: (num_kv_heads x head_groups, num_partitions, num_seqs); one
// block of 128 threads reads its partition's K and V pages once for GROUP query heads of one
// KV head. GROUP (1-8) is fixed at compile time, one library per value (ATTN_GROUP_SLOTS):
// every loop over heads is then straight-line code whose FMA chains interleave. With a runtime
// `if (g >= G) break` each head was its own basic block, an 8-deep dependent FMA chain, and the
// H200 issued one instruction per 6.4 cycles per warp (ncu, 1 x 100K): 0.191 ms. Padding the
// group to 8 slots removed the branches but cost a third more FMAs for Qwen's 6 (0.211 ms);
// the exact count gave 0.177 ms (bench/native_tune.py, H200, 2026-12-01). Groups above 8 span
// several blocks of ceil(group / blocks) heads; a last block with fewer real heads computes
// zero-query rows it never writes.
// Per tile of kTile tokens:
//   1. scores: one token per thread, its 16-byte key vectors against the group's queries
//      (fp32, prescaled by scale * log2(e), broadcast from shared memory);
//   2. tile max per head through shared memory, online-softmax rescale (base 2);
//   3. P.V: each thread owns head dimensions and walks the tile's value vectors (16 bytes =
//      8 fp16 tokens of one dimension, contiguous in the value layout).
// Every partial is fp32. With one partition the block normalises and writes the output; with
// several it writes the partition's normalised output and base-2 log-sum-exp, and a second
// kernel merges the valid partitions of each (sequence, query head).
//
// No host sync and no allocation: lengths are read on the device, so a CUDA graph captured at
// one max_seq_len stays exact for any seq_lens up to it. Tokens past a sequence's end are never
// loaded from pages it does not own and are masked inside its last page (value slots there may
// hold inf/NaN).

#include "attn_convert.cuh"
#include "attn_decode_abi.h"
#include "attn_platform.cuh"

namespace attn {

// Tuning knobs, fixed at compile time (bench/native_tune.py builds variants with -D). The
// defaults are the measured best on the H200 (docs/benchmarks.md, native decode tuning).
#ifndef ATTN_THREADS
#define ATTN_THREADS 128
#endif
#ifndef ATTN_KEY_LOADS
#define ATTN_KEY_LOADS 8  // 16-byte key loads in flight per thread in the score phase
#endif
#ifndef ATTN_VALUE_LOADS
#define ATTN_VALUE_LOADS 4  // 16-byte value loads in flight per thread in the P.V phase
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
constexpr int kMaxPagesPerTile = kTile / kMinBlockSize;
constexpr float kLog2e = 1.4426950408889634f;
constexpr int kMergeChunk = kThreads;  // partitions weighed per merge round
static_assert(kThreads % kGroupMax == 0 && kTile % (kThreads / kGroupMax) == 0, "reducers");

template <int GROUP, int HEAD_MAX>
struct alignas(16) PartitionSmem {
  float q[GROUP][HEAD_MAX];  // scaled queries (zero rows past the group); then a fold buffer
  float p[GROUP][kTile];     // scores, then probabilities, then per-thread sums
  float red[GROUP][kReducersPerHead];
  int pages[2][kMaxPagesPerTile];  // double-buffered by tile parity
};

// Loads and accumulates one tile's P.V for this thread's dimensions. VEC is the load width:
// 16 bytes, or 8 for fp8 caches with 8-token blocks (a 16-byte vector would span two pages).
template <int GROUP, int CKIND, int VEC_BYTES, int DIMS, int TOKEN_GROUPS>
ATTN_DEVICE void tile_pv(const uint8_t* v_head, int64_t v_block_bytes, const int* pages,
                         int bs_shift, int bs_mask, int dim0, int dim_step, int head_size,
                         int token_group, int tile_len, const float (&p)[GROUP][kTile],
                         float (&acc)[GROUP][DIMS]) {
  constexpr int kBytes = elem_bytes(CKIND);
  constexpr int kTokens = VEC_BYTES / kBytes;
  constexpr int kWords = VEC_BYTES / 4;
  constexpr int kUnroll = ATTN_VALUE_LOADS / DIMS > 0 ? ATTN_VALUE_LOADS / DIMS : 1;
  const int block_size = bs_mask + 1;
  for (int j0 = token_group * kTokens; j0 < tile_len; j0 += kTokens * TOKEN_GROUPS * kUnroll) {
    uint32_t raw[kUnroll][DIMS][kWords];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = j0 + u * kTokens * TOKEN_GROUPS;
      const int64_t page = j < tile_len ? pages[j >> bs_shift] : 0;
#pragma unroll
      for (int k = 0; k < DIMS; ++k) {
        const int d = dim0 + k * dim_step;
        if (j < tile_len && d < head_size) {
          const uint8_t* src = v_head + page * v_block_bytes +
                               (static_cast<int64_t>(d) * block_size + (j & bs_mask)) * kBytes;
          if (VEC_BYTES == 16) {
            const Vec16 v = load_vec<Vec16>(src);
#pragma unroll
            for (int w = 0; w < kWords; ++w) raw[u][k][w] = v.w[w];
          } else {
            const Vec8 v = load_vec<Vec8>(src);
#pragma unroll
            for (int w = 0; w < kWords; ++w) raw[u][k][w] = v.w[w];
          }
        } else {
#pragma unroll
          for (int w = 0; w < kWords; ++w) raw[u][k][w] = 0u;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = j0 + u * kTokens * TOKEN_GROUPS;
      if (j >= tile_len) break;
      float v[DIMS][kTokens];
#pragma unroll
      for (int k = 0; k < DIMS; ++k) {
        unpack<CKIND, kWords>(raw[u][k], v[k]);
        // slots past the sequence's end inside its last page: never multiply inf/NaN by 0
#pragma unroll
        for (int i = 0; i < kTokens; ++i) {
          if (j + i >= tile_len) v[k][i] = 0.0f;
        }
      }
      // straight-line code over every head slot: the GROUP x DIMS FMA chains interleave
#pragma unroll
      for (int g = 0; g < GROUP; ++g) {
        float probs[kTokens];
#pragma unroll
        for (int i = 0; i < kTokens; ++i) probs[i] = p[g][j + i];
#pragma unroll
        for (int k = 0; k < DIMS; ++k) {
#pragma unroll
          for (int i = 0; i < kTokens; ++i) acc[g][k] = fmaf(probs[i], v[k][i], acc[g][k]);
        }
      }
    }
  }
}

#if ATTN_MIN_BLOCKS > 0
#define ATTN_PARTITION_BOUNDS __launch_bounds__(kThreads, ATTN_MIN_BLOCKS)
#else
#define ATTN_PARTITION_BOUNDS __launch_bounds__(kThreads)
#endif

template <int QKIND, int CKIND, int HEAD_MAX, int GROUP>
__global__ void ATTN_PARTITION_BOUNDS partition_kernel(const AttnDecodeArgs a) {
  constexpr int kBytes = elem_bytes(CKIND);
  constexpr int kX = 16 / kBytes;  // elements per 16-byte key vector (the layout's x)
  constexpr int kDims = HEAD_MAX > kThreads ? HEAD_MAX / kThreads : 1;
  constexpr int kTokenGroups = HEAD_MAX < kThreads ? kThreads / HEAD_MAX : 1;
  constexpr int kDimThreads = kThreads / kTokenGroups;
  constexpr int kKeyUnroll = ATTN_KEY_LOADS;
  constexpr float kRescale = CKIND == kFp8E4M3 ? kE4M3Rescale : 1.0f;
  __shared__ PartitionSmem<GROUP, HEAD_MAX> s;

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
  for (int i = tid; i < GROUP * D; i += kThreads) {
    const int g = i / D, d = i % D;
    s.q[g][d] = g < G ? load_elem<QKIND>(a.query, seq * a.q_seq_stride +
                                                      (head0 + g) * a.q_head_stride + d) *
                            qscale
                      : 0.0f;
  }

  int bs_shift = 0;
  while ((1 << bs_shift) < a.block_size) ++bs_shift;
  const int bs_mask = a.block_size - 1;
  const int32_t* table = a.block_tables + seq * a.table_stride;
  const uint8_t* k_head = static_cast<const uint8_t*>(a.key_cache) + kv_head * a.k_head_stride * kBytes;
  const uint8_t* v_head =
      static_cast<const uint8_t*>(a.value_cache) + kv_head * a.v_head_stride * kBytes;
  const int64_t k_block_bytes = a.k_block_stride * kBytes;
  const int64_t v_block_bytes = a.v_block_stride * kBytes;
  const int n_vec = D / kX;  // key vectors per token

  float m_run[GROUP], l_run[GROUP], acc[GROUP][kDims];
#pragma unroll
  for (int g = 0; g < GROUP; ++g) {
    m_run[g] = -INFINITY;
    l_run[g] = 0.0f;
#pragma unroll
    for (int k = 0; k < kDims; ++k) acc[g][k] = 0.0f;
  }
  const int token_group = tid / kDimThreads;
  const int dim0 = tid % kDimThreads;

  for (int t0 = start, tile = 0; t0 < end; t0 += kTile, ++tile) {
    const int tile_len = min(kTile, end - t0);
    int* pages = s.pages[tile & 1];
    if (tid < ((tile_len + bs_mask) >> bs_shift)) pages[tid] = table[(t0 >> bs_shift) + tid];
    __syncthreads();  // pages (and, on the first tile, the queries) visible; last P.V done

    // 1. one token's scores per thread
    float score[GROUP];
#pragma unroll
    for (int g = 0; g < GROUP; ++g) score[g] = 0.0f;
    const bool valid = tid < tile_len;
    if (valid) {
      const int64_t page = pages[tid >> bs_shift];
      const uint8_t* k_tok =
          k_head + page * k_block_bytes + static_cast<int64_t>(tid & bs_mask) * 16;
      const int64_t vec_stride = static_cast<int64_t>(a.block_size) * 16;
      for (int c0 = 0; c0 < n_vec; c0 += kKeyUnroll) {
        uint32_t raw[kKeyUnroll][4];
#pragma unroll
        for (int u = 0; u < kKeyUnroll; ++u) {
          if (c0 + u < n_vec) {
            const Vec16 v = load_vec<Vec16>(k_tok + (c0 + u) * vec_stride);
#pragma unroll
            for (int w = 0; w < 4; ++w) raw[u][w] = v.w[w];
          }
        }
#pragma unroll
        for (int u = 0; u < kKeyUnroll; ++u) {
          if (c0 + u >= n_vec) break;
          float k[kX];
          unpack<CKIND, 4>(raw[u], k);
          const int d0 = (c0 + u) * kX;
          // straight-line code over every head slot: the GROUP FMA chains interleave
#pragma unroll
          for (int g = 0; g < GROUP; ++g) {
#pragma unroll
            for (int i = 0; i < kX; ++i) score[g] = fmaf(s.q[g][d0 + i], k[i], score[g]);
          }
        }
      }
      if (a.alibi_slopes != nullptr) {  // vLLM's bias: slope * (position - seq_len + 1)
        const float rel = static_cast<float>(t0 + tid - seq_len + 1) * kLog2e;
#pragma unroll
        for (int g = 0; g < GROUP; ++g) {
          if (g < G) score[g] = fmaf(a.alibi_slopes[head0 + g], rel, score[g]);
        }
      }
    }
#pragma unroll
    for (int g = 0; g < GROUP; ++g) s.p[g][tid] = valid ? score[g] : -INFINITY;
    __syncthreads();

    // 2. the tile's max per head: 16 threads per head, 8 scores each
    {
      const int g = tid / kReducersPerHead, r = tid % kReducersPerHead;
      if (g < GROUP) {
        float m = -INFINITY;
#pragma unroll
        for (int i = 0; i < kTokensPerReducer; ++i) m = fmaxf(m, s.p[g][r * kTokensPerReducer + i]);
        s.red[g][r] = m;
      }
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < GROUP; ++g) {
      float m_tile = -INFINITY;
#pragma unroll
      for (int r = 0; r < kReducersPerHead; ++r) m_tile = fmaxf(m_tile, s.red[g][r]);
      const float m_new = fmaxf(m_run[g], m_tile);  // finite: the tile holds a real token
      const float alpha = exp2f(m_run[g] - m_new);
      const float prob = valid ? exp2f(score[g] - m_new) : 0.0f;
      s.p[g][tid] = prob;
      l_run[g] = l_run[g] * alpha + prob;
#pragma unroll
      for (int k = 0; k < kDims; ++k) acc[g][k] *= alpha;
      m_run[g] = m_new;
    }
    __syncthreads();

    // 3. P.V over this thread's dimensions
    if (kBytes == 1 && a.block_size * kBytes < 16) {
      tile_pv<GROUP, CKIND, 8, kDims, kTokenGroups>(v_head, v_block_bytes, pages, bs_shift,
                                                    bs_mask, dim0, kDimThreads, D, token_group,
                                                    tile_len, s.p, acc);
    } else {
      tile_pv<GROUP, CKIND, 16, kDims, kTokenGroups>(v_head, v_block_bytes, pages, bs_shift,
                                                     bs_mask, dim0, kDimThreads, D, token_group,
                                                     tile_len, s.p, acc);
    }
  }

  // Sums: every thread holds its own tokens' share, rescaled as the max moved.
  __syncthreads();  // last P.V read s.p
#pragma unroll
  for (int g = 0; g < GROUP; ++g) s.p[g][tid] = l_run[g];
  __syncthreads();
  {
    const int g = tid / kReducersPerHead, r = tid % kReducersPerHead;
    if (g < GROUP) {
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < kTokensPerReducer; ++i) sum += s.p[g][r * kTokensPerReducer + i];
      s.red[g][r] = sum;
    }
  }
  __syncthreads();
  // Fold token groups 1.. into group 0 through the (no longer needed) query buffer, one group
  // at a time: with kTokenGroups > 1 each thread owns one dimension (kDims == 1).
  for (int from = 1; from < kTokenGroups; ++from) {
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
    if (g >= G) break;  // zero-query slots: computed alongside, never written
    float l = 0.0f;
#pragma unroll
    for (int r = 0; r < kReducersPerHead; ++r) l += s.red[g][r];
    const float inv = a.v_scale * kRescale / l;  // l >= 1: the max token gives 2^0
    const int head = head0 + g;
#pragma unroll
    for (int k = 0; k < kDims; ++k) {
      const int d = dim0 + k * kDimThreads;
      if (d >= D) continue;
      if (single) {
        store_elem<QKIND>(a.out, seq * a.out_seq_stride + head * a.out_head_stride + d,
                          acc[g][k] * inv);
      } else {
        const int64_t row = (static_cast<int64_t>(seq) * a.num_heads + head) * a.num_partitions + part;
        a.part_out[row * D + d] = acc[g][k] * inv;
      }
    }
    if (!single && tid == 0) {
      const int64_t row = (static_cast<int64_t>(seq) * a.num_heads + head) * a.num_partitions + part;
      a.part_lse[row] = m_run[g] + log2f(l);
    }
  }
}

// Merge the partitions of one (query head, sequence): weights 2^(lse - max), fp32.
template <int QKIND>
__global__ void __launch_bounds__(kThreads) merge_kernel(const AttnDecodeArgs a) {
  __shared__ float w[kMergeChunk];
  __shared__ float red[kThreads];
  const int tid = threadIdx.x;
  const int head = blockIdx.x, seq = blockIdx.y;
  const int D = a.head_size;
  const int seq_len = min(a.seq_lens[seq], a.table_width * a.block_size);
  const int n = seq_len <= 0 ? 0 : min(a.num_partitions, (seq_len + a.partition_size - 1) / a.partition_size);
  const int64_t row0 = (static_cast<int64_t>(seq) * a.num_heads + head) * a.num_partitions;
  const int64_t out0 = seq * a.out_seq_stride + head * a.out_head_stride;

  float m = -INFINITY;
  for (int i = tid; i < n; i += kThreads) m = fmaxf(m, a.part_lse[row0 + i]);
  red[tid] = m;
  __syncthreads();
  for (int width = kThreads / 2; width > 0; width /= 2) {
    if (tid < width) red[tid] = fmaxf(red[tid], red[tid + width]);
    __syncthreads();
  }
  m = red[0];

  constexpr int kDims = (256 + kThreads - 1) / kThreads;  // head_size <= 256
  float acc[kDims] = {}, total = 0.0f;
  for (int c0 = 0; c0 < n; c0 += kMergeChunk) {
    __syncthreads();  // the previous chunk's weights are consumed
    const int c = c0 + tid;
    w[tid] = c < n ? exp2f(a.part_lse[row0 + c] - m) : 0.0f;
    __syncthreads();
    const int len = min(kMergeChunk, n - c0);
    for (int i = 0; i < len; ++i) {
      const float wi = w[i];
      const float* o = a.part_out + (row0 + c0 + i) * D;
      total += wi;
#pragma unroll
      for (int k = 0; k < kDims; ++k) {
        if (tid + k * kThreads < D) acc[k] = fmaf(wi, o[tid + k * kThreads], acc[k]);
      }
    }
  }
  const float inv = n > 0 ? 1.0f / total : 0.0f;
#pragma unroll
  for (int k = 0; k < kDims; ++k) {
    if (tid + k * kThreads < D) store_elem<QKIND>(a.out, out0 + tid + k * kThreads, acc[k] * inv);
  }
}

// ------------------------------------------------------------------------------ dispatch
using KernelPtr = void (*)(const AttnDecodeArgs);

#ifndef ATTN_GROUP_SLOTS
#error "build one library per head-slot count: -DATTN_GROUP_SLOTS=1..8 (attn_core/native/build.py)"
#endif
static_assert(ATTN_GROUP_SLOTS >= 1 && ATTN_GROUP_SLOTS <= kGroupMax, "1 <= slots <= 8");

// GQA group -> head slots per block: the group itself up to 8, else the group spread evenly over
// ceil(group / 8) blocks (12 -> 2 x 6, 9 -> 5 + 4). Python mirrors it (abi.group_slots).
int group_slots(int group) {
  const int blocks = (group + kGroupMax - 1) / kGroupMax;
  return (group + blocks - 1) / blocks;
}

template <int QKIND, int HEAD_MAX, int GROUP>
KernelPtr pick_cache(int cache_kind) {
  if (cache_kind == QKIND) return partition_kernel<QKIND, QKIND, HEAD_MAX, GROUP>;
  if (cache_kind == kFp8E4M3) return partition_kernel<QKIND, kFp8E4M3, HEAD_MAX, GROUP>;
  if (cache_kind == kFp8E5M2) return partition_kernel<QKIND, kFp8E5M2, HEAD_MAX, GROUP>;
  return nullptr;
}

template <int HEAD_MAX, int GROUP>
KernelPtr pick_query(int query_kind, int cache_kind) {
  switch (query_kind) {
    case kFloat32: return pick_cache<kFloat32, HEAD_MAX, GROUP>(cache_kind);
    case kFloat16: return pick_cache<kFloat16, HEAD_MAX, GROUP>(cache_kind);
    case kBFloat16: return pick_cache<kBFloat16, HEAD_MAX, GROUP>(cache_kind);
    default: return nullptr;
  }
}

KernelPtr partition_for(int query_kind, int cache_kind, int head_bucket, int slots) {
  if (slots != ATTN_GROUP_SLOTS) return nullptr;  // another library serves this group
  constexpr int G = ATTN_GROUP_SLOTS;
#ifdef ATTN_TUNING_ONLY  // bench/native_tune.py: fp16 queries, head bucket 256, every cache kind
  return query_kind == kFloat16 && head_bucket == 256 ? pick_query<256, G>(query_kind, cache_kind)
                                                      : nullptr;
#else
  switch (head_bucket) {
    case 64: return pick_query<64, G>(query_kind, cache_kind);
    case 128: return pick_query<128, G>(query_kind, cache_kind);
    case 256: return pick_query<256, G>(query_kind, cache_kind);
    default: return nullptr;
  }
#endif
}

KernelPtr merge_for(int query_kind) {
  switch (query_kind) {
    case kFloat32: return merge_kernel<kFloat32>;
    case kFloat16: return merge_kernel<kFloat16>;
    case kBFloat16: return merge_kernel<kBFloat16>;
    default: return nullptr;
  }
}

int head_bucket(int head_size) { return head_size <= 64 ? 64 : head_size <= 128 ? 128 : 256; }

}  // namespace attn

extern "C" {

int attn_native_abi_version(void) { return ATTN_NATIVE_ABI_VERSION; }

int attn_native_group_slots(void) { return ATTN_GROUP_SLOTS; }

const char* attn_native_platform(void) { return ATTN_PLATFORM; }

const char* attn_native_error_string(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

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
  const KernelPtr partition =
      partition_for(a.query_kind, a.cache_kind, head_bucket(a.head_size), slots);
  const KernelPtr merge = merge_for(a.query_kind);
  if (partition == nullptr || merge == nullptr) return cudaErrorInvalidValue;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int head_groups = (group + slots - 1) / slots;
  const dim3 grid(a.num_kv_heads * head_groups, a.num_partitions, a.num_seqs);
  partition<<<grid, kThreads, 0, s>>>(a);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || a.num_partitions == 1) return err;
  merge<<<dim3(a.num_heads, a.num_seqs), kThreads, 0, s>>>(a);
  return cudaGetLastError();
}

int attn_native_kernel_info(int which, int query_kind, int cache_kind, int head_bucket,
                            int group, AttnKernelInfo* info) {
  using namespace attn;
  const KernelPtr kernel = which == 0 ? partition_for(query_kind, cache_kind, head_bucket,
                                                      group_slots(group))
                                      : merge_for(query_kind);
  if (kernel == nullptr || info == nullptr) return cudaErrorInvalidValue;
  cudaFuncAttributes attr;
  cudaError_t err = cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(kernel));
  if (err != cudaSuccess) return err;
  int blocks = 0;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, reinterpret_cast<const void*>(kernel),
                                                      kThreads, 0);
  if (err != cudaSuccess) return err;
  info->num_regs = attr.numRegs;
  info->static_smem_bytes = static_cast<int32_t>(attr.sharedSizeBytes);
  info->local_bytes = static_cast<int32_t>(attr.localSizeBytes);
  info->max_threads_per_block = attr.maxThreadsPerBlock;
  info->threads_per_block = kThreads;
  info->blocks_per_sm = blocks;
  info->binary_version = attr.binaryVersion;
  info->ptx_version = attr.ptxVersion;
  return cudaSuccess;
}

}  // extern "C"
