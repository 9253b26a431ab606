// Scheduler core on a golden checkpoint: requests of different lengths prefill (in chunks) and decode together and
// each gets what it gets alone; stop ids, max tokens, cancellation; admission by the KV budget with clear
// errors; every byte returned when requests finish.
#include <gtest/gtest.h>

#include "engine/scheduler.h"
#include "engine_test_util.h"

namespace dsflash::testing {
namespace {

using engine::Scheduler;
using engine::SchedulerOptions;
using engine::Event;
using engine::FinishReason;
using engine::Request;
using engine::RequestId;
using engine::RequestStatus;

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!goldens_present()) GTEST_SKIP() << "goldens not found under " << goldens_dir();
    runner_ = golden_runner("tiny-a");
    ASSERT_NE(runner_, nullptr);
    prompt_ = golden_prompt("tiny-a", "rand.index_k_fix");
    ASSERT_GE(prompt_.size(), 40u);
  }
  std::unique_ptr<Scheduler> make(SchedulerOptions options) {
    auto e = Scheduler::create(runner_->weights(), runner_->context(), options);
    EXPECT_TRUE(e.ok()) << e.status().message();
    return e.ok() ? std::move(*e) : nullptr;
  }
  std::vector<int32_t> slice(size_t from, size_t to) const {
    return std::vector<int32_t>(prompt_.begin() + static_cast<int64_t>(from), prompt_.begin() + static_cast<int64_t>(to));
  }
  const ModelRunner* runner_ = nullptr;
  std::vector<int32_t> prompt_;
};

TEST_F(SchedulerTest, ConcurrentRequestsGetWhatTheyGetAlone) {
  SchedulerOptions options;
  options.prefill_tokens_per_step = 13;  // chunks, and prefill mixed with decode steps
  auto engine = make(options);
  ASSERT_NE(engine, nullptr);
  struct Case {
    std::vector<int32_t> prompt;
    int64_t max_new;
    PrefillMode mode;
  };
  const std::vector<Case> cases = {{slice(0, 61), 9, PrefillMode::kBoundedReplay},
                                   {slice(5, 20), 12, PrefillMode::kBoundedReplay},
                                   {slice(10, 12), 4, PrefillMode::kExact},
                                   {slice(20, 53), 7, PrefillMode::kExact}};
  std::vector<RequestId> ids;
  for (const Case& c : cases) {
    Request r;
    r.prompt = c.prompt;
    r.max_new_tokens = c.max_new;
    r.prefill.mode = c.mode;
    auto id = engine->submit(r);
    ASSERT_TRUE(id.ok()) << id.status().message();
    ids.push_back(*id);
  }
  std::vector<Event> events;
  int64_t max_batch = 0;
  bool mixed = false;
  while (engine->has_work()) {
    ASSERT_TRUE(engine->step(&events).ok());
    max_batch = std::max(max_batch, engine->last_step().decode_batch);
    mixed |= engine->last_step().decode_batch > 0 && engine->last_step().prefill_tokens > 0;
  }
  EXPECT_GE(max_batch, 3);
  EXPECT_TRUE(mixed);
  for (size_t i = 0; i < cases.size(); ++i) {
    PrefillOptions po;
    po.mode = cases[i].mode;
    PlanRun alone = plan_greedy(*runner_, cases[i].prompt, po, cases[i].max_new - 1);
    const auto* rec = engine->record(ids[i]);
    ASSERT_NE(rec, nullptr);
    EXPECT_EQ(rec->status, RequestStatus::kFinished);
    EXPECT_EQ(rec->reason, FinishReason::kMaxTokens);
    EXPECT_EQ(rec->generated, alone.generated) << "request " << i;
    // The streamed token events carry the same ids, in order.
    std::vector<int32_t> streamed;
    for (const Event& e : events) {
      if (e.id == ids[i] && e.kind == Event::Kind::kToken) streamed.push_back(e.token);
    }
    EXPECT_EQ(streamed, rec->generated);
  }
  const kv::KvStats st = engine->kv_stats();
  EXPECT_EQ(st.used_bytes, 0);
  EXPECT_EQ(st.num_sequences, 0);
}

TEST_F(SchedulerTest, StopIdEndsGeneration) {
  auto engine = make(SchedulerOptions());
  ASSERT_NE(engine, nullptr);
  const std::vector<int32_t> prompt = slice(0, 30);
  PlanRun alone = plan_greedy(*runner_, prompt, PrefillOptions(), 5);
  Request r;
  r.prompt = prompt;
  r.max_new_tokens = 50;
  r.stop_ids = {alone.generated[3]};
  auto id = engine->submit(r);
  ASSERT_TRUE(id.ok());
  std::vector<Event> events;
  ASSERT_TRUE(engine->run_to_completion(&events).ok());
  const auto* rec = engine->record(*id);
  ASSERT_NE(rec, nullptr);
  EXPECT_EQ(rec->reason, FinishReason::kStopToken);
  // Up to and including the first occurrence of the stop id.
  size_t first = 0;
  while (alone.generated[first] != r.stop_ids[0]) ++first;
  EXPECT_EQ(rec->generated, std::vector<int32_t>(alone.generated.begin(), alone.generated.begin() + first + 1));
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().kind, Event::Kind::kFinished);
  EXPECT_EQ(events.back().reason, FinishReason::kStopToken);
}

// Records are kept after a request finishes (callers read them) until forget(); forget() never drops a live one.
TEST_F(SchedulerTest, ForgetDropsOnlyFinishedRecords) {
  auto engine = make(SchedulerOptions());
  ASSERT_NE(engine, nullptr);
  Request r;
  r.prompt = slice(0, 12);
  r.max_new_tokens = 3;
  auto done = engine->submit(r), live = engine->submit(r);
  ASSERT_TRUE(done.ok() && live.ok());
  std::vector<Event> events;
  ASSERT_TRUE(engine->cancel(*live).ok());  // finished, but its kFinished event is still due
  engine->forget(*live);
  EXPECT_NE(engine->record(*live), nullptr);
  ASSERT_TRUE(engine->run_to_completion(&events).ok());
  engine->forget(*done);
  engine->forget(*live);
  EXPECT_EQ(engine->record(*done), nullptr);
  EXPECT_EQ(engine->record(*live), nullptr);
  auto running = engine->submit(r);
  ASSERT_TRUE(running.ok());
  ASSERT_TRUE(engine->step(&events).ok());
  engine->forget(*running);
  ASSERT_NE(engine->record(*running), nullptr);
  ASSERT_TRUE(engine->run_to_completion(&events).ok());
  EXPECT_EQ(engine->record(*running)->generated.size(), 3u);
}

TEST_F(SchedulerTest, CancelReleasesTheCache) {
  auto engine = make(SchedulerOptions());
  ASSERT_NE(engine, nullptr);
  Request a;
  a.prompt = slice(0, 40);
  a.max_new_tokens = 20;
  Request b = a;
  b.prompt = slice(1, 9);
  Request c = a;  // cancelled while still queued
  auto ia = engine->submit(a), ib = engine->submit(b), ic = engine->submit(c);
  ASSERT_TRUE(ia.ok() && ib.ok() && ic.ok());
  EXPECT_TRUE(engine->cancel(*ic).ok());
  std::vector<Event> events;
  ASSERT_TRUE(engine->step(&events).ok());
  ASSERT_TRUE(engine->step(&events).ok());
  EXPECT_EQ(engine->kv_stats().num_sequences, 2);
  EXPECT_TRUE(engine->cancel(*ia).ok());
  EXPECT_EQ(engine->kv_stats().num_sequences, 1);
  EXPECT_FALSE(engine->cancel(12345).ok());
  ASSERT_TRUE(engine->run_to_completion(&events).ok());
  EXPECT_EQ(engine->record(*ia)->reason, FinishReason::kCancelled);
  EXPECT_EQ(engine->record(*ic)->reason, FinishReason::kCancelled);
  EXPECT_TRUE(engine->record(*ic)->generated.empty());
  EXPECT_EQ(engine->record(*ib)->reason, FinishReason::kMaxTokens);
  EXPECT_EQ(engine->record(*ib)->generated.size(), 20u);
  int cancelled_events = 0;
  for (const Event& e : events) cancelled_events += e.kind == Event::Kind::kFinished && e.reason == FinishReason::kCancelled;
  EXPECT_EQ(cancelled_events, 2);
  EXPECT_EQ(engine->kv_stats().used_bytes, 0);
}

TEST_F(SchedulerTest, AdmissionWaitsForMemoryAndRejectsWhatCanNeverFit) {
  auto layout = kv::KvLayout::from_config(runner_->config(), 16);
  ASSERT_TRUE(layout.ok());
  SchedulerOptions options;
  options.kv_block_tokens = 16;
  // One request of up to 64 positions at a time.
  options.kv_budget_bytes = layout->fixed_bytes_per_sequence() + 4 * layout->block_bytes;
  auto engine = make(options);
  ASSERT_NE(engine, nullptr);
  Request too_big;
  too_big.prompt = slice(0, 61);
  too_big.max_new_tokens = 10;  // 71 positions: 5 blocks
  auto rejected = engine->submit(too_big);
  ASSERT_FALSE(rejected.ok());
  EXPECT_NE(rejected.status().message().find("more than the whole budget"), std::string::npos)
      << rejected.status().message();
  Request a;
  a.prompt = slice(0, 50);
  a.max_new_tokens = 6;
  Request b = a;
  b.prompt = slice(3, 40);
  auto ia = engine->submit(a), ib = engine->submit(b);
  ASSERT_TRUE(ia.ok() && ib.ok());
  std::vector<Event> events;
  ASSERT_TRUE(engine->step(&events).ok());
  EXPECT_EQ(engine->record(*ib)->status, RequestStatus::kQueued);  // waits: the budget holds one
  EXPECT_EQ(engine->kv_stats().num_sequences, 1);
  ASSERT_TRUE(engine->run_to_completion(&events).ok());
  EXPECT_EQ(engine->record(*ia)->generated, plan_greedy(*runner_, a.prompt, PrefillOptions(), 5).generated);
  EXPECT_EQ(engine->record(*ib)->generated, plan_greedy(*runner_, b.prompt, PrefillOptions(), 5).generated);
  EXPECT_EQ(engine->kv_stats().used_bytes, 0);
  // Global KV held by a finished request: whole 16-position blocks for 56 positions.
  EXPECT_EQ(engine->record(*ia)->global_kv_bytes, 4 * layout->block_bytes);
}

// Sequences grow as they go; when the budget cannot hold the running ones' next rows, the newest is preempted
// (its KV released) and recomputed later from its prompt and the tokens it had generated.
TEST_F(SchedulerTest, PreemptsTheNewestWhenSequencesOutgrowTheBudget) {
  auto layout = kv::KvLayout::from_config(runner_->config(), 16);
  ASSERT_TRUE(layout.ok());
  SchedulerOptions options;
  options.kv_block_tokens = 16;
  options.kv_budget_bytes = 2 * layout->fixed_bytes_per_sequence() + 5 * layout->block_bytes;
  auto engine = make(options);
  ASSERT_NE(engine, nullptr);
  Request a;
  a.prompt = slice(0, 30);  // 2 blocks, grows to 50 positions = 4 blocks
  a.max_new_tokens = 20;
  a.prefill.mode = PrefillMode::kExact;
  Request b = a;
  b.prompt = slice(5, 35);
  auto ia = engine->submit(a), ib = engine->submit(b);
  ASSERT_TRUE(ia.ok() && ib.ok());
  std::vector<Event> events;
  bool both_ran = false;
  int64_t preempted = 0;
  while (engine->has_work()) {
    ASSERT_TRUE(engine->step(&events).ok());
    both_ran |= engine->kv_stats().num_sequences == 2;
    preempted += engine->last_step().preempted;
    EXPECT_LE(engine->kv_stats().used_bytes, options.kv_budget_bytes);
  }
  EXPECT_TRUE(both_ran);
  EXPECT_GE(preempted, 1);
  const auto* ra = engine->record(*ia);
  const auto* rb = engine->record(*ib);
  EXPECT_EQ(ra->preemptions, 0);
  EXPECT_GE(rb->preemptions, 1);
  EXPECT_EQ(ra->reason, FinishReason::kMaxTokens);
  EXPECT_EQ(rb->reason, FinishReason::kMaxTokens);
  EXPECT_EQ(ra->generated, plan_greedy(*runner_, a.prompt, a.prefill, 19).generated);
  EXPECT_EQ(rb->generated, plan_greedy(*runner_, b.prompt, b.prefill, 19).generated);
  EXPECT_EQ(engine->kv_stats().used_bytes, 0);
}

TEST_F(SchedulerTest, RejectsBadRequests) {
  auto engine = make(SchedulerOptions());
  ASSERT_NE(engine, nullptr);
  Request r;
  EXPECT_FALSE(engine->submit(r).ok());  // empty prompt
  r.prompt = {1, 2, static_cast<int32_t>(runner_->config().vocab_size)};
  auto bad = engine->submit(r);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("index 2"), std::string::npos);
  r.prompt = {1, 2};
  r.max_new_tokens = 0;
  EXPECT_FALSE(engine->submit(r).ok());
  r.max_new_tokens = runner_->config().max_position_embeddings;
  EXPECT_FALSE(engine->submit(r).ok());
  EXPECT_FALSE(engine->has_work());
}

}  // namespace
}  // namespace dsflash::testing
