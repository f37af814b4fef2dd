// Element decoding and encoding from raw bits, identical under nvcc and CoreX clang.
#pragma once

#include "attn_platform.cuh"

namespace attn {

ATTN_DEVICE float half_bits_to_float(uint32_t bits16) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits16)));
}

ATTN_DEVICE float bf16_bits_to_float(uint32_t bits16) { return __uint_as_float(bits16 << 16); }

// e5m2 is the upper byte of an IEEE half: exact, specials included.
ATTN_DEVICE float e5m2_to_float(uint32_t byte) { return half_bits_to_float(byte << 8); }

// e4m3fn (bias 7) placed in a half's exponent/mantissa bits reads as value * 2^-8 (bias 15),
// subnormals included; 2^8 restores it. S.1111.111 is the format's only NaN.
ATTN_DEVICE float e4m3_to_float(uint32_t byte) {
  const uint32_t half_bits = ((byte & 0x80u) << 8) | ((byte & 0x7Fu) << 7);
  const float value = half_bits_to_float(half_bits) * 256.0f;
  return (byte & 0x7Fu) == 0x7Fu ? __int_as_float(0x7fffffff) : value;
}

// The N = bytes / elem_bytes(KIND) elements of a packed vector, in order, as floats.
template <int KIND, int WORDS>
ATTN_DEVICE void unpack(const uint32_t (&w)[WORDS], float* out) {
#pragma unroll
  for (int i = 0; i < WORDS; ++i) {
    const uint32_t v = w[i];
    if (KIND == kFloat32) {
      out[i] = __uint_as_float(v);
    } else if (KIND == kFloat16) {
      out[2 * i] = half_bits_to_float(v & 0xFFFFu);
      out[2 * i + 1] = half_bits_to_float(v >> 16);
    } else if (KIND == kBFloat16) {
      out[2 * i] = __uint_as_float(v << 16);
      out[2 * i + 1] = __uint_as_float(v & 0xFFFF0000u);
    } else {
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const uint32_t byte = (v >> (8 * b)) & 0xFFu;
        out[4 * i + b] = KIND == kFp8E4M3 ? e4m3_to_float(byte) : e5m2_to_float(byte);
      }
    }
  }
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

}  // namespace attn
