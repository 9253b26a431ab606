// kv::SequenceSnapshot on the golden tiny checkpoints: a verification forward of R rows followed by keep(a) leaves
// the sequence byte for byte equal to one that processed only the first a rows (rings, compressed entries, tails,
// Engram history, positions), and the next forward over both gives identical logits.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "engine_test_util.h"
#include "kv/sequence_snapshot.h"

namespace dsflash::testing {
namespace {

class SequenceSnapshotTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SequenceSnapshotTest, KeepEqualsAPlainRunOfTheKeptRows) {
  if (!goldens_present()) GTEST_SKIP() << "goldens not present";
  const ModelRunner* runner = golden_runner(GetParam());
  ASSERT_NE(runner, nullptr);
  std::vector<int32_t> prompt = golden_prompt(GetParam(), "rand.index_k_fix");
  ASSERT_GT(prompt.size(), 8u);
  prompt.resize(std::min<size_t>(prompt.size(), 37));  // odd length: ratio-2 tails hold a pending half-group
  auto base = runner->new_sequence();
  ASSERT_TRUE(base.ok()) << base.status().message();
  std::vector<float> logits;
  ASSERT_TRUE(runner->forward(prompt, **base, LogitsRows::kLast, &logits).ok());
  const int64_t vocab = runner->config().vocab_size;
  const std::vector<int32_t> rows = {prompt[3], prompt[1], 7 % static_cast<int32_t>(vocab), prompt[5], prompt[2], prompt[8]};
  const int64_t r = static_cast<int64_t>(rows.size());
  const std::vector<int32_t> next = {prompt[4], prompt[6], prompt[0]};
  for (int64_t kept = 0; kept <= r; ++kept) {
    if (kept == 1) continue;  // one row after position 0 is a decode step (model.py's ring layout), not comparable
    const std::string where = GetParam() + " kept " + std::to_string(kept);
    auto spec = runner->fork(**base);
    auto plain = runner->fork(**base);
    ASSERT_TRUE(spec.ok() && plain.ok());
    kv::SequenceSnapshot snapshot;
    ASSERT_TRUE(snapshot.capture(**spec, r).ok());
    ASSERT_TRUE(runner->forward(rows, **spec, LogitsRows::kAll, &logits).ok());
    ASSERT_TRUE(snapshot.keep(**spec, kept).ok()) << where;
    if (kept > 0) {
      ASSERT_TRUE(runner->forward(std::vector<int32_t>(rows.begin(), rows.begin() + kept), **plain, LogitsRows::kNone,
                                  &logits).ok());
    }
    expect_same_state(**spec, **plain, where);
    std::vector<float> spec_logits, plain_logits;
    ASSERT_TRUE(runner->forward(next, **spec, LogitsRows::kAll, &spec_logits).ok());
    ASSERT_TRUE(runner->forward(next, **plain, LogitsRows::kAll, &plain_logits).ok());
    EXPECT_EQ(spec_logits, plain_logits) << where;
    expect_same_state(**spec, **plain, where + " after the next forward");
  }
}

TEST(SequenceSnapshot, RefusesPositionZeroAndMoreRowsThanTheWindow) {
  if (!goldens_present()) GTEST_SKIP() << "goldens not present";
  const ModelRunner* runner = golden_runner("tiny-a");
  ASSERT_NE(runner, nullptr);
  auto seq = runner->new_sequence();
  ASSERT_TRUE(seq.ok());
  kv::SequenceSnapshot snapshot;
  EXPECT_FALSE(snapshot.capture(**seq, 2).ok());
  std::vector<float> logits;
  ASSERT_TRUE(runner->forward({1, 2, 3}, **seq, LogitsRows::kNone, &logits).ok());
  EXPECT_FALSE(snapshot.capture(**seq, runner->config().window_size + 1).ok());
  EXPECT_FALSE(snapshot.capture(**seq, 0).ok());
  ASSERT_TRUE(snapshot.capture(**seq, 2).ok());
  EXPECT_FALSE(snapshot.keep(**seq, 1).ok());  // nothing processed yet: only kept = 0
  EXPECT_TRUE(snapshot.keep(**seq, 0).ok());
}

INSTANTIATE_TEST_SUITE_P(Golden, SequenceSnapshotTest, ::testing::Values("tiny-a", "tiny-b"));

}  // namespace
}  // namespace dsflash::testing
