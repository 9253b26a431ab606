// Block quantisers against the plain statements of the official rules (reference_rules.h): random blocks of
// every magnitude, edges (zeros, denormals, ±448, huge, NaN), ties of the scale and of the codes, packing,
// dequantisation and fake quantisation.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "formats/formats.h"
#include "formats/quant.h"
#include "formats/reference_rules.h"

namespace dsflash {
namespace {

using test::ref_act_quant;
using test::ref_fp4_e4m3;
using test::ref_fp4_ue8m0;

using test::kInf;
using test::kNaN;

std::vector<uint8_t> unpack(const std::vector<uint8_t>& packed, size_t n) {
  std::vector<uint8_t> codes(n);
  for (size_t i = 0; i < n; ++i) codes[i] = (i & 1) ? packed[i / 2] >> 4 : packed[i / 2] & 0xf;
  return codes;
}

struct Quantised {
  std::vector<uint8_t> codes;  // unpacked for fp4
  std::vector<uint8_t> packed;
  std::vector<uint8_t> scales;
};

Quantised run_act(const std::vector<float>& x) {
  Quantised q;
  q.codes.resize(x.size());
  q.scales.resize((x.size() + 31) / 32);
  act_quant_block32(x.data(), static_cast<int64_t>(x.size()), q.codes.data(), q.scales.data());
  return q;
}

Quantised run_fp4_ue8m0(const std::vector<float>& x) {
  Quantised q;
  q.packed.assign((x.size() + 1) / 2, 0xAA);  // garbage: every nibble must be written
  q.scales.resize((x.size() + 31) / 32);
  fp4_quant_ue8m0_block32(x.data(), static_cast<int64_t>(x.size()), q.packed.data(), q.scales.data());
  q.codes = unpack(q.packed, x.size());
  return q;
}

Quantised run_fp4_e4m3(const std::vector<float>& x) {
  Quantised q;
  q.packed.assign((x.size() + 1) / 2, 0xAA);
  q.scales.resize((x.size() + 15) / 16);
  fp4_quant_e4m3_block16(x.data(), static_cast<int64_t>(x.size()), q.packed.data(), q.scales.data());
  q.codes = unpack(q.packed, x.size());
  return q;
}

// Random block contents: bf16-representable values (what activations are) or arbitrary fp32, with a block-wide
// magnitude drawn log-uniformly over a wide range so that every scale exponent is exercised.
std::vector<float> random_input(std::mt19937& rng, size_t n, int block, bool bf16_values) {
  std::vector<float> x(n);
  std::uniform_int_distribution<int> exponent(-40, 40);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> kind(0, 9);
  for (size_t begin = 0; begin < n; begin += block) {
    const float magnitude = std::ldexp(1.0f, exponent(rng));
    const int block_kind = kind(rng);
    for (size_t i = begin; i < std::min(n, begin + block); ++i) {
      float value = normal(rng) * magnitude;
      if (block_kind == 0) value = 0.0f;                           // all-zero block
      if (block_kind == 1 && (i % 3) == 0) value = 0.0f;           // sparse block
      if (block_kind == 2) value = std::ldexp(normal(rng), -130);  // fp32 denormals
      x[i] = bf16_values ? round_to_bf16(value) : value;
    }
  }
  return x;
}

void expect_same(const test::RefBlocks& expected, const Quantised& actual, const std::vector<float>& x, int block) {
  ASSERT_EQ(expected.scales.size(), actual.scales.size());
  for (size_t b = 0; b < expected.scales.size(); ++b) {
    ASSERT_EQ(expected.scales[b], actual.scales[b]) << "block " << b << " first value " << x[b * block];
  }
  ASSERT_EQ(expected.codes.size(), actual.codes.size());
  for (size_t i = 0; i < expected.codes.size(); ++i) {
    ASSERT_EQ(expected.codes[i], actual.codes[i]) << "element " << i << " value " << x[i];
  }
}

TEST(ActQuant, RandomBlocksMatchTheOfficialRule) {
  std::mt19937 rng(3);
  for (int round = 0; round < 200; ++round) {
    const auto x = random_input(rng, 32 * 64, 32, round % 2 == 0);
    expect_same(ref_act_quant(x), run_act(x), x, 32);
  }
}

TEST(Fp4Ue8m0, RandomBlocksMatchTheOfficialRule) {
  std::mt19937 rng(4);
  for (int round = 0; round < 200; ++round) {
    const auto x = random_input(rng, 32 * 64, 32, round % 2 == 0);
    expect_same(ref_fp4_ue8m0(x), run_fp4_ue8m0(x), x, 32);
  }
}

TEST(Fp4E4m3, RandomBlocksMatchTheOfficialRule) {
  std::mt19937 rng(5);
  for (int round = 0; round < 200; ++round) {
    const auto x = random_input(rng, 16 * 128, 16, round % 2 == 0);
    expect_same(ref_fp4_e4m3(x), run_fp4_e4m3(x), x, 16);
  }
}

TEST(ActQuant, ScaleIsTheSmallestPowerOfTwoThatFits) {
  // amax = 448 * 2^k exactly: scale 2^k and the largest element becomes code 0x7e (no extra halving).
  for (int k = -20; k <= 20; ++k) {
    std::vector<float> x(32, 0.0f);
    x[5] = std::ldexp(448.0f, k);
    x[6] = -std::ldexp(1.0f, k);
    const Quantised q = run_act(x);
    EXPECT_EQ(q.scales[0], 127 + k) << k;
    EXPECT_EQ(q.codes[5], 0x7e);
    EXPECT_EQ(q.codes[6], 0xb8);  // -1.0
    // One ulp above: the next power of two.
    x[5] = std::nextafter(std::ldexp(448.0f, k), kInf);
    EXPECT_EQ(run_act(x).scales[0], 128 + k) << k;
  }
}

TEST(ActQuant, MultiplyByInverseEqualsDivisionForEveryNormalAmax) {
  // The official kernel computes amax * (1/448) and amax * (1/6); the spec states amax / 448. From the fp4
  // floor 6*2^-126 (ratio 2^-126, the smallest normal) for 1/6, and from 2^-117 (ratio normal; act_quant's floor
  // 1e-4 is far above) for 1/448, both give the same ceil(log2), so either reading of the rule is the same rule.
  // Every 7th bit pattern.
  int64_t mismatches = 0;
  const uint32_t fp4_floor_bits = std::bit_cast<uint32_t>(6.0f * 0x1p-126f);
  for (uint32_t bits = fp4_floor_bits; bits < 0x7f800000u; bits += 7) {
    const float amax = std::bit_cast<float>(bits);
    mismatches += test::ref_ceil_log2(amax * (1.0f / 6.0f)) != test::ref_ceil_log2(amax / 6.0f);
    if (bits >= 0x05000000u) {
      mismatches += test::ref_ceil_log2(amax * (1.0f / 448.0f)) != test::ref_ceil_log2(amax / 448.0f);
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(ActQuant, Edges) {
  std::vector<float> x(96, 0.0f);
  // Block 0: zeros -> amax floor 1e-4 -> scale 2^ceil(log2(1e-4/448)) = 2^-22, codes 0 (and -0 keeps its sign).
  x[1] = -0.0f;
  // Block 1: ±448, a denormal and a huge value.
  x[32] = 448.0f;
  x[33] = -448.0f;
  x[34] = std::bit_cast<float>(1u);
  // Block 2: huge values.
  x[64] = 3e38f;
  x[65] = -1e38f;
  const Quantised q = run_act(x);
  EXPECT_EQ(q.scales[0], 127 - 22);
  EXPECT_EQ(q.codes[0], 0x00);
  EXPECT_EQ(q.codes[1], 0x80);
  EXPECT_EQ(q.scales[1], 127);
  EXPECT_EQ(q.codes[32], 0x7e);
  EXPECT_EQ(q.codes[33], 0xfe);
  EXPECT_EQ(q.codes[34], 0x00);
  EXPECT_EQ(q.scales[2], test::ref_ceil_log2(3e38f * (1.0f / 448.0f)) + 127);
  expect_same(ref_act_quant(x), q, x, 32);
}

TEST(Quantisers, NaNOrInfinityPoisonsOnlyItsBlock) {
  for (float bad : {kNaN, kInf, -kInf}) {
    std::vector<float> x(64, 0.75f);
    x[40] = bad;
    const Quantised act = run_act(x);
    EXPECT_EQ(act.scales[0], 127 - 9);  // 0.75 / 448 -> 2^-9, 0.75 = 384 * 2^-9 exactly
    EXPECT_EQ(act.scales[1], 0xff);
    std::vector<float> out(64);
    dequant_e4m3_ue8m0(act.codes.data(), act.scales.data(), 64, 32, out.data());
    EXPECT_EQ(out[0], 0.75f);
    for (int i = 32; i < 64; ++i) EXPECT_TRUE(std::isnan(out[i])) << i;

    const Quantised fp4 = run_fp4_ue8m0(x);
    EXPECT_EQ(fp4.scales[1], 0xff);
    dequant_e2m1_ue8m0(fp4.packed.data(), fp4.scales.data(), 64, 32, out.data());
    EXPECT_EQ(out[0], 0.75f);
    for (int i = 32; i < 64; ++i) EXPECT_TRUE(std::isnan(out[i])) << i;

    const Quantised kv = run_fp4_e4m3(x);
    EXPECT_EQ(kv.scales[2], 0x7f);
    dequant_e2m1_e4m3(kv.packed.data(), kv.scales.data(), 64, 16, out.data());
    EXPECT_EQ(out[0], 0.75f);
    for (int i = 32; i < 48; ++i) EXPECT_TRUE(std::isnan(out[i])) << i;
    for (int i = 48; i < 64; ++i) EXPECT_EQ(out[i], 0.75f) << i;

    std::vector<float> fake = x;
    fake_quant_act_block32(fake.data(), 64);
    EXPECT_EQ(fake[0], 0.75f);
    EXPECT_TRUE(std::isnan(fake[33]));
  }
}

TEST(Fp4Ue8m0, TiesAndFloor) {
  // amax 6 -> scale 1; ties on the e2m1 grid go to the even code.
  std::vector<float> x = {6.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, -0.25f, -5.0f, 0.0f, -0.0f};
  x.resize(32, 0.0f);
  Quantised q = run_fp4_ue8m0(x);
  EXPECT_EQ(q.scales[0], 127);
  const std::vector<uint8_t> expected = {7, 0, 2, 2, 4, 4, 6, 6, 8, 14, 0, 8};
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(q.codes[i], expected[i]) << i;
  // Packing: low nibble = even index.
  EXPECT_EQ(q.packed[0], 0x07);
  EXPECT_EQ(q.packed[1], 0x22);
  // A block of zeros takes the floor 6*2^-126 -> scale 2^-126 (code 1).
  std::vector<float> zeros(32, 0.0f);
  EXPECT_EQ(run_fp4_ue8m0(zeros).scales[0], 1);
  // amax just above 6 * 2^k -> 2^(k+1).
  x[0] = std::nextafter(6.0f, 7.0f);
  EXPECT_EQ(run_fp4_ue8m0(x).scales[0], 128);
}

TEST(Fp4E4m3, ScaleRoundingAndFloor) {
  // amax/6 = 1.0625 is the tie between e4m3 1.0 (code 0x38, even) and 1.125 (0x39): scale 1.0, and the
  // block's largest value 6.375 then clamps to 6.
  std::vector<float> x(16, 0.0f);
  x[0] = 6.375f;
  x[1] = -3.0f;
  Quantised q = run_fp4_e4m3(x);
  EXPECT_EQ(q.scales[0], 0x38);
  EXPECT_EQ(q.codes[0], 7);
  EXPECT_EQ(q.codes[1], 13);
  // Just above the tie -> 1.125; 6.375 / 1.125 = 5.666.. -> 6 (code 7); -3 / 1.125 = -2.666.. -> -3 (code 13).
  x[0] = std::nextafter(6.375f, 7.0f);
  q = run_fp4_e4m3(x);
  EXPECT_EQ(q.scales[0], 0x39);
  EXPECT_EQ(q.codes[1], 13);
  // Floor: zeros -> scale e4m3(2^-9) = code 1 (the smallest subnormal).
  std::vector<float> zeros(16, 0.0f);
  EXPECT_EQ(run_fp4_e4m3(zeros).scales[0], 0x01);
  // Huge: amax/6 beyond 448 saturates the scale at 448 (CUDA satfinite), values clamp to ±6.
  x[0] = 1e6f;
  q = run_fp4_e4m3(x);
  EXPECT_EQ(q.scales[0], 0x7e);
  EXPECT_EQ(q.codes[0], 7);
}

TEST(Dequant, ExactProductsAndFakeQuantAgree) {
  std::mt19937 rng(6);
  const size_t n = 32 * 40;
  const auto x = random_input(rng, n, 32, true);
  std::vector<float> out(n), fake(x);

  const Quantised act = run_act(x);
  dequant_e4m3_ue8m0(act.codes.data(), act.scales.data(), static_cast<int64_t>(n), 32, out.data());
  fake_quant_act_block32(fake.data(), static_cast<int64_t>(n));
  for (size_t i = 0; i < n; ++i) {
    const double expected = test::ref_e4m3_value(act.codes[i]) * std::ldexp(1.0, act.scales[i / 32] - 127);
    ASSERT_EQ(static_cast<double>(out[i]), expected) << i;
    ASSERT_EQ(fake[i], out[i]) << i;
    ASSERT_EQ(round_to_bf16(out[i]), out[i]) << i;
  }

  fake = x;
  const Quantised fp4 = run_fp4_ue8m0(x);
  dequant_e2m1_ue8m0(fp4.packed.data(), fp4.scales.data(), static_cast<int64_t>(n), 32, out.data());
  fake_quant_fp4_ue8m0_block32(fake.data(), static_cast<int64_t>(n));
  for (size_t i = 0; i < n; ++i) {
    const double expected = test::ref_e2m1_value(fp4.codes[i]) * std::ldexp(1.0, fp4.scales[i / 32] - 127);
    ASSERT_EQ(static_cast<double>(out[i]), expected) << i;
    ASSERT_EQ(fake[i], out[i]) << i;
  }

  fake = x;
  const Quantised kv = run_fp4_e4m3(x);
  dequant_e2m1_e4m3(kv.packed.data(), kv.scales.data(), static_cast<int64_t>(n), 16, out.data());
  fake_quant_fp4_e4m3_block16(fake.data(), static_cast<int64_t>(n));
  for (size_t i = 0; i < n; ++i) {
    const double expected = test::ref_e2m1_value(kv.codes[i]) * test::ref_e4m3_value(kv.scales[i / 16]);
    ASSERT_EQ(static_cast<double>(out[i]), expected) << i;
    ASSERT_EQ(fake[i], out[i]) << i;
  }
}

TEST(FakeQuant, IdempotentOnRandomData) {
  std::mt19937 rng(7);
  const size_t n = 32 * 200;
  auto x = random_input(rng, n, 32, true);
  for (auto fake : {fake_quant_act_block32, fake_quant_fp4_ue8m0_block32}) {
    std::vector<float> once(x);
    fake(once.data(), static_cast<int64_t>(n));
    std::vector<float> twice(once);
    fake(twice.data(), static_cast<int64_t>(n));
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(std::bit_cast<uint32_t>(once[i]), std::bit_cast<uint32_t>(twice[i])) << i;
  }
}

TEST(Quantisers, ShortFinalBlockIsItsOwnBlock) {
  std::vector<float> x(40);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) - 20.0f;
  expect_same(ref_act_quant(x), run_act(x), x, 32);
  expect_same(ref_fp4_ue8m0(x), run_fp4_ue8m0(x), x, 32);
  std::vector<float> odd(21, 1.5f);
  const Quantised q = run_fp4_e4m3(odd);
  expect_same(ref_fp4_e4m3(odd), q, odd, 16);
  EXPECT_EQ(q.packed.back() >> 4, 0);  // unused high nibble of the odd tail
}

}  // namespace
}  // namespace dsflash

namespace dsflash {
namespace {

TEST(Ue8m0ScaleCode, SameRuleAsTheBlockQuantisers) {
  // The 2-D weight tiles use the same rule as act_quant: compare on random amax values and at the edges.
  std::mt19937 rng(8);
  std::uniform_int_distribution<int> exponent(-60, 60);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  for (int i = 0; i < 10000; ++i) {
    const float amax = std::ldexp(mantissa(rng), exponent(rng));
    std::vector<float> block(32, 0.0f);
    block[3] = -amax;
    EXPECT_EQ(ue8m0_scale_code(amax, 448.0f, 1e-4f), run_act(block).scales[0]) << amax;
    EXPECT_EQ(ue8m0_scale_code(amax, 6.0f, 6.0f * 0x1p-126f), run_fp4_ue8m0(block).scales[0]) << amax;
  }
  EXPECT_EQ(ue8m0_scale_code(448.0f, 448.0f, 1e-4f), 127);
  EXPECT_EQ(ue8m0_scale_code(0.0f, 448.0f, 1e-4f), 127 - 22);
  EXPECT_EQ(ue8m0_scale_code(kNaN, 448.0f, 1e-4f), 0xff);
  EXPECT_EQ(ue8m0_scale_code(kInf, 448.0f, 1e-4f), 0xff);
}

// The FP4 dequantisers take each byte's two codes at once and decode a block's scale once: every element must
// still be its code's value times its block's scale, for odd block sizes (blocks starting on a high nibble) and
// ragged lengths too.
TEST(Dequant, Fp4RowsEqualTheElementwiseDefinition) {
  std::mt19937 rng(31);
  for (const int block : {1, 3, 5, 16, 32})
    for (const int64_t n : {1, 2, 7, 16, 33, 64, 513}) {
      std::vector<uint8_t> packed(static_cast<size_t>((n + 1) / 2)), scales(static_cast<size_t>((n + block - 1) / block));
      for (auto& b : packed) b = static_cast<uint8_t>(rng());
      for (auto& b : scales) b = static_cast<uint8_t>(rng() % 0x7f);  // finite e4m3 / ue8m0 codes
      std::vector<float> e4m3(static_cast<size_t>(n)), ue8m0(static_cast<size_t>(n));
      dequant_e2m1_e4m3(packed.data(), scales.data(), n, block, e4m3.data());
      dequant_e2m1_ue8m0(packed.data(), scales.data(), n, block, ue8m0.data());
      for (int64_t i = 0; i < n; ++i) {
        const uint8_t byte = packed[static_cast<size_t>(i / 2)];
        const float value = e2m1_to_f32(i % 2 == 0 ? byte & 0xf : byte >> 4);
        const uint8_t scale = scales[static_cast<size_t>(i / block)];
        ASSERT_EQ(e4m3[static_cast<size_t>(i)], value * e4m3_to_f32(scale)) << "block " << block << " n " << n << " at " << i;
        ASSERT_EQ(ue8m0[static_cast<size_t>(i)], value * e8m0_to_f32(scale)) << "block " << block << " n " << n << " at " << i;
      }
    }
}

}  // namespace
}  // namespace dsflash
