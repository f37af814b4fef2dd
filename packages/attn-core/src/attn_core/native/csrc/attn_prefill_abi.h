// The C ABI of the native chunked-prefill library, loaded from Python with ctypes
// (attn_core/native/prefill_abi.py mirrors it field by field; bump the version with either).
//
// One library per matrix-tile implementation (ATTN_PREFILL_MMA: 0 FMA, 1 wmma, 2 CoreX wmma),
// so a plan picks the implementation by loading its library and each is verified on its own.
#pragma once

#include <stdint.h>

#define ATTN_PREFILL_ABI_VERSION 2

#ifdef __cplusplus
extern "C" {
#endif

// One chunked-prefill call. Strides are in elements of the tensor's own dtype; the last
// dimension of every tensor is contiguous.
//   out, query     [num_tokens, num_heads, head_size]                        query_kind
//   key, value     [num_tokens, num_kv_heads, head_size]  (the chunk's own)  query_kind
//   key_cache      [num_blocks, num_kv_heads, head_size / x, block_size, x]  cache_kind
//   value_cache    [num_blocks, num_kv_heads, head_size, block_size]          cache_kind
//   block_tables   [num_seqs, table_width] int32
//   query_start_loc [num_seqs + 1] int32;  context_lens [num_seqs] int32
//   alibi_slopes   [num_heads] float32 or NULL
//   part_out       [num_tokens, num_heads, num_splits, head_size] float32 (NULL if 1 split)
//   part_lse       [num_tokens, num_heads, num_splits] float32 (base-2 log-sum-exp); the
//                  decode kernel's partials layout, with tokens for sequences
typedef struct AttnPrefillArgs {
  void* out;
  const void* query;
  const void* key;
  const void* value;
  const void* key_cache;
  const void* value_cache;
  const int32_t* block_tables;
  const int32_t* query_start_loc;
  const int32_t* context_lens;
  const float* alibi_slopes;
  float* part_out;
  float* part_lse;
  int64_t out_tok_stride, out_head_stride;
  int64_t q_tok_stride, q_head_stride;
  int64_t k_tok_stride, k_head_stride;
  int64_t v_tok_stride, v_head_stride;
  int64_t kc_block_stride, kc_head_stride;
  int64_t vc_block_stride, vc_head_stride;
  int64_t table_stride;
  int32_t num_seqs, num_tokens, num_heads, num_kv_heads, head_size, block_size, table_width;
  int32_t max_query_len;   // sizes the grid: ceil(max_query_len / tokens per tile) tiles
  int32_t num_splits;      // key-range partitions per query tile (merged by log-sum-exp)
  int32_t sliding_window;  // 0: none
  int32_t query_kind, cache_kind;  // attn::ElemKind
  int32_t config;          // tile configuration (attn_prefill_config)
  float scale;             // softmax scale
  float k_scale, v_scale;  // cache dequantisation (1 for 16-bit caches), applied in fp32
} AttnPrefillArgs;

// One tile configuration as compiled: what a plan and the simulator need.
typedef struct AttnPrefillConfig {
  int32_t rows;      // query rows per block (GQA-packed: tokens x group)
  int32_t keys;      // keys per tile
  int32_t threads;   // threads per block
  int32_t smem_bytes;  // dynamic shared memory at head bucket `head_bucket`
  int32_t num_regs;
  int32_t local_bytes;  // spills; 0 is expected
  int32_t blocks_per_sm;
  int32_t available;  // 0: this library has no kernel for the combination
} AttnPrefillConfig;

int attn_prefill_abi_version(void);
int attn_prefill_mma(void);  // the MmaKind this library was built with
const char* attn_prefill_platform(void);
// 0 on success, else a cudaError_t. `stream` is a cudaStream_t.
int attn_prefill(const AttnPrefillArgs* args, void* stream);
// config: 0 the large tile (opt-in shared memory above 48 KiB), 1 the 32 KiB tile (BI-V100's
// budget); head_bucket 64, 128 or 256.
int attn_prefill_config_info(int config, int query_kind, int cache_kind, int head_bucket,
                             AttnPrefillConfig* info);
const char* attn_prefill_error_string(int code);

#ifdef __cplusplus
}
#endif
