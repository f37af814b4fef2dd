// Element decoding and encoding from raw bits, identical under nvcc and CoreX clang.
#pragma once

#include <type_traits>

#include "attn_platform.cuh"

namespace attn {

ATTN_DEVICE float half_bits_to_float(uint32_t bits16) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits16)));
}

ATTN_DEVICE float bf16_bits_to_float(uint32_t bits16) { return __uint_as_float(bits16 << 16); }

// Two IEEE halves packed in a word, low one first.
ATTN_DEVICE float2 half2_bits_to_float2(uint32_t bits) {
  __half2 h;
  static_assert(sizeof(h) == sizeof(bits), "half2 is 32 bits");
  *reinterpret_cast<uint32_t*>(&h) = bits;
  return __half22float2(h);
}

// fp8 bytes go through halves, two at a time (bytes 0 and 2, then 1 and 3 of a word):
// - e5m2 is the upper byte of an IEEE half: exact, specials included;
// - e4m3fn (bias 7) placed in a half's exponent and mantissa bits reads as value * 2^-8 (bias
//   15), subnormals included: the kernel folds kE4M3Rescale into its scales instead of
//   multiplying every element. Its NaN pattern (S.1111.111) decodes as 480 * 2^-8: caches never
//   hold it (quantisation saturates), and masked slots never reach the output.
constexpr float kE4M3Rescale = 256.0f;

template <int KIND>
ATTN_DEVICE uint32_t fp8x2_to_half2_bits(uint32_t two_bytes) {  // bytes at bits 0 and 16
  if (KIND == kFp8E5M2) return two_bytes << 8;
  return ((two_bytes & 0x00800080u) << 8) | ((two_bytes & 0x007F007Fu) << 7);
}

// Four fp8 bytes (element 0 lowest) as two words of two IEEE halves each, element 0 in the low
// half of `lo` (e4m3: divided by kE4M3Rescale), by the bit moves above.
template <int KIND>
ATTN_DEVICE void fp8x4_to_half2x2_bits(uint32_t four, uint32_t& lo, uint32_t& hi) {
  lo = fp8x2_to_half2_bits<KIND>((four & 0xFFu) | ((four & 0xFF00u) << 8));
  hi = fp8x2_to_half2_bits<KIND>(((four >> 16) & 0xFFu) | ((four >> 8) & 0xFF0000u));
}

// Two halves as two bf16s, for values every bf16 holds exactly (fp8's): the top halves of the
// floats.
ATTN_DEVICE uint32_t half2_bits_to_exact_bf16x2_bits(uint32_t bits) {
  const float2 f = half2_bits_to_float2(bits);
  return (__float_as_uint(f.x) >> 16) | (__float_as_uint(f.y) & 0xFFFF0000u);
}

// The N = bytes / elem_bytes(KIND) elements of a packed vector, in order, as floats (e4m3:
// divided by kE4M3Rescale).
template <int KIND, int WORDS>
ATTN_DEVICE void unpack(const uint32_t (&w)[WORDS], float* out) {
#pragma unroll
  for (int i = 0; i < WORDS; ++i) {
    const uint32_t v = w[i];
    if (KIND == kFloat32) {
      out[i] = __uint_as_float(v);
    } else if (KIND == kFloat16) {
      const float2 f = half2_bits_to_float2(v);
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    } else if (KIND == kBFloat16) {
      out[2 * i] = __uint_as_float(v << 16);
      out[2 * i + 1] = __uint_as_float(v & 0xFFFF0000u);
    } else {
      const float2 even = half2_bits_to_float2(fp8x2_to_half2_bits<KIND>(v & 0x00FF00FFu));
      const float2 odd = half2_bits_to_float2(fp8x2_to_half2_bits<KIND>((v >> 8) & 0x00FF00FFu));
      out[4 * i] = even.x;
      out[4 * i + 1] = odd.x;
      out[4 * i + 2] = even.y;
      out[4 * i + 3] = odd.y;
    }
  }
}

// Elements 4s .. 4s + 3 of a packed vector as floats (e4m3: divided by kE4M3Rescale): the
// callers convert four at a time, so at most four floats per vector are live (a whole 16-byte
// fp8 vector unpacked at once kept 16, and ptxas spilled the fp8 kernels at head 256).
template <int KIND, int WORDS>
ATTN_DEVICE void unpack4(const uint32_t (&w)[WORDS], int s, float (&out)[4]) {
  constexpr int kWords = elem_bytes(KIND);  // words holding four elements: 4, 2 or 1
  static_assert(WORDS % kWords == 0, "whole groups of four elements");
  uint32_t part[kWords];
#pragma unroll
  for (int i = 0; i < kWords; ++i) part[i] = w[s * kWords + i];
  unpack<KIND, kWords>(part, out);
}

// One query / output element <-> float.
template <int KIND>
ATTN_DEVICE float load_elem(const void* base, int64_t index) {
  if (KIND == kFloat32) return static_cast<const float*>(base)[index];
  const uint32_t bits = static_cast<const unsigned short*>(base)[index];
  return KIND == kFloat16 ? half_bits_to_float(bits) : bf16_bits_to_float(bits);
}

ATTN_DEVICE unsigned short float_to_bf16_bits(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0u;  // NaN stays NaN
  return static_cast<unsigned short>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);  // round to even
}

// A float as a 16-bit element's bits (fp16 round to nearest, bf16 round to even).
template <int KIND>
ATTN_DEVICE uint16_t to_bits16(float f) {
  if (KIND == kFloat16) return __half_as_ushort(__float2half_rn(f));
  return float_to_bf16_bits(f);
}

template <int KIND>
ATTN_DEVICE void store_elem(void* base, int64_t index, float value) {
  if (KIND == kFloat32) {
    static_cast<float*>(base)[index] = value;
  } else if (KIND == kFloat16) {
    static_cast<__half*>(base)[index] = __float2half_rn(value);
  } else {
    static_cast<unsigned short*>(base)[index] = float_to_bf16_bits(value);
  }
}

// f(std::integral_constant<int, KIND>{}) for a runtime element kind (kFloat32, kFloat16, anything
// else bf16): the one branch on the kind sits outside the code f compiles per kind, so a batch of
// loads inside f is issued together rather than each behind its own branch.
template <class F>
ATTN_DEVICE void with_element_kind(int kind, F&& f) {
  if (kind == kFloat32) {
    f(std::integral_constant<int, kFloat32>{});
  } else if (kind == kFloat16) {
    f(std::integral_constant<int, kFloat16>{});
  } else {
    f(std::integral_constant<int, kBFloat16>{});
  }
}

}  // namespace attn
