// RMSNorm and the reference-order row sums (kernels/rmsnorm.h, kernels/reduce.h). The golden check of
// RMSNorm (attn_in / ffn_in bit for bit) is in test_hc.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "formats/formats.h"
#include "kernels/reduce.h"
#include "kernels/rmsnorm.h"

namespace dsflash {
namespace {

TEST(CascadeSum, ExactOnIntegersForEveryLengthAndWidth) {
  for (int width : {8, 16}) {
    for (int n = 0; n < 700; n += 7) {
      std::vector<float> x(static_cast<size_t>(n));
      double expect = 0;
      for (int i = 0; i < n; ++i) {
        x[static_cast<size_t>(i)] = static_cast<float>((i * 37) % 11) - 5.0f;
        expect += x[static_cast<size_t>(i)];
      }
      EXPECT_EQ(cascade_sum(x.data(), n, width), static_cast<float>(expect)) << "n=" << n << " width=" << width;
    }
  }
}

TEST(CascadeSum, OrderDiffersFromSequentialButStaysClose) {
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(20480);
  for (auto& v : x) v = dist(rng);
  float sequential = 0.0f;
  double exact = 0.0;
  for (float v : x) {
    sequential += v * v;
    exact += static_cast<double>(v) * v;
  }
  const float cascade = cascade_sum_squares(x.data(), static_cast<int64_t>(x.size()));
  EXPECT_NEAR(cascade, exact, 1e-5 * exact);
  // The cascade is more accurate than one long fp32 chain.
  EXPECT_LE(std::fabs(cascade - exact), std::fabs(sequential - exact) + 1e-3);
}

TEST(RmsNorm, MatchesDoublePrecisionFormulaWithinBf16Rounding) {
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  const int64_t rows = 3, dim = 160;
  std::vector<float> x(static_cast<size_t>(rows * dim));
  std::vector<uint16_t> w(static_cast<size_t>(dim));
  for (auto& v : x) v = round_to_bf16(dist(rng));
  for (auto& v : w) v = f32_to_bf16(1.0f + 0.1f * dist(rng));
  std::vector<float> out(x.size());
  rmsnorm_bf16(x.data(), rows, dim, w.data(), 1e-20f, out.data());
  for (int64_t r = 0; r < rows; ++r) {
    double ms = 0;
    for (int64_t i = 0; i < dim; ++i) ms += static_cast<double>(x[static_cast<size_t>(r * dim + i)]) * x[static_cast<size_t>(r * dim + i)];
    const double inv = 1.0 / std::sqrt(ms / dim);
    for (int64_t i = 0; i < dim; ++i) {
      const size_t k = static_cast<size_t>(r * dim + i);
      const double expect = bf16_to_f32(w[static_cast<size_t>(i)]) * x[k] * inv;
      EXPECT_NEAR(out[k], expect, std::fabs(expect) * 0.0079 + 1e-6);
      EXPECT_EQ(out[k], round_to_bf16(out[k]));  // one rounding to bf16
    }
  }
}

TEST(RmsNorm, ZeroRowStaysFinite) {
  std::vector<float> x(64, 0.0f), out(64, 1.0f);
  std::vector<uint16_t> w(64, f32_to_bf16(1.0f));
  rmsnorm_bf16(x.data(), 1, 64, w.data(), 1e-20f, out.data());
  for (float v : out) EXPECT_EQ(v, 0.0f);
}

}  // namespace
}  // namespace dsflash
