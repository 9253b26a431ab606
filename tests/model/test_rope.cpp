// RoPE tables (spec/MODEL.md §4.6): base and YaRN per layer kind, the YaRN band of the released config, and
// rotation / inverse rotation.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "formats/formats.h"
#include "model/rope.h"

namespace dsflash {
namespace {

TEST(Rope, YarnBandOfTheReleasedConfig) {
  // base 160000, original 65536, factor 16, beta 32/1: pairs i <= 15 keep their frequency, i >= 25 are /16.
  const Rope yarn(64, 160000.0, 65536, 16.0, 32, 1);
  const Rope plain(64, 160000.0, 0, 16.0, 32, 1);
  ASSERT_EQ(yarn.frequencies().size(), 32u);
  for (int i = 0; i <= 15; ++i) EXPECT_EQ(yarn.frequencies()[static_cast<size_t>(i)], plain.frequencies()[static_cast<size_t>(i)]) << i;
  for (int i = 25; i < 32; ++i) {
    EXPECT_FLOAT_EQ(yarn.frequencies()[static_cast<size_t>(i)], plain.frequencies()[static_cast<size_t>(i)] / 16.0f) << i;
  }
  for (int i = 16; i < 25; ++i) {
    EXPECT_LT(yarn.frequencies()[static_cast<size_t>(i)], plain.frequencies()[static_cast<size_t>(i)]) << i;
    EXPECT_GT(yarn.frequencies()[static_cast<size_t>(i)], plain.frequencies()[static_cast<size_t>(i)] / 16.0f) << i;
  }
  EXPECT_FLOAT_EQ(plain.frequencies()[1], static_cast<float>(std::pow(160000.0, -2.0 / 64.0)));
}

TEST(Rope, LayerKinds) {
  ModelConfig c;
  c.rope_head_dim = 64;
  c.compress_ratios = {0, 2, 1};
  c.compress_rope_theta = 160000.0;
  c.rope_theta = 10000.0;
  c.original_seq_len = 65536;
  c.rope_factor = 16;
  const Rope window_only = Rope::for_layer(c, 0);
  EXPECT_EQ(window_only.frequencies(), Rope(64, 10000.0, 0, 16.0, 32, 1).frequencies());
  EXPECT_EQ(Rope::for_layer(c, 1).frequencies(), Rope(64, 160000.0, 65536, 16.0, 32, 1).frequencies());
  EXPECT_EQ(Rope::for_layer(c, 2).frequencies(), Rope::for_layer(c, 1).frequencies());  // ratio 1 too
}

TEST(Rope, RotationAndInverse) {
  const Rope rope(64, 160000.0, 65536, 16.0, 32, 1);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> x(64);
  for (float& v : x) v = round_to_bf16(normal(rng));
  std::vector<float> y = x;
  rope.rotate(y.data(), 0);
  EXPECT_EQ(y, x);  // position 0: identity
  y = x;
  rope.rotate(y.data(), 12345);
  for (float v : y) EXPECT_EQ(v, round_to_bf16(v));
  // pair 0 has frequency 1: angle = position
  const float c = std::cos(12345.0f), s = std::sin(12345.0f);
  EXPECT_EQ(y[0], round_to_bf16(x[0] * c - x[1] * s));
  rope.rotate(y.data(), 12345, true);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], std::fabs(x[i]) * 0.02 + 1e-3) << i;
}

}  // namespace
}  // namespace dsflash
