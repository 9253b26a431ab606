// Independent, deliberately plain statements of the official rounding rules (spec/MODEL.md §4.9), written from
// the definitions (nearest representable value, ties to the even code; ceil(log2) by frexp) rather than by the
// bit tricks the library uses. The library is tested against these.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <limits>
#include <vector>

namespace dsflash::test {

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
inline constexpr float kInf = std::numeric_limits<float>::infinity();

// Value of an e4m3 fn code from the format's definition: bias 7, exponent 0 subnormal, S.1111.111 NaN.
inline double ref_e4m3_value(uint8_t code) {
  const int sign = code >> 7;
  const int exponent = (code >> 3) & 0xf;
  const int mantissa = code & 7;
  if (exponent == 15 && mantissa == 7) return std::numeric_limits<double>::quiet_NaN();
  const double magnitude =
      exponent == 0 ? std::ldexp(mantissa / 8.0, -6) : std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
  return sign ? -magnitude : magnitude;
}

inline double ref_e2m1_value(uint8_t code) {
  static const double grid[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (code & 8) ? -grid[code & 7] : grid[code & 7];
}

// Nearest code among `count` non-negative magnitudes (codes 0..count-1, increasing), ties to the even code,
// saturating at the largest. Works in double, where every candidate and every fp32 input is exact.
template <class ValueOf>
inline uint8_t ref_nearest_code(double magnitude, int count, ValueOf value_of) {
  int best = 0;
  double best_distance = std::numeric_limits<double>::infinity();
  for (int code = 0; code < count; ++code) {
    const double distance = std::fabs(value_of(static_cast<uint8_t>(code)) - magnitude);
    if (distance < best_distance || (distance == best_distance && (code % 2) == 0)) {
      best = code;
      best_distance = distance;
    }
  }
  return static_cast<uint8_t>(best);
}

// e4m3 with saturation to ±448 and NaN -> 0x7f (dsflash's documented codec behaviour).
inline uint8_t ref_f32_to_e4m3(float x) {
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double magnitude = std::min<double>(std::fabs(static_cast<double>(x)), 448.0);
  return sign | ref_nearest_code(magnitude, 0x7f, ref_e4m3_value);  // codes 0..0x7e
}

// e2m1 with saturation to ±6; NaN -> 7 (magnitude), sign kept.
inline uint8_t ref_f32_to_e2m1(float x) {
  const uint8_t sign = std::signbit(x) ? 8 : 0;
  if (std::isnan(x)) return sign | 7;
  const double magnitude = std::min<double>(std::fabs(static_cast<double>(x)), 6.0);
  return sign | ref_nearest_code(magnitude, 8, ref_e2m1_value);
}

// bf16: nearest of the two bf16 neighbours in double, ties to the even one.
inline uint16_t ref_f32_to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  if (std::isnan(x)) return static_cast<uint16_t>((bits >> 16) | 0x40);
  const uint16_t low = static_cast<uint16_t>(bits >> 16);  // truncation toward zero (same sign)
  const uint16_t high = static_cast<uint16_t>(low + 1);    // next magnitude up (may be infinity)
  auto value = [](uint16_t b) {
    const uint32_t wide = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &wide, 4);
    return static_cast<double>(f);
  };
  const double d_low = std::fabs(static_cast<double>(x) - value(low));
  // Infinity as the upper neighbour: IEEE rounds to it when |x| >= max + half an ulp (2^128 - 2^119).
  const double high_value = std::isinf(value(high)) ? std::copysign(std::ldexp(1.0, 128), x) : value(high);
  const double d_high = std::fabs(static_cast<double>(x) - high_value);
  if (d_low < d_high) return low;
  if (d_high < d_low) return high;
  return (low & 1) ? high : low;
}

// Smallest k with 2^k >= ratio, by frexp (ratio = m * 2^e, m in [0.5, 1)).
inline int ref_ceil_log2(float ratio) {
  int exponent = 0;
  const double mantissa = std::frexp(static_cast<double>(ratio), &exponent);
  return mantissa == 0.5 ? exponent - 1 : exponent;
}

struct RefBlocks {
  std::vector<uint8_t> codes;   // one code per element (e2m1 codes unpacked)
  std::vector<uint8_t> scales;  // one scale byte per block
};

inline double ref_amax(const float* x, int n) {
  double amax = 0;
  for (int i = 0; i < n; ++i) {
    if (std::isnan(x[i])) return std::numeric_limits<double>::quiet_NaN();
    amax = std::max(amax, std::fabs(static_cast<double>(x[i])));
  }
  return amax;
}

// act_quant, block 32: amax floored at 1e-4 (fp32), ratio = amax * fp32(1/448), ue8m0 = ceil(log2(ratio)),
// code = e4m3(clamp(x / 2^k, ±448)). Only for finite inputs.
inline RefBlocks ref_act_quant(const std::vector<float>& x) {
  RefBlocks out;
  for (size_t begin = 0; begin < x.size(); begin += 32) {
    const int n = static_cast<int>(std::min<size_t>(32, x.size() - begin));
    const float amax = std::max(static_cast<float>(ref_amax(&x[begin], n)), 1e-4f);
    const int k = ref_ceil_log2(amax * (1.0f / 448.0f));
    out.scales.push_back(static_cast<uint8_t>(k + 127));
    const float scale = std::ldexp(1.0f, k);
    for (int i = 0; i < n; ++i) {
      const float q = std::clamp(x[begin + i] / scale, -448.0f, 448.0f);
      out.codes.push_back(ref_f32_to_e4m3(q));
    }
  }
  return out;
}

// fp4_act_quant ue8m0, block 32: amax floored at 6*2^-126, ratio = amax * fp32(1/6), 2^ceil(log2).
inline RefBlocks ref_fp4_ue8m0(const std::vector<float>& x) {
  RefBlocks out;
  for (size_t begin = 0; begin < x.size(); begin += 32) {
    const int n = static_cast<int>(std::min<size_t>(32, x.size() - begin));
    const float amax = std::max(static_cast<float>(ref_amax(&x[begin], n)), 6.0f * std::ldexp(1.0f, -126));
    const int k = ref_ceil_log2(amax * (1.0f / 6.0f));
    out.scales.push_back(static_cast<uint8_t>(k + 127));
    const float scale = std::ldexp(1.0f, k);
    for (int i = 0; i < n; ++i) out.codes.push_back(ref_f32_to_e2m1(std::clamp(x[begin + i] / scale, -6.0f, 6.0f)));
  }
  return out;
}

// fp4_act_quant e4m3, block 16: scale = e4m3(max(amax, 6*2^-9) / 6) (fp32 division), code = e2m1(clamp(x/scale)).
inline RefBlocks ref_fp4_e4m3(const std::vector<float>& x) {
  RefBlocks out;
  for (size_t begin = 0; begin < x.size(); begin += 16) {
    const int n = static_cast<int>(std::min<size_t>(16, x.size() - begin));
    const float amax = std::max(static_cast<float>(ref_amax(&x[begin], n)), 6.0f * std::ldexp(1.0f, -9));
    const uint8_t scale_code = ref_f32_to_e4m3(amax / 6.0f);
    out.scales.push_back(scale_code);
    const float scale = static_cast<float>(ref_e4m3_value(scale_code));
    for (int i = 0; i < n; ++i) out.codes.push_back(ref_f32_to_e2m1(std::clamp(x[begin + i] / scale, -6.0f, 6.0f)));
  }
  return out;
}

}  // namespace dsflash::test
