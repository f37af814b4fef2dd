// A CUDA grid run on the host, one block at a time, each block's threads as fibers.
//
// ci/host_emulation.py compiles a native library's CUDA source with the host C++ compiler
// against this directory's cuda_runtime.h / cuda_fp16.h, its kernel launches rewritten into
// attn_emu::launch calls. That is possible because the platform rules of attn_platform.cuh
// (no inline PTX, no warp shuffles: every cross-thread step goes through shared memory and
// __syncthreads) make the CoreX source plain C++ plus barriers; the NVIDIA configuration's
// PTX and shuffles go through attn_emu_warp.h's warp collectives. What it checks is the kernel's
// logic (indexing, masking, partitions, the merge) on a machine with no GPU; not what a device
// compiler makes of it, and nothing about time.
//
// Threads of a block run as ucontext fibers on the calling thread: each runs until it reaches
// __syncthreads() or a warp collective or returns, then the next; when every thread still running
// waits at a barrier, all are released together (a thread that returned no longer counts, as on
// the GPU), and a warp whose 32 lanes all wait at one collective is released on its own. Within a
// phase the threads run in index order or in reverse (attn_host_emulation_set_order): a result
// that differs between the two read shared memory that another thread wrote in the same phase,
// a missing barrier. Every __shared__ variable (one linker section) and the launch's dynamic
// shared memory are filled with 0xFF bytes, a NaN in every float, before each block, so a read
// of something this block never wrote shows. Threads of one phase waiting at barriers on
// different source lines fail the launch (cudaGetLastError: cudaErrorLaunchFailure).
//
// Warp collectives (attn_emu_warp.h: shuffles, ldmatrix, the m16n8k16 matrix instruction) run
// in lockstep: each lane leaves its operands and waits; the last lane to arrive computes every
// lane's result from all of them (so shared memory is read at one instant, as by the warp), and
// the warp goes on together. A collective with a lane that returned, or lanes at different
// collectives, or a warp at a collective while the rest of the block waits at a barrier, fails
// the launch: full-mask collectives need the whole warp.
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <ucontext.h>

#include <functional>
#include <vector>

// Under AddressSanitizer (ci/host_emulation.py --asan) every switch between the scheduler's
// stack and a fiber's is announced, so ASan tracks the stack in use (without it a fiber's frames
// can read as overflows of another stack).
#if defined(__SANITIZE_ADDRESS__)
#define ATTN_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ATTN_EMU_ASAN 1
#endif
#endif
#ifndef ATTN_EMU_ASAN
#define ATTN_EMU_ASAN 0
#endif
#if ATTN_EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

struct uint3 {
  unsigned int x, y, z;
};
struct dim3 {
  unsigned int x, y, z;
  dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace {
// What kernel code reads as threadIdx / blockIdx / blockDim / gridDim: set by the scheduler
// before it switches to a thread's fiber.
uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
}  // namespace

// Every __shared__ variable lives in this section (ELF); the linker marks its ends.
#if defined(__ELF__)
extern "C" char __start_attn_emu_shared[] __attribute__((weak));
extern "C" char __stop_attn_emu_shared[] __attribute__((weak));
#define ATTN_EMU_SHARED_SECTION 1
#else
#define ATTN_EMU_SHARED_SECTION 0
#endif

namespace attn_emu {

// A fiber's stack. 128 KB holds both kernels' frames under ASan's redzones (an overflow would
// write below the stack's heap block, which the ASan run reports). 512 KB made the ASan tests
// 3x slower (250 s against 80, the difference nearly all system time, as if ASan unpoisoned the
// whole stack it switches to).
constexpr size_t kStackBytes = 128 * 1024;

enum ErrorCode : int { kOk = 0, kDivergentBarrier = 1, kBadLaunch = 2, kDivergentWarp = 3 };

constexpr int kWarp = 32;
// Words a lane hands a collective, and gets back: the matrix instruction's A, B and C fragments
// in, D out.
constexpr int kCollectiveIn = 10, kCollectiveOut = 4;

enum Wait : int { kRunning = 0, kAtBarrier = 1, kAtCollective = 2 };

// An asynchronous copy (cuda_pipeline.h) not landed yet, and the batch it was issued in.
struct PendingCopy {
  void* dst;
  const void* src;
  size_t bytes, zero_fill;
  unsigned batch;
};

inline void land(const PendingCopy& c) {
  memcpy(c.dst, c.src, c.bytes - c.zero_fill);
  memset(static_cast<char*>(c.dst) + (c.bytes - c.zero_fill), 0, c.zero_fill);
}

struct Thread {
  ucontext_t context;
  std::vector<char> stack;
  bool finished = false;
  Wait wait = kRunning;
  int barrier_line = 0;  // the __syncthreads() or collective line it waits at
  unsigned collectives = 0;  // collectives this thread has entered (their exchange's parity)
  std::vector<PendingCopy> copies;
  unsigned batch = 0;  // the copy batch being filled (committed ones are below it)
  void* asan_fake_stack = nullptr;
};

// One warp's exchange, two of them: a lane may enter collective n + 1 while others still read
// the results of n, never n + 2 (every lane must have entered n + 1 first).
struct WarpExchange {
  uint64_t in[2][kWarp][kCollectiveIn];
  uint64_t out[2][kWarp][kCollectiveOut];
  int arrived[2];
};

struct State {
  ucontext_t scheduler;
  const void* scheduler_stack = nullptr;  // its bounds, as ASan reports them to a fiber
  size_t scheduler_stack_bytes = 0;
  std::vector<Thread> threads;
  std::vector<WarpExchange> warps;
  std::function<void()> body;
  std::vector<char> dynamic_shared;  // extern __shared__ memory of the launch, 128 B aligned
  size_t dynamic_bytes = 0;
  int current = 0;
  bool reverse = false;
  int error = kOk;
  int error_lines[2] = {0, 0};
};

inline State& state() {
  static State s;
  return s;
}

// The launch's dynamic shared memory (what `extern __shared__ T name[]` declares; the build
// rewrites such a declaration into a pointer to this).
inline char* dynamic_shared() {
  State& s = state();
  const uintptr_t p = reinterpret_cast<uintptr_t>(s.dynamic_shared.data());
  return s.dynamic_shared.data() + ((128 - p % 128) % 128);
}

// ASan's fiber protocol: announce the stack about to run, confirm on arrival (no-ops without
// ASan). A null save slot on the way out says the leaving fiber is done.
inline void switch_begins(void** save, const void* stack, size_t bytes) {
#if ATTN_EMU_ASAN
  __sanitizer_start_switch_fiber(save, stack, bytes);
#else
  (void)save, (void)stack, (void)bytes;
#endif
}
inline void switch_ends(void* saved, const void** from_stack, size_t* from_bytes) {
#if ATTN_EMU_ASAN
  __sanitizer_finish_switch_fiber(saved, from_stack, from_bytes);
#else
  (void)saved, (void)from_stack, (void)from_bytes;
#endif
}

inline void run_thread() {
  State& s = state();
  switch_ends(nullptr, &s.scheduler_stack, &s.scheduler_stack_bytes);
  s.body();
  Thread& t = s.threads[s.current];
  for (const PendingCopy& c : t.copies) land(c);  // copies complete after their thread returns
  t.copies.clear();
  t.finished = true;
  switch_begins(nullptr, s.scheduler_stack, s.scheduler_stack_bytes);
}  // uc_link returns to the scheduler

// Back to the scheduler until released from `wait` at `line`.
inline void yield_at(Wait wait, int line) {
  State& s = state();
  Thread& t = s.threads[s.current];
  t.wait = wait;
  t.barrier_line = line;
  switch_begins(&t.asan_fake_stack, s.scheduler_stack, s.scheduler_stack_bytes);
  swapcontext(&t.context, &s.scheduler);
  switch_ends(t.asan_fake_stack, &s.scheduler_stack, &s.scheduler_stack_bytes);
}

inline void sync_threads(int line) { yield_at(kAtBarrier, line); }

inline void set_thread(unsigned int linear) {
  threadIdx.x = linear % blockDim.x;
  threadIdx.y = (linear / blockDim.x) % blockDim.y;
  threadIdx.z = linear / (blockDim.x * blockDim.y);
}

// Releases the warps whose lanes all wait at one collective (every other thread now waits at a
// barrier or returned): true if any. A warp at a collective with a lane that returned or waits
// elsewhere can never go on: kDivergentWarp into `error`.
inline bool release_warps(int& error) {
  State& s = state();
  const int n = static_cast<int>(s.threads.size());
  bool released = false;
  for (int w0 = 0; w0 < n; w0 += kWarp) {
    const int lanes = n - w0 < kWarp ? n - w0 : kWarp;
    int at = 0, line = 0;
    bool whole = true;
    for (int i = w0; i < w0 + lanes; ++i) {
      const Thread& t = s.threads[i];
      if (!t.finished && t.wait == kAtCollective) {
        whole = whole && (at == 0 || t.barrier_line == line);
        line = t.barrier_line;
        ++at;
      } else {
        whole = false;
      }
    }
    if (at == 0) continue;
    if (!whole) {
      error = kDivergentWarp;
      s.error_lines[0] = line;
      continue;
    }
    for (int i = w0; i < w0 + lanes; ++i) s.threads[i].wait = kRunning;
    released = true;
  }
  return released;
}

// One block: fibers until every thread has returned.
inline int run_block() {
  State& s = state();
  const int n = static_cast<int>(s.threads.size());
  for (int i = 0; i < n; ++i) {
    Thread& t = s.threads[i];
    t.finished = false;
    t.wait = kRunning;
    t.barrier_line = 0;
    t.collectives = 0;
    t.copies.clear();
    t.batch = 0;
    if (t.stack.size() != kStackBytes) t.stack.assign(kStackBytes, 0);
    getcontext(&t.context);
    t.context.uc_stack.ss_sp = t.stack.data();
    t.context.uc_stack.ss_size = t.stack.size();
    t.context.uc_link = &s.scheduler;
    makecontext(&t.context, run_thread, 0);
  }
  s.warps.assign((n + kWarp - 1) / kWarp, WarpExchange{});
#if ATTN_EMU_SHARED_SECTION
  if (__start_attn_emu_shared != nullptr) {
    memset(__start_attn_emu_shared, 0xFF, __stop_attn_emu_shared - __start_attn_emu_shared);
  }
#endif
  memset(dynamic_shared(), 0xFF, s.dynamic_bytes);
  for (;;) {
    for (int k = 0; k < n; ++k) {  // every thread free to run, to its next wait
      const int i = s.reverse ? n - 1 - k : k;
      Thread& t = s.threads[i];
      if (t.finished || t.wait != kRunning) continue;
      s.current = i;
      set_thread(static_cast<unsigned int>(i));
      void* scheduler_fake_stack = nullptr;
      switch_begins(&scheduler_fake_stack, t.stack.data(), t.stack.size());
      swapcontext(&s.scheduler, &t.context);
      switch_ends(scheduler_fake_stack, nullptr, nullptr);
    }
    int error = kOk;
    if (release_warps(error)) continue;
    if (error != kOk) return error;  // the fibers are abandoned; their stacks are reset next time
    int waiting_line = 0, running = 0;
    for (int i = 0; i < n; ++i) {  // all wait at barriers now: one line, or divergence
      const Thread& t = s.threads[i];
      if (t.finished) continue;
      ++running;
      if (waiting_line == 0) {
        waiting_line = t.barrier_line;
      } else if (t.barrier_line != waiting_line) {
        s.error_lines[0] = waiting_line;
        s.error_lines[1] = t.barrier_line;
        return kDivergentBarrier;
      }
    }
    if (running == 0) return kOk;
    for (int i = 0; i < n; ++i) s.threads[i].wait = kRunning;
  }
}

// kernel<<<grid, block, smem, stream>>>(args...), run to completion before it returns.
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, void* /*stream*/,
            Args&&... args) {
  State& s = state();
  if (s.error != kOk) return;
  if (block.x * block.y * block.z == 0 || grid.x * grid.y * grid.z == 0) {
    s.error = kBadLaunch;
    return;
  }
  gridDim = grid;
  blockDim = block;
  s.dynamic_bytes = smem;
  if (s.dynamic_shared.size() < smem + 128) s.dynamic_shared.resize(smem + 128);
  s.threads.resize(block.x * block.y * block.z);
  s.body = [&]() { kernel(args...); };
  for (unsigned int z = 0; z < grid.z; ++z) {
    for (unsigned int y = 0; y < grid.y; ++y) {
      for (unsigned int x = 0; x < grid.x; ++x) {
        blockIdx = {x, y, z};
        const int rc = run_block();
        if (rc != kOk) {
          s.error = rc;
          return;
        }
      }
    }
  }
}

// The launch error since the last call, cleared (cudaGetLastError).
inline int take_error() {
  State& s = state();
  const int e = s.error;
  s.error = kOk;
  return e;
}

}  // namespace attn_emu

#define __syncthreads() ::attn_emu::sync_threads(__LINE__)

#include "attn_emu_warp.h"

