// A CUDA grid run on the host, one block at a time, each block's threads as fibers.
//
// ci/host_emulation.py compiles a native library's CUDA source with the host C++ compiler
// against this directory's cuda_runtime.h / cuda_fp16.h, its kernel launches rewritten into
// attn_emu::launch calls. That is possible because the platform rules of attn_platform.cuh
// (no inline PTX, no warp shuffles: every cross-thread step goes through shared memory and
// __syncthreads) make the CoreX source plain C++ plus barriers. What it checks is the kernel's
// logic (indexing, masking, partitions, the merge) on a machine with no GPU; not what a device
// compiler makes of it, and nothing about time.
//
// Threads of a block run as ucontext fibers on the calling thread: each runs until it reaches
// __syncthreads() or returns, then the next; when every thread still running waits at a barrier,
// all are released together (a thread that returned no longer counts, as on the GPU). Within a
// phase the threads run in index order or in reverse (attn_host_emulation_set_order): a result
// that differs between the two read shared memory that another thread wrote in the same phase,
// a missing barrier. Every __shared__ variable (one linker section) and the launch's dynamic
// shared memory are filled with 0xFF bytes, a NaN in every float, before each block, so a read
// of something this block never wrote shows. Threads of one phase waiting at barriers on
// different source lines fail the launch (cudaGetLastError: cudaErrorLaunchFailure).
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

enum ErrorCode : int { kOk = 0, kDivergentBarrier = 1, kBadLaunch = 2 };

struct Thread {
  ucontext_t context;
  std::vector<char> stack;
  bool finished = false;
  int barrier_line = 0;  // the __syncthreads() line it waits at; 0 while running
  void* asan_fake_stack = nullptr;
};

struct State {
  ucontext_t scheduler;
  const void* scheduler_stack = nullptr;  // its bounds, as ASan reports them to a fiber
  size_t scheduler_stack_bytes = 0;
  std::vector<Thread> threads;
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
  s.threads[s.current].finished = true;
  switch_begins(nullptr, s.scheduler_stack, s.scheduler_stack_bytes);
}  // uc_link returns to the scheduler

inline void sync_threads(int line) {
  State& s = state();
  Thread& t = s.threads[s.current];
  t.barrier_line = line;
  switch_begins(&t.asan_fake_stack, s.scheduler_stack, s.scheduler_stack_bytes);
  swapcontext(&t.context, &s.scheduler);
  switch_ends(t.asan_fake_stack, &s.scheduler_stack, &s.scheduler_stack_bytes);
}

inline void set_thread(unsigned int linear) {
  threadIdx.x = linear % blockDim.x;
  threadIdx.y = (linear / blockDim.x) % blockDim.y;
  threadIdx.z = linear / (blockDim.x * blockDim.y);
}

// One block: fibers until every thread has returned.
inline int run_block() {
  State& s = state();
  const int n = static_cast<int>(s.threads.size());
  for (int i = 0; i < n; ++i) {
    Thread& t = s.threads[i];
    t.finished = false;
    t.barrier_line = 0;
    if (t.stack.size() != kStackBytes) t.stack.assign(kStackBytes, 0);
    getcontext(&t.context);
    t.context.uc_stack.ss_sp = t.stack.data();
    t.context.uc_stack.ss_size = t.stack.size();
    t.context.uc_link = &s.scheduler;
    makecontext(&t.context, run_thread, 0);
  }
#if ATTN_EMU_SHARED_SECTION
  if (__start_attn_emu_shared != nullptr) {
    memset(__start_attn_emu_shared, 0xFF, __stop_attn_emu_shared - __start_attn_emu_shared);
  }
#endif
  memset(dynamic_shared(), 0xFF, s.dynamic_bytes);
  for (;;) {
    int waiting_line = 0, running = 0;
    for (int k = 0; k < n; ++k) {
      const int i = s.reverse ? n - 1 - k : k;
      Thread& t = s.threads[i];
      if (t.finished) continue;
      t.barrier_line = 0;
      s.current = i;
      set_thread(static_cast<unsigned int>(i));
      void* scheduler_fake_stack = nullptr;
      switch_begins(&scheduler_fake_stack, t.stack.data(), t.stack.size());
      swapcontext(&s.scheduler, &t.context);
      switch_ends(scheduler_fake_stack, nullptr, nullptr);
      if (t.finished) continue;
      ++running;
      if (waiting_line == 0) {
        waiting_line = t.barrier_line;
      } else if (t.barrier_line != waiting_line) {
        s.error_lines[0] = waiting_line;
        s.error_lines[1] = t.barrier_line;
        return kDivergentBarrier;  // the fibers are abandoned; their stacks are reset next time
      }
    }
    if (running == 0) return kOk;
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
