// Decode over a long synthetic context (GenerationRequest::bench_synthetic_context) on the golden tiny-a checkpoint:
// the result does not depend on the thread count. At depth 70000 the candidate-source layer (ratio 1) has 8750
// candidate blocks and 70000 index scores per query, so a batch-1 step splits its block maxima and its top-k over
// the pool (model/attention.cpp run_indexer): 1 and 3 threads must give the same ids and the same logits bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "dsflash/engine.h"
#include "engine_test_util.h"

namespace dsflash::testing {
namespace {

TEST(EngineDepth, ThreadCountDoesNotChangeADeepDecode) {
  if (!goldens_present()) GTEST_SKIP() << "goldens not found under " << goldens_dir();
  const std::vector<int32_t> prompt = golden_prompt("tiny-a", "rand.index_k_fix");
  ASSERT_GE(prompt.size(), 3u);
  GenerationRequest r;
  r.prompt_ids.assign(prompt.begin(), prompt.begin() + 3);
  r.max_tokens = 3;
  r.stop_at_eos = false;
  r.return_logits = true;
  r.bench_synthetic_context = 70000;
  std::vector<Completion> results;
  for (int threads : {1, 3}) {
    LoadOptions options;
    options.num_threads = threads;
    options.prefix_cache = false;
    auto engine = Engine::load(golden_checkpoint_dir("tiny-a"), options);
    ASSERT_TRUE(engine.ok()) << engine.error().message;
    auto result = (*engine)->generate(r);
    ASSERT_TRUE(result.ok()) << result.error().message;
    EXPECT_EQ(result->usage.prompt_tokens, 70003);
    results.push_back(std::move(*result));
  }
  EXPECT_EQ(results[1].tokens, results[0].tokens);
  ASSERT_EQ(results[1].logits.size(), results[0].logits.size());
  ASSERT_FALSE(results[0].logits.empty());
  EXPECT_EQ(std::memcmp(results[1].logits.data(), results[0].logits.data(), results[0].logits.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace dsflash::testing
