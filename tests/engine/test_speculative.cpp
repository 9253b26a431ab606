// Speculative decoding with the DSpark stages: greedy output identical with and without speculation on the golden
// tiny checkpoints (the only ones with DSpark stages), speculative sampling distributed as the target (chi-square),
// and the adaptive draft policy turning itself off when drafts do not match.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "engine/speculative.h"
#include "engine_test_util.h"

namespace dsflash::testing {
namespace {

using engine::DraftPolicy;
using engine::DraftPolicyOptions;
using engine::SpeculativeDecoder;

class SpeculativeGreedyTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SpeculativeGreedyTest, IdsEqualPlainGreedy) {
  if (!goldens_present()) GTEST_SKIP() << "goldens not present";
  const ModelRunner* runner = golden_runner(GetParam());
  ASSERT_NE(runner, nullptr);
  auto dspark = DSpark::bind(runner->checkpoint(), runner->weights());
  ASSERT_TRUE(dspark.ok()) << dspark.status().message();
  std::vector<int32_t> prompt = golden_prompt(GetParam(), "rand.index_k_fix");
  prompt.resize(std::min<size_t>(prompt.size(), 40));
  const int64_t steps = 24;
  PrefillOptions exact;
  exact.mode = PrefillMode::kExact;
  const PlanRun plain = plan_greedy(*runner, prompt, exact, steps);
  for (int max_draft : {1, 3, 4}) {
    DraftPolicyOptions policy;
    policy.max_draft = max_draft;
    policy.min_confidence = -INFINITY;  // always verify: exercises the rollback on every step
    policy.min_accept_rate = 0.0;
    SpeculativeDecoder decoder(runner->weights(), **dspark, runner->context(), policy);
    auto seq = runner->new_sequence();
    ASSERT_TRUE(seq.ok());
    auto ids = decoder.generate(**seq, prompt, steps + 1);
    ASSERT_TRUE(ids.ok()) << ids.status().message();
    EXPECT_EQ(*ids, plain.generated) << GetParam() << " k " << max_draft;
    EXPECT_GT(decoder.stats().draft_tokens, 0);
    EXPECT_EQ(static_cast<int64_t>(prompt.size()) + steps + 1 - 1, (*seq)->num_positions() +
                                                                        (static_cast<int64_t>(ids->size()) - steps - 1));
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, SpeculativeGreedyTest, ::testing::Values("tiny-a", "tiny-b"));

// The first emitted id of a verification follows the target row 0, whatever the draft distribution.
TEST(SpeculativeSampling, FirstTokenFollowsTheTarget) {
  const int64_t vocab = 5, k = 2, trials = 200000;
  const std::vector<double> target = {0.40, 0.25, 0.20, 0.10, 0.05,   // row 0
                                      0.10, 0.10, 0.60, 0.10, 0.10,   // row 1
                                      0.20, 0.20, 0.20, 0.20, 0.20};  // row 2
  const std::vector<double> draft = {0.05, 0.50, 0.05, 0.30, 0.10,
                                     0.30, 0.30, 0.20, 0.10, 0.10};
  std::mt19937_64 rng(1234);
  std::vector<int64_t> first(vocab, 0), second(vocab, 0);
  int64_t second_n = 0;
  for (int64_t t = 0; t < trials; ++t) {
    int32_t drafts[2];
    for (int i = 0; i < k; ++i) {
      std::discrete_distribution<int32_t> q(draft.begin() + i * vocab, draft.begin() + (i + 1) * vocab);
      drafts[i] = q(rng);
    }
    int32_t next = -1;
    const int64_t a = engine::accept_sampled(target.data(), draft.data(), drafts, k, vocab, rng, &next);
    ++first[static_cast<size_t>(a >= 1 ? drafts[0] : next)];
    // Given the first id was draft 0 = id 1 and accepted, the second follows target row 1.
    if (a >= 1 && drafts[0] == 1) {
      ++second[static_cast<size_t>(a >= 2 ? drafts[1] : next)];
      ++second_n;
    }
  }
  auto chi2 = [&](const std::vector<int64_t>& counts, int64_t n, const double* p) {
    double x = 0.0;
    for (int64_t v = 0; v < vocab; ++v) {
      const double e = p[v] * static_cast<double>(n);
      x += (static_cast<double>(counts[static_cast<size_t>(v)]) - e) * (static_cast<double>(counts[static_cast<size_t>(v)]) - e) / e;
    }
    return x;
  };
  // 4 degrees of freedom: P(chi2 > 23.5) ~ 1e-4.
  EXPECT_LT(chi2(first, trials, target.data()), 23.5);
  ASSERT_GT(second_n, 10000);
  EXPECT_LT(chi2(second, second_n, target.data() + vocab), 23.5);
}

TEST(DraftPolicy, ShrinksOnRejectionGrowsOnAcceptanceAndTurnsOff) {
  DraftPolicyOptions options;
  options.max_draft = 4;
  options.probe_steps = 4;
  options.off_steps = 10;
  DraftPolicy policy(options);
  const std::vector<float> confident(5, 10.0f);
  EXPECT_EQ(policy.draft_length(confident.data(), 5), 4);
  policy.record(4, 1);
  EXPECT_EQ(policy.draft_length(confident.data(), 5), 2);
  policy.record(2, 2);
  EXPECT_EQ(policy.draft_length(confident.data(), 5), 3);
  const std::vector<float> unsure = {10.0f, -9.0f, 10.0f, 10.0f, 10.0f};
  EXPECT_EQ(policy.draft_length(unsure.data(), 5), 1);  // the confidence head cuts the block
  policy.record(3, 0);
  policy.record(1, 0);  // 4 verifications, 3 of 10 drafts accepted: still on (>= 25%)
  EXPECT_TRUE(policy.active());
  for (int i = 0; i < 4; ++i) policy.record(1, 0);  // nothing accepted: off
  EXPECT_FALSE(policy.active());
  int plain = 0;
  while (policy.draft_length(confident.data(), 5) == 0 && plain < 100) ++plain;
  EXPECT_EQ(plain, 10);  // then a re-probe at k = 1
}

}  // namespace
}  // namespace dsflash::testing
