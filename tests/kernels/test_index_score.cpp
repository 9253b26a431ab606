// Indexer dot products across keys (src/kernels/index_score.h): every lane equals the scalar in-order dot
// product bit for bit (head counts around the 4-head step, ragged key groups, dims with and without a
// multiple of 8), zero lanes past the keys, a product whose rounding an fma would skip; the 16-key head
// weighting twins against the scalar formula.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "formats/formats.h"
#include "kernels/index_score.h"
#include "test_backend_util.h"

namespace dsflash {
namespace {

using test::same_bits;

TEST(IndexScore, PackTransposesAndZeroPads) {
  const int64_t dim = 5, keys = 3;
  std::vector<float> k(static_cast<size_t>(keys * dim));
  for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<float>(i + 1);
  std::vector<float> packed(static_cast<size_t>(dim * kIndexKeyLanes), -1.0f);
  pack_index_keys(k.data(), keys, dim, packed.data());
  for (int64_t d = 0; d < dim; ++d) {
    for (int l = 0; l < kIndexKeyLanes; ++l) {
      const float want = l < keys ? k[static_cast<size_t>(l * dim + d)] : 0.0f;
      EXPECT_EQ(packed[static_cast<size_t>(d * kIndexKeyLanes + l)], want) << d << " " << l;
    }
  }
}

TEST(IndexScore, DotsAreTheInOrderDotBitForBit) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> wide(-30.0f, 30.0f);
  for (int heads : {1, 3, 4, 5, 8, 13}) {
    for (int64_t dim : {1, 7, 32, 64, 128}) {
      for (int64_t keys : {1, 9, 16}) {
        // MXFP4-like queries (bf16 values) and keys with a wide exponent range, so the summation order and
        // any fused rounding would show.
        std::vector<float> q(static_cast<size_t>(heads * dim)), k(static_cast<size_t>(keys * dim));
        for (float& v : q) v = round_to_bf16(normal(rng) * std::exp2(std::round(wide(rng) / 6.0f)));
        for (float& v : k) v = normal(rng) * std::exp2(std::round(wide(rng) / 6.0f));
        std::vector<float> packed(static_cast<size_t>(dim * kIndexKeyLanes));
        pack_index_keys(k.data(), keys, dim, packed.data());
        std::vector<float> dots(static_cast<size_t>(heads * kIndexKeyLanes), -1.0f);
        index_dots16(packed.data(), q.data(), heads, dim, dots.data());
        int bad = 0;
        for (int h = 0; h < heads; ++h) {
          for (int l = 0; l < kIndexKeyLanes; ++l) {
            const float got = dots[static_cast<size_t>(h * kIndexKeyLanes + l)];
            const float want = l < keys ? dot_in_order(&q[static_cast<size_t>(h * dim)], &k[static_cast<size_t>(l * dim)], dim)
                                        : 0.0f;
            if (!same_bits(got, want) && ++bad < 5) {
              ADD_FAILURE() << "heads " << heads << " dim " << dim << " keys " << keys << " h " << h << " lane " << l
                            << ": " << got << " vs " << want;
            }
          }
        }
        EXPECT_EQ(bad, 0);
      }
    }
  }
}

TEST(IndexScore, ProductsAreRoundedBeforeTheAdd) {
  // (1 + 2^-12)^2 = 1 + 2^-11 + 2^-24 rounds to 1 + 2^-11 in fp32 (a tie, to even), so after a first term of
  // -(1 + 2^-11) the rounded product leaves exactly 0; an fma would keep 2^-24.
  const int64_t dim = 2;
  const float eps = std::ldexp(1.0f, -12);
  std::vector<float> q = {1.0f, 1.0f + eps, 1.0f, 1.0f + eps};
  std::vector<float> k = {-(1.0f + 2.0f * eps), 1.0f + eps};
  std::vector<float> packed(static_cast<size_t>(dim * kIndexKeyLanes));
  pack_index_keys(k.data(), 1, dim, packed.data());
  std::vector<float> dots(static_cast<size_t>(2 * kIndexKeyLanes));
  index_dots16(packed.data(), q.data(), 2, dim, dots.data());
  EXPECT_EQ(dot_in_order(q.data(), k.data(), dim), 0.0f);
  EXPECT_EQ(dots[0], 0.0f);
  EXPECT_EQ(dots[kIndexKeyLanes], 0.0f);
}

// The head weighting of 16 keys (weigh_heads16_*): the vector twins equal the scalar formula bit for bit. Dots and
// weights are drawn from values that stress each step: bf16 rounding ties and carries into infinity, -0.0 and NaN
// through relu, subnormals (which vcvtneps2bf16 would flush), infinities whose products and sums give NaN, and
// head counts around the cascade's 16-value level and its folds (256, 4096).
TEST(IndexScore, WeighHeads16TwinsAreTheScalarFormula) {
  std::vector<std::pair<const char*, WeighHeads16Kernel>> twins{{"avx2", weigh_heads16_avx2}};
  if (WeighHeads16Kernel k = weigh_heads16_avx512()) twins.emplace_back("avx512", k);
  const float tie = 1.0f + std::ldexp(1.0f, -8);           // halfway between two bf16 values: rounds to even
  const float odd_tie = 1.0f + 3.0f * std::ldexp(1.0f, -8);  // the other tie: rounds up
  const float palette[] = {0.0f,  -0.0f, tie,     -tie,    odd_tie, 3.4e38f, -3.4e38f, 1e-40f, -1e-40f, 1e-45f,
                           INFINITY, -INFINITY, NAN, 1.0f,  -2.5f,   0.3f};
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int heads : {1, 2, 3, 15, 16, 17, 31, 32, 33, 64, 100, 255, 256, 257, 300, 4097}) {
    for (int trial = 0; trial < 4; ++trial) {
      std::vector<float> dots(static_cast<size_t>(heads * kIndexKeyLanes)), w(static_cast<size_t>(heads));
      const bool extremes = trial >= 2;
      for (float& v : dots) v = extremes && rng() % 4 == 0 ? palette[rng() % std::size(palette)] : normal(rng) * 4.0f;
      for (float& v : w) v = extremes && rng() % 8 == 0 ? palette[rng() % std::size(palette)] : round_to_bf16(normal(rng));
      float want[kIndexKeyLanes];
      weigh_heads16_reference(dots.data(), w.data(), heads, want);
      for (const auto& [name, twin] : twins) {
        float got[kIndexKeyLanes];
        twin(dots.data(), w.data(), heads, got);
        for (int l = 0; l < kIndexKeyLanes; ++l) {
          if (std::isnan(want[l]) && std::isnan(got[l])) continue;  // NaN payloads are unspecified
          EXPECT_TRUE(same_bits(want[l], got[l])) << name << " heads " << heads << " trial " << trial << " lane " << l
                                                  << ": " << got[l] << " vs " << want[l];
        }
      }
    }
  }
}

// weigh_heads16_finite_avx512 on what it is for: finite dots (subnormal, huge, ties, signed zeros) and bf16-valued
// weights including NaN, +-inf, 0 and huge ones, so that products overflow (inf * 0 and inf - inf make NaNs): the
// scalar formula's bits, NaN for NaN.
TEST(IndexScore, WeighHeads16FiniteIsTheScalarFormulaOnFiniteDotsAndBf16Weights) {
  const WeighHeads16Kernel finite = weigh_heads16_finite_avx512();
  if (finite == nullptr) GTEST_SKIP() << "no AVX-512 F";
  const float tie = 1.0f + std::ldexp(1.0f, -8);
  const float dot_palette[] = {0.0f, -0.0f, tie, -tie, 3.4e38f, -3.4e38f, 1e-40f, -1e-40f, 1e-45f, 1.0f, -2.5f, 0.3f};
  const float w_palette[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 3.0e38f, -3.0e38f, 1.0f, -0.5f};
  std::mt19937 rng(6);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  int nan_scores = 0;
  for (int heads : {1, 16, 17, 32, 33, 64, 257}) {
    for (int trial = 0; trial < 8; ++trial) {
      std::vector<float> dots(static_cast<size_t>(heads * kIndexKeyLanes)), w(static_cast<size_t>(heads));
      for (float& v : dots) v = rng() % 3 == 0 ? dot_palette[rng() % std::size(dot_palette)] : normal(rng) * 4.0f;
      for (float& v : w) v = round_to_bf16(rng() % 6 == 0 ? w_palette[rng() % std::size(w_palette)] : normal(rng));
      float want[kIndexKeyLanes], got[kIndexKeyLanes];
      weigh_heads16_reference(dots.data(), w.data(), heads, want);
      finite(dots.data(), w.data(), heads, got);
      for (int l = 0; l < kIndexKeyLanes; ++l) {
        nan_scores += std::isnan(want[l]);
        if (std::isnan(want[l]) && std::isnan(got[l])) continue;  // NaN payloads are unspecified
        EXPECT_TRUE(same_bits(want[l], got[l])) << "heads " << heads << " trial " << trial << " lane " << l << ": "
                                                << got[l] << " vs " << want[l];
      }
    }
  }
  EXPECT_GT(nan_scores, 0) << "no NaN score: the NaN cases went untested";
}

TEST(IndexScore, WeighHeads16KeepsSignedZeroAndRoundsTies) {
  // relu(-0.0) stays -0.0 (std::max(-0.0f, 0.0f) is -0.0f), so -0.0 * w > 0 is -0.0, and a sum of only -0.0 terms
  // from 0.0 is +0.0; a tie rounds to even.
  const int heads = 2;
  std::vector<float> dots(static_cast<size_t>(heads * kIndexKeyLanes), -0.0f);
  dots[1] = 1.0f + std::ldexp(1.0f, -8);  // head 0, lane 1: a tie, rounds down to 1.0
  const std::vector<float> w = {1.0f, 2.0f};
  std::vector<std::pair<const char*, WeighHeads16Kernel>> all{{"reference", weigh_heads16_reference},
                                                             {"avx2", weigh_heads16_avx2}};
  if (WeighHeads16Kernel k = weigh_heads16_avx512()) all.emplace_back("avx512", k);
  for (const auto& [name, kernel] : all) {
    float out[kIndexKeyLanes];
    kernel(dots.data(), w.data(), heads, out);
    EXPECT_TRUE(same_bits(out[0], 0.0f)) << name << ": " << out[0];
    EXPECT_EQ(out[1], 1.0f) << name;
  }
}

}  // namespace
}  // namespace dsflash
