// Scalar codecs (spec/MODEL.md §3, §4.9). Each one is written as a bit-level statement of the rounding rule;
// tests/formats checks them against a nearest-value search over every representable value.
#include "formats/formats.h"

#include "formats/encode_inline.h"

#include <array>
#include <bit>
#include <cmath>
#include <limits>

namespace dsflash {

namespace {

constexpr uint32_t kSignMask = 0x80000000u;

// Decoded value of every e4m3 code: exponent bias 7, exponent 0 = subnormal (m * 2^-9), 0x7f/0xff = NaN.
constexpr float e4m3_value(uint8_t code) {
  const int exponent = (code >> 3) & 0xf;
  const int mantissa = code & 0x7;
  if ((code & 0x7f) == 0x7f) return std::numeric_limits<float>::quiet_NaN();
  float magnitude = 0.0f;
  if (exponent == 0) {
    magnitude = static_cast<float>(mantissa) / 512.0f;  // 2^-9 steps
  } else {
    // (8 + m) * 2^(e - 7 - 3), built by repeated exact scaling (constexpr-friendly, no ldexp).
    magnitude = static_cast<float>(8 + mantissa);
    int shift = exponent - 10;
    for (; shift > 0; --shift) magnitude *= 2.0f;
    for (; shift < 0; ++shift) magnitude *= 0.5f;
  }
  return (code & 0x80) ? -magnitude : magnitude;
}

constexpr std::array<float, 256> make_e4m3_table() {
  std::array<float, 256> table{};
  for (int code = 0; code < 256; ++code) table[code] = e4m3_value(static_cast<uint8_t>(code));
  return table;
}

constexpr std::array<float, 256> kE4m3Values = make_e4m3_table();

constexpr std::array<float, 16> kE2m1Values = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                               -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

}  // namespace

void round_to_bf16_inplace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = round_to_bf16(x[i]);
}

uint8_t f32_to_e4m3(float value) { return encode_e4m3(value); }

float e4m3_to_f32(uint8_t code) { return kE4m3Values[code]; }

float e8m0_to_f32(uint8_t code) {
  if (code == 0xff) return std::numeric_limits<float>::quiet_NaN();
  if (code == 0) return std::bit_cast<float>(0x00400000u);  // 2^-127 is an fp32 subnormal
  return std::bit_cast<float>(static_cast<uint32_t>(code) << 23);
}

uint8_t e8m0_from_exponent(int exponent) {
  if (exponent < -127) exponent = -127;
  if (exponent > 127) exponent = 127;
  return static_cast<uint8_t>(exponent + 127);
}

uint8_t f32_to_e2m1(float value) { return encode_e2m1(value); }

float e2m1_to_f32(uint8_t code) { return kE2m1Values[code & 0xf]; }

const float* e4m3_value_table() { return kE4m3Values.data(); }

const float* e2m1_value_table() { return kE2m1Values.data(); }

}  // namespace dsflash
