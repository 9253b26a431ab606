// Scalar codecs: exhaustive over every e4m3 / e2m1 / e8m0 / bf16 code, round trips, ties, edges, and fp32
// sweeps against the plain nearest-value statements in reference_rules.h.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "formats/formats.h"
#include "formats/reference_rules.h"

namespace dsflash {
namespace {

using test::ref_e2m1_value;
using test::ref_e4m3_value;
using test::ref_f32_to_bf16;
using test::ref_f32_to_e2m1;
using test::ref_f32_to_e4m3;

float from_bits(uint32_t bits) { return std::bit_cast<float>(bits); }
uint32_t to_bits(float value) { return std::bit_cast<uint32_t>(value); }
using test::kInf;
using test::kNaN;

// ---------------------------------------------------------------------------------------------- bf16

TEST(Bf16, EveryCodeRoundTrips) {
  for (uint32_t code = 0; code < 0x10000; ++code) {
    const float value = bf16_to_f32(static_cast<uint16_t>(code));
    EXPECT_EQ(to_bits(value), code << 16);
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(value)))) << code;
    } else {
      EXPECT_EQ(f32_to_bf16(value), code) << code;
      EXPECT_EQ(to_bits(round_to_bf16(value)), to_bits(value));
    }
  }
}

TEST(Bf16, TiesGoToEven) {
  // 1 + 2^-8 is halfway between 1 (even) and 1 + 2^-7 (odd): rounds down; 1 + 3*2^-8 rounds up to 1 + 2^-6.
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  // Just above a tie rounds up.
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808001)), 0x3f81);
  EXPECT_EQ(f32_to_bf16(-1.0f - std::ldexp(1.0f, -8)), 0xbf80);
}

TEST(Bf16, Edges) {
  EXPECT_EQ(f32_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16(kInf), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-kInf), 0xff80);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // above max + half ulp: infinity
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f7f7fff)), 0x7f7f);               // just below the overflow tie
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(kNaN))));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(from_bits(0x7f800001)))));  // signalling NaN stays NaN
  EXPECT_EQ(f32_to_bf16(from_bits(0x00000001)), 0x0000);                     // tiny denormal -> +0
  EXPECT_EQ(f32_to_bf16(from_bits(0x00008000)), 0x0000);                     // tie at denormal: even (0)
  EXPECT_EQ(f32_to_bf16(from_bits(0x00018000)), 0x0002);                     // tie: to even (2)
}

TEST(Bf16, SweepMatchesNearestEven) {
  // Every 251st fp32 bit pattern (covers all exponents and many mantissas) plus random ones.
  for (uint64_t bits = 0; bits < (1ull << 32); bits += 251) {
    const float value = from_bits(static_cast<uint32_t>(bits));
    if (std::isnan(value)) continue;
    ASSERT_EQ(f32_to_bf16(value), ref_f32_to_bf16(value)) << std::hex << bits;
  }
  std::mt19937 rng(1);
  for (int i = 0; i < 200000; ++i) {
    const float value = from_bits(static_cast<uint32_t>(rng()));
    if (std::isnan(value)) continue;
    ASSERT_EQ(f32_to_bf16(value), ref_f32_to_bf16(value)) << value;
  }
}

// ---------------------------------------------------------------------------------------------- e4m3

TEST(E4m3, EveryCodeDecodesAsDefined) {
  for (int code = 0; code < 256; ++code) {
    const double expected = ref_e4m3_value(static_cast<uint8_t>(code));
    const float value = e4m3_to_f32(static_cast<uint8_t>(code));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(value)) << code;
      EXPECT_TRUE(code == 0x7f || code == 0xff);
    } else {
      EXPECT_EQ(static_cast<double>(value), expected) << code;
      EXPECT_EQ(std::signbit(value), code >= 0x80) << code;  // including -0 = 0x80
    }
    EXPECT_EQ(to_bits(e4m3_value_table()[code]), to_bits(value));
  }
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // smallest normal
}

TEST(E4m3, EveryCodeRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    if (code == 0x7f || code == 0xff) continue;
    EXPECT_EQ(f32_to_e4m3(e4m3_to_f32(static_cast<uint8_t>(code))), code) << code;
  }
}

TEST(E4m3, EveryMidpointGoesToTheEvenCode) {
  // Midpoint between consecutive magnitudes c and c+1 (exact in fp32): must give the even one of the two;
  // one fp32 ulp either side must give the nearer one.
  for (int code = 0; code < 0x7e; ++code) {
    const float low = e4m3_to_f32(static_cast<uint8_t>(code));
    const float high = e4m3_to_f32(static_cast<uint8_t>(code + 1));
    const float mid = (low + high) / 2;
    ASSERT_EQ(static_cast<double>(mid), (static_cast<double>(low) + high) / 2);
    const int even = (code % 2 == 0) ? code : code + 1;
    EXPECT_EQ(f32_to_e4m3(mid), even) << code;
    EXPECT_EQ(f32_to_e4m3(-mid), 0x80 | even) << code;
    EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, 0.0f)), code) << code;
    EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, 1000.0f)), code + 1) << code;
  }
}

TEST(E4m3, SaturationNaNAndDenormals) {
  EXPECT_EQ(f32_to_e4m3(448.0f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(-448.0f), 0xfe);
  EXPECT_EQ(f32_to_e4m3(464.0f), 0x7e);  // the tie above 448 (480 is not a code in "fn")
  EXPECT_EQ(f32_to_e4m3(479.0f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(1e6f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(std::numeric_limits<float>::max()), 0x7e);
  EXPECT_EQ(f32_to_e4m3(kInf), 0x7e);
  EXPECT_EQ(f32_to_e4m3(-kInf), 0xfe);
  EXPECT_EQ(f32_to_e4m3(kNaN), 0x7f);
  EXPECT_EQ(f32_to_e4m3(-kNaN), 0x7f);
  EXPECT_EQ(f32_to_e4m3(0.0f), 0x00);
  EXPECT_EQ(f32_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(f32_to_e4m3(from_bits(1)), 0x00);           // fp32 denormal -> 0
  EXPECT_EQ(f32_to_e4m3(-from_bits(0x007fffff)), 0x80);  // largest fp32 denormal -> -0
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -10)), 0x00);   // half the smallest subnormal: tie -> 0 (even)
  EXPECT_EQ(f32_to_e4m3(std::ldexp(3.0f, -11)), 0x01);   // 0.75 of the smallest subnormal
  EXPECT_EQ(f32_to_e4m3(std::ldexp(3.0f, -10)), 0x02);   // 1.5 * 2^-9: tie between codes 1 and 2 -> 2
}

TEST(E4m3, SweepMatchesNearestEven) {
  // Every 997th fp32 bit pattern with magnitude up to 2^10 (every exponent, many mantissas), both signs, plus
  // random values.
  for (uint32_t bits = 0; bits < 0x44800000u; bits += 997) {
    const float value = from_bits(bits);
    ASSERT_EQ(f32_to_e4m3(value), ref_f32_to_e4m3(value)) << value;
    ASSERT_EQ(f32_to_e4m3(-value), ref_f32_to_e4m3(-value)) << -value;
  }
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> uniform(-500.0f, 500.0f);
  for (int i = 0; i < 100000; ++i) {
    const float value = uniform(rng);
    ASSERT_EQ(f32_to_e4m3(value), ref_f32_to_e4m3(value)) << value;
  }
}

// ---------------------------------------------------------------------------------------------- e8m0

TEST(E8m0, EveryCode) {
  for (int code = 0; code < 256; ++code) {
    const float value = e8m0_to_f32(static_cast<uint8_t>(code));
    if (code == 0xff) {
      EXPECT_TRUE(std::isnan(value));
      continue;
    }
    EXPECT_EQ(static_cast<double>(value), std::ldexp(1.0, code - 127)) << code;
    EXPECT_EQ(e8m0_from_exponent(code - 127), code);
  }
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(0), std::ldexp(1.0f, -127));  // fp32 subnormal, still exact
  EXPECT_EQ(e8m0_to_f32(254), std::ldexp(1.0f, 127));
}

// ---------------------------------------------------------------------------------------------- e2m1

TEST(E2m1, EveryCode) {
  for (int code = 0; code < 16; ++code) {
    const float value = e2m1_to_f32(static_cast<uint8_t>(code));
    EXPECT_EQ(static_cast<double>(value), ref_e2m1_value(static_cast<uint8_t>(code))) << code;
    EXPECT_EQ(std::signbit(value), code >= 8);
    EXPECT_EQ(f32_to_e2m1(value), code) << code;  // round trip, -0 -> 8
    EXPECT_EQ(to_bits(e2m1_value_table()[code]), to_bits(value));
  }
}

TEST(E2m1, TiesAndSaturation) {
  // spec §4.9: ties at 0.25, 1.25, 2.5, 5 go down; 0.75, 1.75, 3.5 go up (to the even code).
  EXPECT_EQ(f32_to_e2m1(0.25f), 0);
  EXPECT_EQ(f32_to_e2m1(0.75f), 2);
  EXPECT_EQ(f32_to_e2m1(1.25f), 2);
  EXPECT_EQ(f32_to_e2m1(1.75f), 4);
  EXPECT_EQ(f32_to_e2m1(2.5f), 4);
  EXPECT_EQ(f32_to_e2m1(3.5f), 6);
  EXPECT_EQ(f32_to_e2m1(5.0f), 6);
  EXPECT_EQ(f32_to_e2m1(-0.25f), 8);
  EXPECT_EQ(f32_to_e2m1(-5.0f), 14);
  EXPECT_EQ(f32_to_e2m1(std::nextafter(0.25f, 1.0f)), 1);
  EXPECT_EQ(f32_to_e2m1(std::nextafter(5.0f, 6.0f)), 7);
  EXPECT_EQ(f32_to_e2m1(6.0f), 7);
  EXPECT_EQ(f32_to_e2m1(100.0f), 7);
  EXPECT_EQ(f32_to_e2m1(-kInf), 15);
  EXPECT_EQ(f32_to_e2m1(kNaN), 7);
  EXPECT_EQ(f32_to_e2m1(-1e-30f), 8);
}

TEST(E2m1, SweepMatchesNearestEven) {
  for (uint32_t bits = 0; bits < 0x41000000u; bits += 13) {  // magnitudes up to 8
    const float value = from_bits(bits);
    ASSERT_EQ(f32_to_e2m1(value), ref_f32_to_e2m1(value)) << value;
    ASSERT_EQ(f32_to_e2m1(-value), ref_f32_to_e2m1(-value)) << -value;
  }
}

}  // namespace
}  // namespace dsflash
