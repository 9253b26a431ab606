// Indexer dot products across keys (src/kernels/index_score.h): every lane equals the scalar in-order dot
// product bit for bit (head counts around the 4-head step, ragged key groups, dims with and without a
// multiple of 8), zero lanes past the keys, and a product whose rounding an fma would skip.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "formats/formats.h"
#include "kernels/index_score.h"

namespace dsflash {
namespace {

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

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

}  // namespace
}  // namespace dsflash
