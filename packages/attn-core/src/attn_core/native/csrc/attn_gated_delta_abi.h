// The C ABI of the native Gated DeltaNet library (csrc/gated_delta.cu), loaded with ctypes.
//
// attn_core/native/gated_delta.py mirrors these structs field by field; bump
// ATTN_GDN_ABI_VERSION whenever either changes (the loader refuses a library of another
// version). Strides are in elements of the tensor's own dtype; element kinds are attn::ElemKind
// (fp32, fp16, bf16); index kinds are 0 for int32, 1 for int64.
#pragma once

#include <stdint.h>

#include "attn_kernel_info.h"

#define ATTN_GDN_ABI_VERSION 6

// The per-token tensors that a decode step and a prefill both begin with, in this order: one
// list keeps the two structs alike (gated_delta.py's TOKEN_TENSORS is its ctypes mirror).
#define ATTN_GDN_TOKEN_TENSORS \
  void* out;                   \
  const void* q;               \
  const void* k;               \
  const void* v;               \
  const void* g;               \
  const void* beta;

#ifdef __cplusplus
extern "C" {
#endif

// One recurrent decode step, the state pool updated in place.
//   q, k          [num_seqs, num_heads, head_k]           qkv_kind, last dim contiguous
//   v, out        [num_seqs, num_value_heads, head_v]     qkv_kind, last dim contiguous
//   g, beta       [num_seqs, num_value_heads]             g_kind / beta_kind
//   state_pool    [num_slots, num_value_heads, head_k, head_v] fp32, any positive strides
//                 (state_*_stride): key-major contiguous, a key-last pool's transposed view,
//                 slots padded apart as a serving cache's pages are; head_k * state_k_stride
//                 and head_v * state_v_stride below 2^31.
//   state_indices [num_seqs] (index_kind): the slot of each sequence; one outside
//                 [0, num_slots) leaves the pool untouched and writes zeros to its output.
// heads_per_block value heads of one key head share a block's key and query loads; it divides
// num_value_heads / num_heads.
typedef struct AttnGdnDecodeArgs {
  ATTN_GDN_TOKEN_TENSORS
  float* state_pool;
  const void* state_indices;
  int64_t q_seq_stride, q_head_stride;
  int64_t k_seq_stride, k_head_stride;
  int64_t v_seq_stride, v_head_stride;
  int64_t out_seq_stride, out_head_stride;
  int64_t g_seq_stride, g_head_stride;
  int64_t beta_seq_stride, beta_head_stride;
  int64_t num_slots;
  int64_t state_slot_stride, state_head_stride, state_k_stride, state_v_stride;
  int32_t num_seqs, num_heads, num_value_heads, head_k, head_v, heads_per_block;
  int32_t qkv_kind, g_kind, beta_kind, index_kind;
  int32_t l2norm;  // nonzero: q and k l2-normalised over head_k first (eps 1e-6 in the root)
  float scale;
} AttnGdnDecodeArgs;

// The gated delta rule token by token over whole sequences (fused_recurrent_gated_delta_rule),
// each state kept on chip from its sequence's first token to its last.
//   q, k          [tokens, num_heads, head_k]          qkv_kind, last dim contiguous
//   v, out        [tokens, num_value_heads, head_v]    qkv_kind, last dim contiguous
//   g, beta       [tokens, num_value_heads]            g_kind / beta_kind
//   cu_seqlens    [num_seqs + 1] (offset_kind): sequence i is tokens [cu[i], cu[i + 1])
//   initial_state [num_seqs, num_value_heads, head_k, head_v] fp32 contiguous, or NULL (zeros)
//   final_state   likewise, or NULL (not written); it may be initial_state (updated in place)
typedef struct AttnGdnPrefillArgs {
  ATTN_GDN_TOKEN_TENSORS
  const float* initial_state;
  float* final_state;
  const void* cu_seqlens;
  float* workspace;        // chunk-parallel only: the records of one segment's chunks
  const void* seq_order;   // chunk-parallel only: int32 [num_seqs], the segments' sequences
  int64_t q_tok_stride, q_head_stride;
  int64_t k_tok_stride, k_head_stride;
  int64_t v_tok_stride, v_head_stride;
  int64_t out_tok_stride, out_head_stride;
  int64_t g_tok_stride, g_head_stride;
  int64_t beta_tok_stride, beta_head_stride;
  int32_t num_seqs, num_heads, num_value_heads, head_k, head_v;
  int32_t qkv_kind, g_kind, beta_kind, offset_kind;
  int32_t l2norm;
  float scale;
} AttnGdnPrefillArgs;

// The depthwise causal convolution of width `width` (4 is compiled), out in x's kind.
// Update (decode), attn_gdn_conv_update:
//   x, out      [num_seqs, dim, tokens] (strides 0, 1, 2: sequence, channel, token)
//   conv_state  [num_slots, dim, >= width - 1]; slot indices[i] (i when NULL); positions
//               [0, width - 1) are read, then hold the last width - 1 inputs. A slot outside
//               [0, num_slots) is untouched and its outputs are zeros.
// Prefill (varlen), attn_gdn_conv_prefill:
//   x, out      [dim, tokens] (strides 0, 1: channel, token; stride 2 unused)
//   query_start_loc [num_seqs + 1] (offset_kind), from 0 to tokens, never decreasing
//   conv_state  NULL (no state), or as above: read for sequences whose has_initial_state
//               (bool, NULL: none) is set, written with each sequence's last width - 1 inputs.
typedef struct AttnGdnConvArgs {
  void* out;
  const void* x;
  void* conv_state;
  const void* weight;  // [dim, width]
  const void* bias;    // [dim] or NULL
  const void* indices;
  const void* query_start_loc;
  const uint8_t* has_initial_state;
  int64_t x_stride0, x_stride1, x_stride2;
  int64_t out_stride0, out_stride1, out_stride2;
  int64_t state_slot_stride, state_dim_stride, state_pos_stride;
  int64_t weight_dim_stride, weight_tap_stride, bias_stride;
  int64_t num_slots;
  int32_t num_seqs, dim, tokens, width;
  int32_t x_kind, weight_kind, bias_kind, state_kind, index_kind, offset_kind;
  int32_t silu;
} AttnGdnConvArgs;

int attn_gdn_abi_version(void);
const char* attn_gdn_platform(void);
const char* attn_gdn_error_string(int code);
// 0 on success, else a cudaError_t (cudaErrorInvalidValue for arguments no kernel serves).
int attn_gdn_decode(const AttnGdnDecodeArgs* args, void* stream);
int attn_gdn_conv_update(const AttnGdnConvArgs* args, void* stream);
int attn_gdn_conv_prefill(const AttnGdnConvArgs* args, void* stream);
int attn_gdn_recurrent_prefill(const AttnGdnPrefillArgs* args, void* stream);
// chunk_gated_delta_rule: the same arguments and results, in 16-token chunks (WY/UT form).
int attn_gdn_chunked_prefill(const AttnGdnPrefillArgs* args, void* stream);
// chunk_gated_delta_rule in 64-token chunks, two kernels a segment (chunk_prep, then
// chunk_pass). segments: host int32 [num_segments][4] = (base, width, p0, depth): the sequences
// seq_order[base .. base + width) at chunk positions [p0, p0 + depth), in order, every sequence
// covered from position 0 to its last chunk. workspace: attn_gdn_chunk_record_floats(head_k,
// head_v) floats for each of width * depth * num_value_heads records of the largest segment.
// final_state is required (it carries the state from one segment to the next).
int attn_gdn_chunk_parallel_prefill(const AttnGdnPrefillArgs* args, const int32_t* segments,
                                    int num_segments, void* stream);
int64_t attn_gdn_chunk_record_floats(int head_k, int head_v);
// The same pair with 16-bit operands on the matrix unit (chunk_prep's 16-bit records, then
// chunk_pass16): q, k, v (and out) fp16 or bf16, head_k 128, head_v a multiple of 32; NVIDIA
// builds only (cudaErrorNotSupported elsewhere). workspace: attn_gdn_chunk_record16_bytes bytes
// for each record, which is 0 where this build or these sizes have no such pair.
int attn_gdn_chunk_parallel_prefill16(const AttnGdnPrefillArgs* args, const int32_t* segments,
                                      int num_segments, void* stream);
int64_t attn_gdn_chunk_record16_bytes(int head_k, int head_v);
// which: 0 decode step (head_k 64 or 128), 1 conv update, 2 conv prefill outputs, 3 conv
// prefill states (head_k ignored), 4 recurrent prefill, 5 chunked prefill, 7 and 8 the
// chunk-parallel prefill's chunk_prep and chunk_pass (head_k 64 or 128), 9 and 10 the 16-bit
// pair's chunk_prep and chunk_pass16 (head_k 128; cudaErrorInvalidValue where not built).
int attn_gdn_kernel_info(int which, int head_k, AttnKernelInfo* info);

#ifdef __cplusplus
}
#endif
