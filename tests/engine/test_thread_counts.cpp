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
  int64_t tile_major_linears = 0;
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

ThreadRun run_with_threads(const std::string& model, int threads, const std::vector<int32_t>& prompt,
                           bool tile_major = true) {
  ThreadRun run;
  RunnerOptions options;
  options.num_threads = threads;
  options.tile_major_weights = tile_major;
  auto runner = ModelRunner::open(golden_checkpoint_dir(model), options);
  EXPECT_TRUE(runner.ok()) << runner.status().message();
  if (!runner.ok()) return run;
  run.tile_major_linears = (*runner)->tile_major_linears();
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
    EXPECT_TRUE(same_bits(one.prompt_rows, many.prompt_rows)) << threads << " threads: prompt rows";
    EXPECT_TRUE(same_bits(one.decode_rows, many.decode_rows)) << threads << " threads: decode rows";
    EXPECT_TRUE(same_bits(one.batched_rows, many.batched_rows)) << threads << " threads: batched decode rows";
  }
}

// The load-time rewrite of FP8/MXFP4 weights into tile-major order (RunnerOptions::tile_major_weights) changes
// no bit of prompt, decode or batched rows of the goldens (their block sums are exact, where every path agrees).
// Where the kernels prefer it (AVX-512), it must have happened: both models' quantised linears have whole tiles.
TEST_P(ThreadCountTest, TileMajorWeightsGiveTheSameBits) {
  if (!goldens_present()) GTEST_SKIP() << "goldens not present";
  std::vector<int32_t> prompt = golden_prompt(GetParam(), "rand.index_k_fix");
  prompt.resize(std::min<size_t>(prompt.size(), 40));
  ASSERT_GE(prompt.size(), 30u);
  const ThreadRun row_major = run_with_threads(GetParam(), 2, prompt, false);
  const ThreadRun tiled = run_with_threads(GetParam(), 2, prompt, true);
  EXPECT_EQ(row_major.tile_major_linears, 0);
  if (best_backend().prefers_tile_major.any()) {
    EXPECT_GT(tiled.tile_major_linears, 0);
  }
  EXPECT_TRUE(same_bits(row_major.prompt_rows, tiled.prompt_rows));
  EXPECT_TRUE(same_bits(row_major.decode_rows, tiled.decode_rows));
  EXPECT_TRUE(same_bits(row_major.batched_rows, tiled.batched_rows));
}

INSTANTIATE_TEST_SUITE_P(Golden, ThreadCountTest, ::testing::Values("tiny-a", "tiny-b"));

}  // namespace
}  // namespace dsflash::testing
