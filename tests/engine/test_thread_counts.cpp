// The fast path's results do not depend on the number of worker threads (work is split by output rows, never by
// a reduction's order): a prompt's every logits row, the decode steps after it and a batched decode step are bit
// for bit the same with 1..8 threads, on both golden checkpoints (big machines run 64-192 threads; this is the
// property that lets them).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "engine_test_util.h"

namespace dsflash::testing {
namespace {

struct ThreadRun {
  std::vector<float> prompt_rows;   // [prompt, vocab] exact plan, every row
  std::vector<float> decode_rows;   // [steps, vocab] greedy decode after it
  std::vector<float> batched_rows;  // [3, vocab] one decode step of three sequences together
};

ThreadRun run_with_threads(const std::string& model, int threads, const std::vector<int32_t>& prompt) {
  ThreadRun run;
  RunnerOptions options;
  options.num_threads = threads;
  auto runner = ModelRunner::open(golden_checkpoint_dir(model), options);
  EXPECT_TRUE(runner.ok()) << runner.status().message();
  if (!runner.ok()) return run;
  const int64_t vocab = (*runner)->config().vocab_size;
  auto seq = (*runner)->new_sequence();
  EXPECT_TRUE(seq.ok());
  EXPECT_TRUE((*runner)->forward(prompt, **seq, LogitsRows::kAll, &run.prompt_rows).ok());
  int32_t next = argmax(run.prompt_rows.data() + (static_cast<int64_t>(prompt.size()) - 1) * vocab, vocab);
  for (int step = 0; step < 4; ++step) {
    std::vector<float> row;
    EXPECT_TRUE(decode_step(**runner, {next}, {seq->get()}, {}, &row).ok());
    run.decode_rows.insert(run.decode_rows.end(), row.begin(), row.end());
    next = argmax(row.data(), vocab);
  }
  std::vector<kv::SequenceLease> seqs;
  std::vector<SequenceState*> states;
  std::vector<int32_t> tokens;
  for (size_t b = 0; b < 3; ++b) {
    auto s = (*runner)->new_sequence();
    EXPECT_TRUE(s.ok());
    const std::vector<int32_t> part(prompt.begin() + static_cast<int64_t>(b), prompt.begin() + static_cast<int64_t>(b + 9 + 4 * b));
    std::vector<float> unused;
    EXPECT_TRUE((*runner)->forward(part, **s, LogitsRows::kLast, &unused).ok());
    states.push_back(s->get());
    tokens.push_back(prompt[b + 20]);
    seqs.push_back(std::move(*s));
  }
  EXPECT_TRUE(decode_step(**runner, tokens, states, {}, &run.batched_rows).ok());
  return run;
}

class ThreadCountTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ThreadCountTest, OneToEightThreadsGiveTheSameBits) {
  if (!goldens_present()) GTEST_SKIP() << "goldens not present";
  std::vector<int32_t> prompt = golden_prompt(GetParam(), "rand.index_k_fix");
  prompt.resize(std::min<size_t>(prompt.size(), 40));
  ASSERT_GE(prompt.size(), 30u);
  const ThreadRun one = run_with_threads(GetParam(), 1, prompt);
  ASSERT_FALSE(one.prompt_rows.empty());
  for (int threads = 2; threads <= 8; ++threads) {
    const ThreadRun many = run_with_threads(GetParam(), threads, prompt);
    auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
    };
    EXPECT_TRUE(same(one.prompt_rows, many.prompt_rows)) << threads << " threads: prompt rows";
    EXPECT_TRUE(same(one.decode_rows, many.decode_rows)) << threads << " threads: decode rows";
    EXPECT_TRUE(same(one.batched_rows, many.batched_rows)) << threads << " threads: batched decode rows";
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, ThreadCountTest, ::testing::Values("tiny-a", "tiny-b"));

}  // namespace
}  // namespace dsflash::testing
