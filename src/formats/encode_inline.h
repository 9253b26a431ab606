// Inline bodies of the e4m3 and e2m1 encoders (spec/MODEL.md §4.9), shared by the out-of-line codecs in
// formats.cpp and the block quantisers' inner loops (quant.cpp), which need them inlined. Internal to src/formats.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace dsflash {

// Branch-free select (a if condition else b): keeps the encoders free of control flow so that the quantisers'
// loops vectorise (GCC turns ternaries on these types into branches).
inline uint32_t select_u32(bool condition, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(condition);
  return (a & mask) | (b & ~mask);
}

// See f32_to_e4m3 (formats.h): RNE, saturating at ±448, NaN -> 0x7f.
inline uint8_t encode_e4m3(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (bits & 0x80000000u) >> 24;
  const uint32_t abs_bits = bits & 0x7fffffffu;
  // Below 2^-6 (smallest normal): adding 2^14 puts the value's 2^-9 multiples at fp32's last mantissa bit,
  // so the FPU's own round-to-nearest-even does the rounding; 2^-6 itself comes out as code 8 (normal).
  const float shifted = std::bit_cast<float>(abs_bits) + std::bit_cast<float>(141u << 23);
  const uint32_t subnormal = std::bit_cast<uint32_t>(shifted) - (141u << 23);
  // Normal: rebias the exponent (127 -> 7) and round the mantissa from 23 to 3 bits, ties to even.
  const uint32_t mantissa_odd = (abs_bits >> 20) & 1u;
  const uint32_t normal = (abs_bits + (static_cast<uint32_t>(7 - 127) << 23) + 0x7ffffu + mantissa_odd) >> 20;
  uint32_t code = select_u32(abs_bits < (121u << 23), subnormal, normal);
  code = select_u32(abs_bits > std::bit_cast<uint32_t>(448.0f), 0x7eu, code);  // saturate (incl. infinity)
  code |= sign;
  code = select_u32(abs_bits > 0x7f800000u, 0x7fu, code);                      // NaN
  return static_cast<uint8_t>(code);
}

// See f32_to_e2m1 (formats.h): RNE on {0, .5, 1, 1.5, 2, 3, 4, 6}, saturating at ±6, NaN -> 7 (sign kept).
inline uint8_t encode_e2m1(float value) {
  const uint32_t sign = (std::bit_cast<uint32_t>(value) >> 28) & 0x8u;
  const float m = std::fabs(value);
  // Count the midpoints of the grid {0, .5, 1, 1.5, 2, 3, 4, 6} below |x|; at an exact midpoint the even code
  // wins: 0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2.0, 2.5 -> 2.0, 3.5 -> 4.0, 5 -> 4.0. Saturates at 6.
  uint32_t code = static_cast<uint32_t>(m > 0.25f) + static_cast<uint32_t>(m >= 0.75f) +
                  static_cast<uint32_t>(m > 1.25f) + static_cast<uint32_t>(m >= 1.75f) +
                  static_cast<uint32_t>(m > 2.5f) + static_cast<uint32_t>(m >= 3.5f) + static_cast<uint32_t>(m > 5.0f);
  code = select_u32(m != m, 7u, code);  // NaN lands on code 7, as the reference's bucketize does
  return static_cast<uint8_t>(sign | code);
}

}  // namespace dsflash
