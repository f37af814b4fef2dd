// The C ABI of the native decode library, loaded from Python with ctypes.
//
// A plain C interface (no torch headers, no pybind) keeps one built library usable from any
// torch version (the vendor's 2.1 and current) and lets `pip install` build it with nothing but
// the CUDA/CoreX compiler. attn_core/native/abi.py mirrors these structs field by field; bump
// ATTN_NATIVE_ABI_VERSION whenever either changes.
#pragma once

#include <stdint.h>

#include "attn_kernel_info.h"

#define ATTN_NATIVE_ABI_VERSION 4

#ifdef __cplusplus
extern "C" {
#endif

// One decode step. Strides are in elements of the tensor's own dtype; the last dimension of
// every tensor is contiguous.
//   out, query    [num_seqs, num_heads, head_size]                       query_kind
//   key_cache     [num_blocks, num_kv_heads, head_size / x, block_size, x]  cache_kind
//   value_cache   [num_blocks, num_kv_heads, head_size, block_size]          cache_kind
//   block_tables  [num_seqs, table_width] int32;  seq_lens [num_seqs] int32
//   alibi_slopes  [num_heads] float32 or NULL
//   part_out      [num_seqs, num_heads, num_partitions, head_size] float32 (NULL if 1 partition)
//   part_lse      [num_seqs, num_heads, num_partitions] float32 (base-2 log-sum-exp)
typedef struct AttnDecodeArgs {
  void* out;
  const void* query;
  const void* key_cache;
  const void* value_cache;
  const int32_t* block_tables;
  const int32_t* seq_lens;
  const float* alibi_slopes;
  float* part_out;
  float* part_lse;
  int64_t out_seq_stride, out_head_stride;
  int64_t q_seq_stride, q_head_stride;
  int64_t k_block_stride, k_head_stride;
  int64_t v_block_stride, v_head_stride;
  int64_t table_stride;
  int32_t num_seqs, num_heads, num_kv_heads, head_size, block_size, table_width;
  int32_t num_partitions, partition_size;  // partition_size: a multiple of block_size
  int32_t query_kind, cache_kind;          // attn::ElemKind
  float scale;                             // softmax scale x k_scale (fp8 keys)
  float v_scale;                           // applied to the output (fp8 values)
} AttnDecodeArgs;

int attn_native_abi_version(void);
// The head slots this library's partition kernels serve (one library per value, 1..8).
int attn_native_group_slots(void);
const char* attn_native_platform(void);
// 0 on success, else the cudaError_t of the failed launch. `stream` is a cudaStream_t.
int attn_native_decode(const AttnDecodeArgs* args, void* stream);
// which: 0 the partition kernel, 1 the merge kernel; head_bucket 64, 128 or 256; group the
// GQA group (query heads per KV head), which picks the kernel's head slots.
int attn_native_kernel_info(int which, int query_kind, int cache_kind, int head_bucket,
                            int group, AttnKernelInfo* info);
// The message of a cudaError_t, for Python's errors.
const char* attn_native_error_string(int code);

#ifdef __cplusplus
}
#endif
