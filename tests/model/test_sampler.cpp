// Sampler policy: greedy = argmax (ties to the lowest id), top-k / top-p restrict the support, seeded draws are
// reproducible, and the empirical distribution follows softmax(logits / temperature).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "model/model_runner.h"
#include "model/sampler.h"

namespace dsflash {
namespace {

Sampler make(float temperature, int top_k, float top_p, uint64_t seed) {
  auto s = Sampler::create(SamplingParams{temperature, top_k, top_p, seed});
  EXPECT_TRUE(s.ok());
  return std::move(*s);
}

TEST(Sampler, GreedyIsArgmaxWithLowestIdOnTies) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  Sampler s = make(0.0f, 0, 1.0f, 1);
  EXPECT_EQ(s.sample(logits.data(), 4), 1);
  EXPECT_EQ(argmax(logits.data(), 4), 1);
}

TEST(Sampler, TopKAndTopPRestrictSupport) {
  const std::vector<float> logits = {3.0f, 2.9f, 0.0f, -5.0f, 2.8f};
  Sampler top2 = make(1.0f, 2, 1.0f, 3);
  Sampler nucleus = make(1.0f, 0, 0.5f, 3);
  for (int i = 0; i < 500; ++i) {
    const int a = top2.sample(logits.data(), 5);
    EXPECT_TRUE(a == 0 || a == 1) << a;
    const int b = nucleus.sample(logits.data(), 5);
    EXPECT_TRUE(b == 0 || b == 1) << b;  // p(0) ~ 0.37 < 0.5, p(0)+p(1) ~ 0.70 >= 0.5
  }
}

TEST(Sampler, SeededAndFollowsTheDistribution) {
  const std::vector<float> logits = {1.0f, 0.0f, -1.0f};
  Sampler a = make(0.7f, 0, 1.0f, 42), b = make(0.7f, 0, 1.0f, 42);
  std::map<int, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const int x = a.sample(logits.data(), 3);
    EXPECT_EQ(x, b.sample(logits.data(), 3));
    ++counts[x];
  }
  double z = 0;
  for (float l : logits) z += std::exp(l / 0.7);
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(counts[i] / static_cast<double>(n), std::exp(logits[static_cast<size_t>(i)] / 0.7) / z, 0.015);
  }
}

TEST(Sampler, RejectsBadParameters) {
  EXPECT_FALSE(Sampler::create(SamplingParams{-0.5f, 0, 1.0f, 0}).ok());
  EXPECT_FALSE(Sampler::create(SamplingParams{1.0f, -1, 1.0f, 0}).ok());
  EXPECT_FALSE(Sampler::create(SamplingParams{1.0f, 0, 0.0f, 0}).ok());
  EXPECT_FALSE(Sampler::create(SamplingParams{1.0f, 0, 1.5f, 0}).ok());
}

}  // namespace
}  // namespace dsflash
