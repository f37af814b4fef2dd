// The driver's facts of one compiled kernel, the one struct every family's kernel-info export
// fills (attn_core/native/abi.py KernelInfo mirrors it; the simulator prices from these).
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Read with cudaFuncGetAttributes and the occupancy calculator at the launcher's block size.
typedef struct AttnKernelInfo {
  int32_t num_regs;
  int32_t smem_bytes;  // per block: static + the dynamic bytes the launcher passes
  int32_t local_bytes;  // spills; 0 is expected
  int32_t max_threads_per_block;
  int32_t threads_per_block;  // what the launcher uses
  int32_t blocks_per_sm;      // resident blocks per SM at that size
  int32_t binary_version;
  int32_t ptx_version;
} AttnKernelInfo;

#ifdef __cplusplus
}
#endif
