// Sampler policy (include/dsflash/sampling.h), exact on small rows: greedy = argmax with the lowest id on ties,
// penalties change the row as documented, top-k / top-p / min-p restrict the support, seeds reproduce, logprobs
// are the log-softmax of the unmodified row (they exponentiate to 1 over the vocabulary).
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

#include "engine/sampler.h"

namespace dsflash {
namespace {

SamplingParams params(float temperature) {
  SamplingParams p;
  p.temperature = temperature;
  return p;
}

std::set<int32_t> support(SamplingParams p, const std::vector<float>& row, int draws = 400) {
  std::set<int32_t> seen;
  for (int i = 0; i < draws; ++i) {
    p.seed = static_cast<uint64_t>(i);
    Sampler s(p);
    seen.insert(s.sample(row.data(), static_cast<int64_t>(row.size())).id);
  }
  return seen;
}

TEST(Sampler, GreedyIsArgmaxWithLowestIdOnTies) {
  const std::vector<float> row = {0.5f, 2.0f, -1.0f, 2.0f};
  Sampler s(params(0.0f));
  EXPECT_EQ(s.sample(row.data(), 4).id, 1);
  EXPECT_EQ(argmax(row.data(), 4), 1);
  const std::vector<float> all_equal(5, 3.0f);
  EXPECT_EQ(Sampler().sample(all_equal.data(), 5).id, 0);
  const std::vector<float> with_nan = {NAN, 1.0f, 0.0f};
  EXPECT_EQ(argmax(with_nan.data(), 3), 1);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  // Prompt ids 0 and 2 are penalised by 2: row becomes {1.5, 2.0, -2.0}: greedy picks 1.
  SamplingParams p = params(0.0f);
  p.repetition_penalty = 2.0f;
  Sampler s(p);
  s.observe_prompt({0, 2});
  const std::vector<float> row = {3.0f, 2.0f, -1.0f};
  EXPECT_EQ(s.sample(row.data(), 3).id, 1);
  // Without the penalty, 0 wins.
  EXPECT_EQ(Sampler(params(0.0f)).sample(row.data(), 3).id, 0);
}

TEST(Sampler, FrequencyAndPresencePenaltiesCountGeneratedIds) {
  const std::vector<float> row = {1.0f, 0.7f, 0.0f};
  SamplingParams freq = params(0.0f);
  freq.frequency_penalty = 0.2f;  // after one 0: 0.8 > 0.7; after two: 0.6 < 0.7
  Sampler f(freq);
  EXPECT_EQ(f.sample(row.data(), 3).id, 0);
  EXPECT_EQ(f.sample(row.data(), 3).id, 0);
  EXPECT_EQ(f.sample(row.data(), 3).id, 1);
  SamplingParams presence = params(0.0f);
  presence.presence_penalty = 0.5f;  // once 0 appeared: 0.5 < 0.7, and it stays 0.5 (no count)
  Sampler q(presence);
  EXPECT_EQ(q.sample(row.data(), 3).id, 0);
  EXPECT_EQ(q.sample(row.data(), 3).id, 1);
  EXPECT_EQ(q.sample(row.data(), 3).id, 0);  // both seen now: 0.5 vs 0.2
}

TEST(Sampler, TopKTopPAndMinPTruncateTheSupport) {
  // softmax(row) ~ {0.665, 0.245, 0.090, ~0} (row 2,1,0,-10).
  const std::vector<float> row = {2.0f, 1.0f, 0.0f, -10.0f};
  SamplingParams p = params(1.0f);
  EXPECT_EQ(support(p, row), (std::set<int32_t>{0, 1, 2}));  // id 3 (p ~ 1e-5) is never drawn in 400 seeds
  p.top_k = 2;
  EXPECT_EQ(support(p, row), (std::set<int32_t>{0, 1}));
  p.top_k = 0;
  p.top_p = 0.6f;  // 0.665 >= 0.6: only the first
  EXPECT_EQ(support(p, row), (std::set<int32_t>{0}));
  p.top_p = 0.8f;  // 0.665 < 0.8 <= 0.91
  EXPECT_EQ(support(p, row), (std::set<int32_t>{0, 1}));
  p.top_p = 1.0f;
  p.min_p = 0.3f;  // keep p >= 0.3 * 0.665 = 0.2: ids 0 and 1
  EXPECT_EQ(support(p, row), (std::set<int32_t>{0, 1}));
  p.min_p = 0.1f;  // 0.0665: ids 0, 1, 2
  EXPECT_EQ(support(p, row), (std::set<int32_t>{0, 1, 2}));
}

TEST(Sampler, SameSeedSameIdsAndDifferentSeedsDiffer) {
  std::vector<float> row(64);
  for (size_t i = 0; i < row.size(); ++i) row[i] = std::sin(static_cast<float>(i));
  SamplingParams p = params(1.0f);
  p.seed = 42;
  Sampler a(p), b(p);
  p.seed = 43;
  Sampler c(p);
  int differ = 0;
  for (int i = 0; i < 200; ++i) {
    const int32_t x = a.sample(row.data(), 64).id;
    EXPECT_EQ(x, b.sample(row.data(), 64).id);
    differ += x != c.sample(row.data(), 64).id;
  }
  EXPECT_GT(differ, 0);
}

TEST(Sampler, LogprobsAreTheLogSoftmaxOfTheUnmodifiedRow) {
  const std::vector<float> row = {1.0f, 3.0f, 3.0f, -2.0f, 0.5f};
  SamplingParams p = params(0.0f);
  p.top_logprobs = 5;
  p.repetition_penalty = 3.0f;  // changes the choice, not the logprobs
  Sampler s(p);
  s.observe_prompt({1, 2});
  SampledToken t = s.sample(row.data(), 5);
  EXPECT_EQ(t.id, 0);  // penalised row {1, 1, 1, -2, 0.5}: lowest id of the tie
  ASSERT_EQ(t.top.size(), 5u);
  EXPECT_EQ(t.top[0].id, 1);  // ties by the lower id
  EXPECT_EQ(t.top[1].id, 2);
  EXPECT_EQ(t.top[4].id, 3);
  double total = 0;
  for (const TokenLogprob& lp : t.top) total += std::exp(static_cast<double>(lp.logprob));
  EXPECT_NEAR(total, 1.0, 1e-6);
  const double z = std::log(std::exp(1.0) + 2 * std::exp(3.0) + std::exp(-2.0) + std::exp(0.5));
  EXPECT_NEAR(t.logprob, 1.0 - z, 1e-6);
  EXPECT_NEAR(t.top[0].logprob, 3.0 - z, 1e-6);
  // Without top_logprobs nothing is computed.
  SampledToken plain = Sampler(params(0.0f)).sample(row.data(), 5);
  EXPECT_TRUE(plain.top.empty());
}

TEST(Sampler, ValidationNamesTheField) {
  SamplingParams p;
  p.temperature = -1;
  EXPECT_NE(validate_sampling(p).message().find("temperature"), std::string::npos);
  p = SamplingParams();
  p.top_p = 0;
  EXPECT_NE(validate_sampling(p).message().find("top-p"), std::string::npos);
  p = SamplingParams();
  p.min_p = 2;
  EXPECT_NE(validate_sampling(p).message().find("min-p"), std::string::npos);
  p = SamplingParams();
  p.repetition_penalty = 0;
  EXPECT_NE(validate_sampling(p).message().find("repetition"), std::string::npos);
  p = SamplingParams();
  p.top_logprobs = 21;
  EXPECT_NE(validate_sampling(p).message().find("logprobs"), std::string::npos);
  EXPECT_TRUE(validate_sampling(SamplingParams()).ok());
}

}  // namespace
}  // namespace dsflash
