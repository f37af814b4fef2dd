// IEEE half for the host build of ci/host_emulation.py: the conversions the native sources call,
// through the compiler's _Float16 (round to nearest even, subnormals kept, as the GPU's).
#pragma once

#include <stdint.h>
#include <string.h>

#include "cuda_runtime.h"

struct __half {
  unsigned short x;
};
struct __half2 {
  __half x, y;
};

inline float __half2float(__half h) {
  _Float16 f;
  memcpy(&f, &h.x, 2);
  return static_cast<float>(f);
}
inline __half __float2half_rn(float v) {
  const _Float16 f = static_cast<_Float16>(v);
  __half h;
  memcpy(&h.x, &f, 2);
  return h;
}
inline __half __float2half(float v) { return __float2half_rn(v); }
inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
inline unsigned short __half_as_ushort(__half h) { return h.x; }
inline float2 __half22float2(__half2 h) { return {__half2float(h.x), __half2float(h.y)}; }
