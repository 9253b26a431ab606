// The public Engine (include/dsflash/engine.h) on the golden tiny-a checkpoint: greedy ids equal the golden /
// ForwardPlan ids, many threads submitting at once each get what they get alone, cancellation, stop ids and stop
// strings split across tokens (never output), the order of events and usage counts, logits rows, typed errors.
// Nothing here waits on time: every check follows from the event order the engine guarantees.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <thread>

#include "dsflash/engine.h"
#include "engine_test_util.h"
#include "kernels/backend.h"

namespace dsflash::testing {
namespace {

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!goldens_present()) GTEST_SKIP() << "goldens not found under " << goldens_dir();
    prompt_ = golden_prompt("tiny-a", "rand.index_k_fix");
    ASSERT_GE(prompt_.size(), 40u);
  }
  std::unique_ptr<Engine> load(LoadOptions options = {}) {
    if (options.num_threads == 0) options.num_threads = 2;
    auto engine = Engine::load(golden_checkpoint_dir("tiny-a"), options);
    EXPECT_TRUE(engine.ok()) << engine.error().message;
    return engine.ok() ? std::move(*engine) : nullptr;
  }
  GenerationRequest greedy(std::vector<int32_t> prompt, int64_t max_tokens) const {
    GenerationRequest r;
    r.prompt_ids = std::move(prompt);
    r.max_tokens = max_tokens;
    r.stop_at_eos = false;
    return r;
  }
  std::vector<int32_t> slice(size_t from, size_t to) const {
    return std::vector<int32_t>(prompt_.begin() + static_cast<int64_t>(from), prompt_.begin() + static_cast<int64_t>(to));
  }
  std::vector<int32_t> prompt_;
};

TEST_F(EngineTest, ExactGreedyIdsAreTheGoldenIds) {
  LoadOptions options;
  options.reference_kernels = true;
  auto engine = load(options);
  ASSERT_NE(engine, nullptr);
  auto golden = SafetensorsFile::open(golden_output_path("tiny-a", "rand.index_k_fix"));
  ASSERT_TRUE(golden.ok());
  const auto generated = to_i64(golden->find("generated_ids"));
  GenerationRequest r = greedy(prompt_, 5);
  r.plan = Plan::kExact;
  auto done = engine->generate(r);
  ASSERT_TRUE(done.ok()) << done.error().message;
  ASSERT_EQ(done->tokens.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(done->tokens[i], generated[i]) << i;
  EXPECT_EQ(done->finish_reason, FinishReason::kLength);
}

TEST_F(EngineTest, ManyThreadsSubmittingAtOnceEachGetWhatTheyGetAlone) {
  auto engine = load();
  ASSERT_NE(engine, nullptr);
  const ModelRunner* runner = golden_runner("tiny-a");
  ASSERT_NE(runner, nullptr);
  constexpr int kThreads = 8;
  std::vector<std::vector<int32_t>> prompts, got(kThreads);
  for (int t = 0; t < kThreads; ++t) prompts.push_back(slice(static_cast<size_t>(t), static_cast<size_t>(12 + 5 * t)));
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto done = engine->generate(greedy(prompts[static_cast<size_t>(t)], 6));
      if (!done.ok()) {
        errors[static_cast<size_t>(t)] = done.error().message;
        return;
      }
      got[static_cast<size_t>(t)] = done->tokens;
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_TRUE(errors[static_cast<size_t>(t)].empty()) << errors[static_cast<size_t>(t)];
    PlanRun alone = plan_greedy(*runner, prompts[static_cast<size_t>(t)], PrefillOptions(), 5);
    EXPECT_EQ(got[static_cast<size_t>(t)], alone.generated) << "thread " << t;
  }
}

TEST_F(EngineTest, RequestsSubmittedTogetherDecodeAsOneBatchFromTheirFirstStep) {
  auto engine = load();
  ASSERT_NE(engine, nullptr);
  const ModelRunner* runner = golden_runner("tiny-a");
  ASSERT_NE(runner, nullptr);
  constexpr size_t kBatch = 3;
  constexpr int64_t kTokens = 5;
  std::vector<GenerationRequest> requests;
  for (size_t b = 0; b < kBatch; ++b) requests.push_back(greedy(slice(b, 10 + 4 * b), kTokens));
  (void)engine->take_step_records();
  auto handles = engine->submit_together(requests);
  ASSERT_TRUE(handles.ok()) << handles.error().message;
  ASSERT_EQ(handles->size(), kBatch);
  for (size_t b = 0; b < kBatch; ++b) {
    std::vector<int32_t> tokens;
    while (auto e = (*handles)[b].next()) {
      ASSERT_FALSE(e->error.has_value()) << e->error->message;
      if (e->kind == EventKind::kToken) tokens.push_back(e->token);
    }
    // Each gets what it gets alone.
    EXPECT_EQ(tokens, plan_greedy(*runner, requests[b].prompt_ids, PrefillOptions(), kTokens - 1).generated) << b;
  }
  // The loop took all of them at one step boundary: one step prefilled every prompt, then each of the
  // kTokens - 1 decode steps ran the whole batch.
  const std::vector<StepRecord> steps = engine->take_step_records();
  ASSERT_EQ(steps.size(), static_cast<size_t>(kTokens));
  EXPECT_EQ(steps[0].decode_batch, 0);
  for (size_t i = 1; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i].prefill_tokens, 0) << i;
    EXPECT_EQ(steps[i].decode_batch, static_cast<int64_t>(kBatch)) << i;
  }

  // All or none: one bad request queues nothing; more than the engine takes is kOverloaded, also nothing queued.
  requests[1].max_tokens = 0;
  auto bad = engine->submit_together(requests);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, ErrorCode::kInvalidRequest);
  LoadOptions two;
  two.max_requests = 2;
  auto small = load(two);
  ASSERT_NE(small, nullptr);
  requests[1].max_tokens = kTokens;
  auto over = small->submit_together(requests);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.error().code, ErrorCode::kOverloaded);
  requests.pop_back();
  auto fits = small->submit_together(requests);
  ASSERT_TRUE(fits.ok()) << fits.error().message;
  for (RequestHandle& h : *fits) {
    while (auto e = h.next()) EXPECT_FALSE(e->error.has_value());
  }
  EXPECT_EQ(engine->take_step_records().size(), 0u);  // the refused batches never reached the loop
}

TEST_F(EngineTest, EventsComeInOrderWithUsage) {
  auto engine = load();
  ASSERT_NE(engine, nullptr);
  GenerationRequest r = greedy(slice(0, 20), 7);
  r.parse_output = true;
  r.sampling.top_logprobs = 3;
  auto handle = engine->submit(r);
  ASSERT_TRUE(handle.ok());
  std::vector<Event> events;
  while (auto e = handle->next()) events.push_back(std::move(*e));
  EXPECT_TRUE(handle->done());
  EXPECT_FALSE(handle->next().has_value());
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().kind, EventKind::kFinished);
  int tokens = 0, finished = 0;
  bool token_seen = false;
  for (const Event& e : events) {
    EXPECT_EQ(e.request, handle->id());
    if (e.kind == EventKind::kToken) {
      ++tokens;
      token_seen = true;
      EXPECT_EQ(e.top_logprobs.size(), 3u);
      EXPECT_EQ(e.top_logprobs[0].id, e.token);  // greedy: the most likely id
      EXPECT_FLOAT_EQ(e.top_logprobs[0].logprob, e.logprob);
    }
    if (e.kind == EventKind::kText || e.kind == EventKind::kContent || e.kind == EventKind::kReasoning) {
      EXPECT_TRUE(token_seen) << "text before any token";
    }
    finished += e.kind == EventKind::kFinished;
  }
  EXPECT_EQ(tokens, 7);
  EXPECT_EQ(finished, 1);
  const Usage& usage = events.back().usage;
  EXPECT_EQ(usage.prompt_tokens, 20);
  EXPECT_EQ(usage.cached_tokens, 0);
  EXPECT_EQ(usage.generated_tokens, 7);
  EXPECT_EQ(events.back().finish_reason, FinishReason::kLength);
  EXPECT_GT(events.back().global_kv_bytes, 0);
}

TEST_F(EngineTest, StopIdEndsGenerationAndIsNotOutput) {
  auto engine = load();
  ASSERT_NE(engine, nullptr);
  auto free_run = engine->generate(greedy(slice(0, 30), 6));
  ASSERT_TRUE(free_run.ok());
  const int32_t stop = free_run->tokens[3];
  const size_t first = static_cast<size_t>(std::find(free_run->tokens.begin(), free_run->tokens.end(), stop) -
                                           free_run->tokens.begin());
  GenerationRequest r = greedy(slice(0, 30), 6);
  r.stop_ids = {stop};
  auto done = engine->generate(r);
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->tokens, std::vector<int32_t>(free_run->tokens.begin(), free_run->tokens.begin() + static_cast<int64_t>(first)));
  EXPECT_EQ(done->finish_reason, FinishReason::kStop);
  EXPECT_EQ(done->usage.generated_tokens, static_cast<int64_t>(first + 1));  // the stop id was generated
  EXPECT_EQ(done->text, engine->detokenize(done->tokens));
}

TEST_F(EngineTest, StopStringSplitAcrossTokensCutsTheText) {
  auto engine = load();
  ASSERT_NE(engine, nullptr);
  auto free_run = engine->generate(greedy(slice(3, 33), 12));
  ASSERT_TRUE(free_run.ok());
  const std::string text = free_run->text;
  ASSERT_EQ(text, engine->detokenize(free_run->tokens));
  // A stop string made of the last byte of the text of tokens [0, k) and the first byte after it.
  size_t boundary = 0;
  for (size_t k = 1; k < free_run->tokens.size() && boundary == 0; ++k) {
    const size_t b = engine->detokenize(std::vector<int32_t>(free_run->tokens.begin(), free_run->tokens.begin() + static_cast<int64_t>(k))).size();
    if (b >= 1 && b + 1 <= text.size() && text.compare(0, b, engine->detokenize(std::vector<int32_t>(free_run->tokens.begin(), free_run->tokens.begin() + static_cast<int64_t>(k)))) == 0) boundary = b;
  }
  ASSERT_GT(boundary, 0u) << "no token boundary inside the text";
  const std::string stop = text.substr(boundary - 1, 2);
  GenerationRequest r = greedy(slice(3, 33), 12);
  r.stop_strings = {"\x01never", stop};
  auto handle = engine->submit(r);
  ASSERT_TRUE(handle.ok());
  std::string out;
  std::optional<Event> last;
  while (auto e = handle->next()) {
    if (e->kind == EventKind::kText) out += e->text;
    last = std::move(e);
  }
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(out, text.substr(0, text.find(stop)));
  EXPECT_EQ(last->finish_reason, FinishReason::kStop);
  EXPECT_EQ(last->stop_string, stop);
  EXPECT_LT(last->usage.generated_tokens, 12);
}

TEST_F(EngineTest, CancelMidGenerationFinishesWithCancelled) {
  auto engine = load();
  ASSERT_NE(engine, nullptr);
  auto handle = engine->submit(greedy(slice(0, 10), 100000));
  ASSERT_TRUE(handle.ok());
  int tokens = 0;
  std::optional<Event> last;
  while (auto e = handle->next()) {
    if (e->kind == EventKind::kToken && ++tokens == 2) engine->cancel(handle->id());
    last = std::move(e);
  }
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->kind, EventKind::kFinished);
  EXPECT_EQ(last->finish_reason, FinishReason::kCancelled);
  EXPECT_LT(last->usage.generated_tokens, 100000);
  engine->cancel(handle->id());  // finished: a no-op
  engine->cancel(12345);         // unknown: a no-op
  // The engine keeps serving.
  auto after = engine->generate(greedy(slice(0, 10), 2));
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->tokens.size(), 2u);
}

TEST_F(EngineTest, DestructorCancelsWhatIsInFlight) {
  std::optional<RequestHandle> handle;
  {
    auto engine = load();
    ASSERT_NE(engine, nullptr);
    auto h = engine->submit(greedy(slice(0, 10), 100000));
    ASSERT_TRUE(h.ok());
    handle = *h;
  }
  std::optional<Event> last;
  while (auto e = handle->next()) last = std::move(e);
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->finish_reason, FinishReason::kCancelled);
}

TEST_F(EngineTest, LogitsRowsAndTeacherForcing) {
  auto engine = load();
  ASSERT_NE(engine, nullptr);
  const int64_t vocab = engine->info().vocab_size;
  GenerationRequest r = greedy(slice(0, 12), 4);
  r.plan = Plan::kExact;
  r.return_logits = true;
  r.follow_ids = {5, 6, 7};
  auto done = engine->generate(r);
  ASSERT_TRUE(done.ok());
  // Every prompt row, then one row per generated token after the first.
  ASSERT_EQ(done->positions.size(), 12u + 3u);
  for (size_t i = 0; i < done->positions.size(); ++i) EXPECT_EQ(done->positions[i], static_cast<int64_t>(i));
  ASSERT_EQ(done->logits.size(), done->positions.size() * static_cast<size_t>(vocab));
  // Each token is the argmax of its row.
  for (size_t t = 0; t < done->tokens.size(); ++t) {
    EXPECT_EQ(done->tokens[t], argmax(done->logits.data() + (11 + t) * static_cast<size_t>(vocab), vocab));
  }
  // The default plan returns only the last prompt row.
  r.plan = Plan::kBoundedReplay;
  auto replay = engine->generate(r);
  ASSERT_TRUE(replay.ok());
  EXPECT_EQ(replay->positions, (std::vector<int64_t>{11, 12, 13, 14}));
}

// GenerationRequest::bench_synthetic_context: the prompt runs after that many positions of synthetic KV (nothing
// prefilled for them), decodes with finite logits, is deterministic, counts them in the usage, keeps the prefix
// cache out of it; a negative depth or one past max_position_embeddings is refused.
TEST_F(EngineTest, BenchSyntheticContextDecodesAtDepth) {
  auto engine = load();
  ASSERT_NE(engine, nullptr);
  GenerationRequest r = greedy(slice(0, 2), 4);
  r.bench_synthetic_context = 700;
  r.return_logits = true;
  (void)engine->take_step_records();
  auto first = engine->generate(r);
  ASSERT_TRUE(first.ok()) << first.error().message;
  EXPECT_EQ(first->usage.prompt_tokens, 702);
  EXPECT_EQ(first->usage.cached_tokens, 0);
  ASSERT_EQ(first->tokens.size(), 4u);
  for (float v : first->logits) ASSERT_TRUE(std::isfinite(v));
  ASSERT_FALSE(first->positions.empty());
  EXPECT_EQ(first->positions.front(), 701);
  int64_t prefilled = 0;
  for (const StepRecord& step : engine->take_step_records()) prefilled += step.prefill_tokens;
  EXPECT_EQ(prefilled, 2);  // only the real prompt tokens are computed
  auto second = engine->generate(r);
  ASSERT_TRUE(second.ok()) << second.error().message;
  EXPECT_EQ(second->tokens, first->tokens);
  EXPECT_EQ(second->usage.cached_tokens, 0);

  GenerationRequest negative = r;
  negative.bench_synthetic_context = -1;
  auto bad = engine->submit(negative);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, ErrorCode::kInvalidRequest);
  GenerationRequest deep = r;
  deep.bench_synthetic_context = engine->info().max_position_embeddings;
  auto too_deep = engine->submit(deep);
  ASSERT_FALSE(too_deep.ok());
  EXPECT_EQ(too_deep.error().code, ErrorCode::kContextTooLong);
}

// Speed figures count MXFP4 FLOPs at the tile unit's peak from the rows where the loaded table runs them there:
// only on tile-major weights, and never for "amx", whose GEMM peak is the tile unit's already.
TEST_F(EngineTest, InfoSaysFromHowManyRowsMxfp4GemmsRunOnTiles) {
  auto engine = load();
  ASSERT_NE(engine, nullptr);
  const ModelInfo& info = engine->info();
  EXPECT_GT(info.activated_params_decode_fp4, 0);
  EXPECT_LT(info.activated_params_decode_fp4, info.activated_params_decode);
  EXPECT_LE(info.activated_params_prefill_fp4, info.activated_params_prefill);
  ASSERT_GT(info.tile_major_linears, 0);
  EXPECT_EQ(info.fp4_amx_min_rows, best_backend().fp4_amx_min_rows);
  LoadOptions row_major;
  row_major.tile_major_weights = false;
  EXPECT_EQ(load(row_major)->info().fp4_amx_min_rows, 0);
  if (find_backend("amx") != nullptr) {
    LoadOptions amx;
    amx.backend = "amx";
    EXPECT_EQ(load(amx)->info().fp4_amx_min_rows, 0);
  }
}

// LoadOptions::dspark false: the DSpark stages are not loaded (no tile-major copy of theirs), requests cannot
// speculate and are told why; plain requests give the same ids as with the stages loaded.
TEST_F(EngineTest, WithoutTheDSparkStagesNothingOfThemIsCopiedAndSpeculationIsRefused) {
  auto with = load();
  ASSERT_NE(with, nullptr);
  ASSERT_GT(with->info().dspark_block_size, 0);  // tiny-a has DSpark stages
  LoadOptions options;
  options.dspark = false;
  auto without = load(options);
  ASSERT_NE(without, nullptr);
  EXPECT_EQ(without->info().dspark_block_size, 0);
  EXPECT_EQ(without->info().tile_major_linears, with->info().tile_major_linears);  // the main layers' alone
  EXPECT_GT(without->info().tile_major_bytes, 0);
  EXPECT_LT(without->info().tile_major_bytes, with->info().tile_major_bytes);
  GenerationRequest speculating = greedy(slice(0, 20), 4);
  speculating.speculative = 2;
  auto refused = without->submit(speculating);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, ErrorCode::kInvalidRequest);
  EXPECT_NE(refused.error().message.find("loaded without them"), std::string::npos) << refused.error().message;
  auto a = with->generate(greedy(slice(0, 20), 4));
  auto b = without->generate(greedy(slice(0, 20), 4));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->tokens, b->tokens);
}

TEST_F(EngineTest, BadRequestsGiveTypedErrors) {
  auto engine = load();
  ASSERT_NE(engine, nullptr);
  auto code = [&](GenerationRequest r) {
    auto h = engine->submit(std::move(r));
    return h.ok() ? std::optional<ErrorCode>() : std::optional<ErrorCode>(h.error().code);
  };
  EXPECT_EQ(code(greedy({}, 3)), ErrorCode::kInvalidRequest);
  EXPECT_EQ(code(greedy({1, static_cast<int32_t>(engine->info().vocab_size)}, 3)), ErrorCode::kInvalidRequest);
  EXPECT_EQ(code(greedy({1, 2}, 0)), ErrorCode::kInvalidRequest);
  GenerationRequest hot = greedy({1, 2}, 3);
  hot.sampling.temperature = -1;
  EXPECT_EQ(code(hot), ErrorCode::kInvalidRequest);
  GenerationRequest empty_stop = greedy({1, 2}, 3);
  empty_stop.stop_strings = {""};
  EXPECT_EQ(code(empty_stop), ErrorCode::kInvalidRequest);
  EXPECT_EQ(code(greedy({1, 2}, engine->info().max_position_embeddings)), ErrorCode::kContextTooLong);

  LoadOptions small;
  small.kv_budget_bytes = engine->info().fixed_kv_bytes_per_sequence + engine->global_kv_bytes_for_positions(64);
  auto tight = load(small);
  ASSERT_NE(tight, nullptr);
  EXPECT_EQ(tight->info().max_request_positions, 64);
  auto too_long = tight->submit(greedy(slice(0, 40), 100));
  ASSERT_FALSE(too_long.ok());
  EXPECT_EQ(too_long.error().code, ErrorCode::kContextTooLong);
  EXPECT_TRUE(tight->submit(greedy(slice(0, 40), 24)).ok());

  LoadOptions one;
  one.max_requests = 1;
  auto busy = load(one);
  ASSERT_NE(busy, nullptr);
  auto first = busy->submit(greedy(slice(0, 10), 100000));
  ASSERT_TRUE(first.ok());
  auto second = busy->submit(greedy(slice(0, 10), 2));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.error().code, ErrorCode::kOverloaded);
  busy->cancel(first->id());

  auto missing = Engine::load(golden_checkpoint_dir("tiny-a") + "/no_such_dir");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, ErrorCode::kLoad);
  EXPECT_NE(missing.error().message.find("does not exist"), std::string::npos);

  // A kernel table this CPU lacks (or no table of that name): a load error that lists the ones it has.
  LoadOptions unknown_backend;
  unknown_backend.backend = "no-such-table";
  auto unknown = Engine::load(golden_checkpoint_dir("tiny-a"), unknown_backend);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.error().code, ErrorCode::kLoad);
  EXPECT_NE(unknown.error().message.find("'no-such-table' is not one this CPU runs"), std::string::npos)
      << unknown.error().message;
  EXPECT_NE(unknown.error().message.find("avx2"), std::string::npos) << unknown.error().message;
}

}  // namespace
}  // namespace dsflash::testing
