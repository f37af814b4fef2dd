// CUDA's pipeline primitives (cuda_pipeline.h) for the host build of the NVIDIA configuration:
// an asynchronous copy lands as late as the GPU allows, at the __pipeline_wait_prior that
// covers its batch (or when its thread returns), so a read of the destination before that wait
// sees what was there before (0xFF bytes at a block's start: NaN), and a missing wait shows.
#pragma once

#include "cuda_runtime.h"

inline ::attn_emu::Thread& emu_pipeline_thread() {
  ::attn_emu::State& s = ::attn_emu::state();
  return s.threads[s.current];
}

inline void __pipeline_memcpy_async(void* dst, const void* src, size_t bytes,
                                    size_t zero_fill = 0) {
  ::attn_emu::Thread& t = emu_pipeline_thread();
  t.copies.push_back({dst, src, bytes, zero_fill, t.batch});
}

inline void __pipeline_commit() { ++emu_pipeline_thread().batch; }

// Every copy of all but the `pending` most recent committed batches lands.
inline void __pipeline_wait_prior(size_t pending) {
  ::attn_emu::Thread& t = emu_pipeline_thread();
  size_t kept = 0;
  for (size_t i = 0; i < t.copies.size(); ++i) {
    const ::attn_emu::PendingCopy c = t.copies[i];
    if (c.batch + pending < t.batch) {
      ::attn_emu::land(c);
    } else {
      t.copies[kept++] = c;
    }
  }
  t.copies.resize(kept);
}
