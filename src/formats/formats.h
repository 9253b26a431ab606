// Scalar codecs of the number formats the checkpoint and the KV cache use (spec/MODEL.md §3, §4.9).
// All codecs are exact statements of the official rules; SIMD kernels are tested against them.
#pragma once

#include <bit>
#include <cstdint>

namespace dsflash {

// bf16 <-> fp32. f32_to_bf16 rounds to nearest, ties to even; NaN stays NaN (quiet). Inline: the model's scalar
// loops round every element (a call each was ~3% of a prefill).
inline uint16_t f32_to_bf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // NaN: keep sign and payload top, force quiet
  }
  // Round to nearest, ties to even: add 0x7fff plus the lowest kept bit, then truncate. Overflow of the
  // largest finite values carries into the exponent and gives infinity, as IEEE rounding does.
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}
inline float bf16_to_f32(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }
// Rounds an fp32 value to the nearest bf16-representable value (result still fp32).
inline float round_to_bf16(float value) { return bf16_to_f32(f32_to_bf16(value)); }
// Rounds x[0..n) in place to bf16-representable values.
void round_to_bf16_inplace(float* x, int64_t n);

// FP8 e4m3 "fn" (OCP): bias 7, no infinities, max finite ±448, 0x7f/0xff = NaN.
// f32_to_e4m3 rounds to nearest even and saturates finite values beyond ±448 to ±448 (callers clamp first,
// as the reference does); NaN -> 0x7f.
uint8_t f32_to_e4m3(float value);
float e4m3_to_f32(uint8_t code);

// ue8m0 scale: value 2^(code - 127); code 0xff = NaN.
float e8m0_to_f32(uint8_t code);
// Exact power of two 2^e as an e8m0 code (e in [-127, 127]).
uint8_t e8m0_from_exponent(int exponent);

// FP4 e2m1: bit 3 sign, bits 0-2 index the grid {0, 0.5, 1, 1.5, 2, 3, 4, 6}.
// f32_to_e2m1 rounds to nearest even on that grid and saturates at ±6.
uint8_t f32_to_e2m1(float value);
float e2m1_to_f32(uint8_t code);

// Decoded values of every code, for table-driven kernels: 256 e4m3 values (NaN at 0x7f/0xff) and 16 e2m1
// values (index = 4-bit code). Immutable, valid for the life of the program.
const float* e4m3_value_table();
const float* e2m1_value_table();

}  // namespace dsflash
