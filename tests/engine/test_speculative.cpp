// Speculative decoding with the DSpark stages, through the scheduler (the one engine loop) on the golden tiny
// checkpoints (the only ones with trained-shape DSpark stages): greedy ids identical with and without speculation
// and the main model's caches equal to a plain run's after every step; batched, mixed with plain requests, and
// preempted speculating requests get what they get alone, sampled ones too (same seed); sampled speculation follows
// the target distribution (chi-square on the model's exact distribution); the speculative sampling rule and the adaptive draft policy.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <vector>

#include "engine/scheduler.h"
#include "engine/speculative.h"
#include "engine_test_util.h"
#include "model/dspark.h"

namespace dsflash::testing {
namespace {

using engine::DraftPolicy;
using engine::DraftPolicyOptions;
using engine::Event;
using engine::FinishReason;
using engine::Request;
using engine::RequestId;
using engine::Scheduler;
using engine::SchedulerOptions;

const DSpark* golden_dspark(const std::string& model) {
  static std::map<std::string, std::unique_ptr<DSpark>> bound;
  auto it = bound.find(model);
  if (it != bound.end()) return it->second.get();
  const ModelRunner* runner = golden_runner(model);
  if (runner == nullptr) return nullptr;
  auto dspark = DSpark::bind(runner->checkpoint(), runner->weights());
  if (!dspark.ok()) {
    ADD_FAILURE() << dspark.status().message();
    return nullptr;
  }
  return (bound[model] = std::move(*dspark)).get();
}

std::unique_ptr<Scheduler> make_scheduler(const std::string& model, SchedulerOptions options) {
  options.dspark = golden_dspark(model);
  auto s = Scheduler::create(golden_runner(model)->weights(), golden_runner(model)->context(), options);
  EXPECT_TRUE(s.ok()) << s.status().message();
  return s.ok() ? std::move(*s) : nullptr;
}

struct GreedyCase {
  std::string model;
  PrefillMode mode;
};

class SpeculativeGreedyTest : public ::testing::TestWithParam<GreedyCase> {};

TEST_P(SpeculativeGreedyTest, IdsAndCachesEqualAPlainRunAfterEveryStep) {
  if (!goldens_present()) GTEST_SKIP() << "goldens not present";
  const GreedyCase& c = GetParam();
  const ModelRunner* runner = golden_runner(c.model);
  ASSERT_NE(runner, nullptr);
  std::vector<int32_t> prompt = golden_prompt(c.model, "rand.index_k_fix");
  prompt.resize(std::min<size_t>(prompt.size(), 40));
  const int64_t max_new = 25;
  PrefillOptions plan;
  plan.mode = c.mode;
  const PlanRun plain = plan_greedy(*runner, prompt, plan, max_new - 1, 0, /*keep_states=*/true);
  const int n_layers = runner->config().n_layers;
  for (int k : {1, 3, 5}) {
    auto scheduler = make_scheduler(c.model, SchedulerOptions());
    ASSERT_NE(scheduler, nullptr);
    Request r;
    r.prompt = prompt;
    r.max_new_tokens = max_new;
    r.prefill = plan;
    r.speculative = k;
    r.speculative_adaptive = false;  // verify k drafts every step: the rollback runs on every step
    auto id = scheduler->submit(r);
    ASSERT_TRUE(id.ok()) << id.status().message();
    std::vector<Event> events;
    while (scheduler->has_work()) {
      ASSERT_TRUE(scheduler->step(&events).ok());
      const SequenceState* seq = scheduler->sequence(*id);
      if (seq == nullptr || scheduler->record(*id)->generated.empty()) continue;
      // After the step the sequence has processed the prompt and every generated id but the last.
      const int64_t fed = seq->num_positions() - static_cast<int64_t>(prompt.size());
      ASSERT_EQ(fed + 1, static_cast<int64_t>(scheduler->record(*id)->generated.size()));
      ASSERT_LT(fed, static_cast<int64_t>(plain.states.size()));
      expect_same_state(*seq, *plain.states[static_cast<size_t>(fed)], c.model + " k " + std::to_string(k) +
                                                                          " after " + std::to_string(fed), n_layers);
      // The DSpark rings hold only accepted rows: no slot is tagged with a position the sequence has not kept.
      for (int l = n_layers; l < seq->num_layers(); ++l) {
        for (int slot = 0; slot < seq->window(l).window(); ++slot) EXPECT_LT(seq->window(l).slot_position(slot), seq->num_positions());
      }
    }
    const auto* rec = scheduler->record(*id);
    EXPECT_EQ(rec->generated, plain.generated) << c.model << " k " << k;
    EXPECT_GT(rec->speculation.draft_tokens, 0);
    EXPECT_LE(rec->speculation.draft_tokens, rec->speculation.decode_steps * k);
    EXPECT_EQ(static_cast<int64_t>(rec->generated.size()) - 1,
              rec->speculation.decode_steps + rec->speculation.accepted_tokens);
    EXPECT_EQ(scheduler->kv_stats().num_sequences, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, SpeculativeGreedyTest,
                         ::testing::Values(GreedyCase{"tiny-a", PrefillMode::kExact},
                                           GreedyCase{"tiny-a", PrefillMode::kBoundedReplay},
                                           GreedyCase{"tiny-b", PrefillMode::kExact},
                                           GreedyCase{"tiny-b", PrefillMode::kBoundedReplay}),
                         [](const auto& info) {
                           return std::string(info.param.model == "tiny-a" ? "TinyA" : "TinyB") +
                                  (info.param.mode == PrefillMode::kExact ? "Exact" : "BoundedReplay");
                         });

class SpeculativeSchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!goldens_present()) GTEST_SKIP() << "goldens not present";
    runner_ = golden_runner("tiny-a");
    ASSERT_NE(runner_, nullptr);
    prompt_ = golden_prompt("tiny-a", "rand.index_k_fix");
    ASSERT_GE(prompt_.size(), 40u);
  }
  std::vector<int32_t> slice(size_t from, size_t to) const {
    return std::vector<int32_t>(prompt_.begin() + static_cast<int64_t>(from), prompt_.begin() + static_cast<int64_t>(to));
  }
  // The ids a request gets alone without speculation.
  std::vector<int32_t> alone(Request r) {
    r.speculative = 0;
    auto scheduler = make_scheduler("tiny-a", SchedulerOptions());
    auto id = scheduler->submit(r);
    EXPECT_TRUE(id.ok());
    std::vector<Event> events;
    EXPECT_TRUE(scheduler->run_to_completion(&events).ok());
    return scheduler->record(*id)->generated;
  }
  const ModelRunner* runner_ = nullptr;
  std::vector<int32_t> prompt_;
};

TEST_F(SpeculativeSchedulerTest, BatchedWithPlainRequestsEachGetsWhatItGetsAlone) {
  SchedulerOptions options;
  options.prefill_tokens_per_step = 11;  // chunked prefills mixed with verification rows
  auto scheduler = make_scheduler("tiny-a", options);
  ASSERT_NE(scheduler, nullptr);
  std::vector<Request> requests(5);
  requests[0].prompt = slice(0, 37);
  requests[0].speculative = 4;
  requests[0].speculative_adaptive = false;
  requests[1].prompt = slice(3, 20);
  requests[1].speculative = 2;
  requests[1].speculative_adaptive = false;
  requests[2].prompt = slice(8, 30);  // plain
  requests[3].prompt = slice(1, 25);
  requests[3].speculative = 5;        // adaptive
  requests[4].prompt = slice(2, 33);
  requests[4].speculative = 3;
  requests[4].speculative_adaptive = false;
  requests[4].sampling.repetition_penalty = 1.5f;  // greedy with penalties: verification sees the same counts
  requests[4].sampling.frequency_penalty = 0.5f;
  requests[1].prefill.mode = PrefillMode::kExact;
  std::vector<RequestId> ids;
  for (size_t i = 0; i < requests.size(); ++i) {
    requests[i].max_new_tokens = 12 + static_cast<int64_t>(i);
    auto id = scheduler->submit(requests[i]);
    ASSERT_TRUE(id.ok()) << id.status().message();
    ids.push_back(*id);
  }
  std::vector<Event> events;
  int64_t max_batch = 0, drafts = 0;
  while (scheduler->has_work()) {
    ASSERT_TRUE(scheduler->step(&events).ok());
    max_batch = std::max(max_batch, scheduler->last_step().decode_batch);
    drafts += scheduler->last_step().draft_tokens;
  }
  EXPECT_GE(max_batch, 3);
  EXPECT_GT(drafts, 0);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(scheduler->record(ids[i])->generated, alone(requests[i])) << "request " << i;
  }
  // Token events come in order, one per generated id.
  std::map<RequestId, std::vector<int32_t>> streamed;
  for (const Event& e : events) {
    if (e.kind == Event::Kind::kToken) streamed[e.id].push_back(e.token);
  }
  for (RequestId id : ids) EXPECT_EQ(streamed[id], scheduler->record(id)->generated);
  EXPECT_EQ(scheduler->kv_stats().num_sequences, 0);
}

// Seeded sampled speculation (drafts drawn from q, accepted with min(1, p/q) or resampled) draws from each
// request's own generator only: batched with other requests, a request gets the ids it gets alone with the same
// seed and the same speculation.
TEST_F(SpeculativeSchedulerTest, SampledSpeculatingRequestsBatchedGetWhatTheyGetAlone) {
  std::vector<Request> requests(3);
  for (size_t i = 0; i < requests.size(); ++i) {
    requests[i].prompt = slice(i, 14 + 3 * i);
    requests[i].max_new_tokens = 10;
    requests[i].sampling.temperature = 0.9f;
    requests[i].sampling.top_k = 8;
    requests[i].sampling.seed = 7 + i;
    requests[i].speculative = 3;
    requests[i].speculative_adaptive = false;
  }
  requests[2].sampling.top_p = 0.8f;
  auto run = [](const std::vector<Request>& batch) {
    auto scheduler = make_scheduler("tiny-a", SchedulerOptions());
    std::vector<RequestId> ids;
    for (const Request& r : batch) ids.push_back(*scheduler->submit(r));
    std::vector<Event> events;
    EXPECT_TRUE(scheduler->run_to_completion(&events).ok());
    std::vector<std::vector<int32_t>> generated;
    int64_t drafts = 0;
    for (RequestId id : ids) {
      generated.push_back(scheduler->record(id)->generated);
      drafts += scheduler->record(id)->speculation.draft_tokens;
    }
    EXPECT_GT(drafts, 0);
    return generated;
  };
  const auto batched = run(requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(batched[i], run({requests[i]})[0]) << "request " << i;
    EXPECT_EQ(batched[i].size(), 10u);
  }
}

// The default (adaptive) policy over a long generation: it may switch itself off, skip feeding the drafter during
// the gap and re-probe with rings fed only in the window before; the ids stay those of a plain run.
TEST_F(SpeculativeSchedulerTest, AdaptiveRequestSwitchesOffReprobesAndStaysLossless) {
  Request r;
  r.prompt = slice(0, 20);
  r.max_new_tokens = 180;
  r.speculative = 4;
  auto scheduler = make_scheduler("tiny-a", SchedulerOptions());
  auto id = scheduler->submit(r);
  ASSERT_TRUE(id.ok());
  std::vector<Event> events;
  ASSERT_TRUE(scheduler->run_to_completion(&events).ok());
  const auto* rec = scheduler->record(*id);
  EXPECT_EQ(rec->reason, FinishReason::kMaxTokens);
  EXPECT_EQ(rec->generated, alone(r));
  EXPECT_GT(rec->speculation.draft_tokens, 0);
  std::printf("adaptive over %lld decode steps: %lld drafts verified, %lld accepted\n",
              static_cast<long long>(rec->speculation.decode_steps), static_cast<long long>(rec->speculation.draft_tokens),
              static_cast<long long>(rec->speculation.accepted_tokens));
}

TEST_F(SpeculativeSchedulerTest, StopIdAndMaxTokensCutAVerifiedBlock) {
  Request r;
  r.prompt = slice(0, 30);
  r.max_new_tokens = 16;
  const std::vector<int32_t> plain = alone(r);
  r.speculative = 5;
  r.speculative_adaptive = false;
  r.stop_ids = {plain[6]};  // may sit inside an accepted block: nothing after it may be emitted
  auto scheduler = make_scheduler("tiny-a", SchedulerOptions());
  auto id = scheduler->submit(r);
  ASSERT_TRUE(id.ok());
  std::vector<Event> events;
  ASSERT_TRUE(scheduler->run_to_completion(&events).ok());
  const auto* rec = scheduler->record(*id);
  const auto first_stop = std::find(plain.begin(), plain.end(), plain[6]);
  EXPECT_EQ(rec->generated, std::vector<int32_t>(plain.begin(), first_stop + 1));
  EXPECT_EQ(rec->reason, FinishReason::kStopToken);
  r.stop_ids.clear();
  r.max_new_tokens = 7;  // never more than max_new_tokens, whatever the block
  id = scheduler->submit(r);
  ASSERT_TRUE(scheduler->run_to_completion(&events).ok());
  EXPECT_EQ(scheduler->record(*id)->generated, std::vector<int32_t>(plain.begin(), plain.begin() + 7));
}

TEST_F(SpeculativeSchedulerTest, PreemptedSpeculatingRequestsGetTheIdsOfAnUninterruptedRun) {
  auto layout = kv::KvLayout::from_config(runner_->config(), 16);
  ASSERT_TRUE(layout.ok());
  SchedulerOptions options;
  options.kv_block_tokens = 16;
  options.kv_budget_bytes = 2 * layout->fixed_bytes_per_sequence() + 5 * layout->block_bytes;
  auto scheduler = make_scheduler("tiny-a", options);
  ASSERT_NE(scheduler, nullptr);
  Request a;
  a.prompt = slice(0, 30);
  a.max_new_tokens = 20;
  a.speculative = 3;
  a.speculative_adaptive = false;
  Request b = a;
  b.prompt = slice(5, 35);
  auto ia = scheduler->submit(a), ib = scheduler->submit(b);
  ASSERT_TRUE(ia.ok() && ib.ok());
  std::vector<Event> events;
  int64_t preempted = 0;
  while (scheduler->has_work()) {
    ASSERT_TRUE(scheduler->step(&events).ok());
    preempted += scheduler->last_step().preempted;
    EXPECT_LE(scheduler->kv_stats().used_bytes, options.kv_budget_bytes);
  }
  EXPECT_GE(preempted, 1);
  EXPECT_GE(scheduler->record(*ib)->preemptions, 1);
  EXPECT_EQ(scheduler->record(*ia)->generated, alone(a));
  EXPECT_EQ(scheduler->record(*ib)->generated, alone(b));
  EXPECT_EQ(scheduler->kv_stats().used_bytes, 0);
}

TEST_F(SpeculativeSchedulerTest, RejectsWhatItCannotDo) {
  Request r;
  r.prompt = slice(0, 10);
  r.speculative = -1;
  auto with = make_scheduler("tiny-a", SchedulerOptions());
  EXPECT_FALSE(with->submit(r).ok());
  r.speculative = 2;
  r.follow = {1, 2};
  EXPECT_FALSE(with->submit(r).ok());
  r.follow.clear();
  auto without = Scheduler::create(runner_->weights(), runner_->context(), SchedulerOptions());
  ASSERT_TRUE(without.ok());
  auto refused = (*without)->submit(r);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("DSpark"), std::string::npos) << refused.status().message();
}

// The sampling distribution of sampling.h steps 3 (temperature, top-k) on one row, written out independently.
std::vector<double> top_k_softmax(const float* logits, int64_t vocab, float temperature, int top_k) {
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) order[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  std::vector<double> p(static_cast<size_t>(vocab), 0.0);
  double total = 0.0;
  for (int i = 0; i < top_k; ++i) {
    const int32_t id = order[static_cast<size_t>(i)];
    total += p[static_cast<size_t>(id)] = std::exp((static_cast<double>(logits[id]) - logits[order[0]]) / temperature);
  }
  for (double& v : p) v /= total;
  return p;
}

// Many seeds, one short prompt: the first id comes from the prefill row, the second from the first verification
// (its draft accepted with min(1, p/q) or resampled from the residual). Given the first id, the second must follow
// the model's exact next-token distribution p(. | prompt, first).
TEST_F(SpeculativeSchedulerTest, SampledSpeculationFollowsTheTargetDistribution) {
  SchedulerOptions options;
  options.max_running = 64;
  auto scheduler = make_scheduler("tiny-a", options);
  ASSERT_NE(scheduler, nullptr);
  const std::vector<int32_t> prompt = slice(0, 6);
  const float temperature = 1.0f;
  const int top_k = 6;
  const int64_t trials = 1200;
  std::vector<RequestId> ids;
  for (int64_t t = 0; t < trials; ++t) {
    Request r;
    r.prompt = prompt;
    r.max_new_tokens = 3;  // the first id from the prefill, then a verification of one draft
    r.sampling.temperature = temperature;
    r.sampling.top_k = top_k;
    r.sampling.seed = 1000 + static_cast<uint64_t>(t);
    r.speculative = 3;
    r.speculative_adaptive = false;
    auto id = scheduler->submit(r);
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
  }
  std::vector<Event> events;
  int64_t drafts = 0, accepted = 0;
  while (scheduler->has_work()) {
    ASSERT_TRUE(scheduler->step(&events).ok());
    drafts += scheduler->last_step().draft_tokens;
    accepted += scheduler->last_step().accepted_tokens;
  }
  EXPECT_EQ(drafts, trials);  // 3 tokens: one verification of one draft (the tokens after it must be 2)
  std::map<int32_t, std::map<int32_t, int64_t>> second_given_first;
  for (RequestId id : ids) {
    const auto& g = scheduler->record(id)->generated;
    ASSERT_EQ(g.size(), 3u);
    ++second_given_first[g[0]][g[1]];
  }
  // Chi-square over the first ids seen at least 150 times, each against the exact distribution after it.
  const int64_t vocab = runner_->config().vocab_size;
  double chi2 = 0.0;
  int dof = 0, tested = 0;
  for (const auto& [first, counts] : second_given_first) {
    int64_t n = 0;
    for (const auto& [id, count] : counts) n += count;
    if (n < 150) continue;
    ++tested;
    std::vector<int32_t> context = prompt;
    context.push_back(first);
    auto seq = runner_->new_sequence();
    ASSERT_TRUE(seq.ok());
    std::vector<float> logits;
    ASSERT_TRUE(runner_->forward(context, **seq, LogitsRows::kLast, &logits).ok());
    const std::vector<double> p = top_k_softmax(logits.data(), vocab, temperature, top_k);
    for (int64_t v = 0; v < vocab; ++v) {
      const auto it = counts.find(static_cast<int32_t>(v));
      const double observed = it == counts.end() ? 0.0 : static_cast<double>(it->second);
      if (p[static_cast<size_t>(v)] == 0.0) {
        EXPECT_EQ(observed, 0.0) << "an id outside the target's support after " << first;
        continue;
      }
      const double expected = p[static_cast<size_t>(v)] * static_cast<double>(n);
      chi2 += (observed - expected) * (observed - expected) / expected;
      ++dof;
    }
    --dof;
  }
  ASSERT_GE(tested, 1);
  // The upper 1e-4 tail of chi-square with dof degrees of freedom, by the Wilson-Hilferty approximation.
  const double z = 3.719;
  const double bound = dof * std::pow(1.0 - 2.0 / (9.0 * dof) + z * std::sqrt(2.0 / (9.0 * dof)), 3.0);
  std::printf("chi-square %.1f over %d degrees of freedom (bound %.1f), %d first ids, %lld of %lld drafts accepted\n",
              chi2, dof, bound, tested, static_cast<long long>(accepted), static_cast<long long>(drafts));
  EXPECT_LT(chi2, bound) << "dof " << dof << ", " << tested << " first ids, accepted " << accepted << " of " << drafts;
}

// The rejection rule alone on fixed distributions: the emitted id follows p whatever q is.
TEST(SpeculativeAccept, EmittedIdFollowsTheTarget) {
  const int64_t vocab = 5, trials = 200000;
  const std::vector<double> p = {0.40, 0.25, 0.20, 0.10, 0.05};
  const std::vector<double> q = {0.05, 0.50, 0.05, 0.30, 0.10};
  std::mt19937_64 rng(1234);
  std::discrete_distribution<int32_t> draft(q.begin(), q.end());
  std::vector<int64_t> counts(vocab, 0);
  int64_t accepted = 0;
  for (int64_t t = 0; t < trials; ++t) {
    const int32_t x = draft(rng);
    int32_t out = -1;
    accepted += speculative_accept(p.data(), q.data(), x, vocab, rng, &out) ? 1 : 0;
    ++counts[static_cast<size_t>(out)];
  }
  double chi2 = 0.0;
  for (int64_t v = 0; v < vocab; ++v) {
    const double e = p[static_cast<size_t>(v)] * static_cast<double>(trials);
    chi2 += (static_cast<double>(counts[static_cast<size_t>(v)]) - e) * (static_cast<double>(counts[static_cast<size_t>(v)]) - e) / e;
  }
  EXPECT_LT(chi2, 23.5);  // 4 degrees of freedom: P(chi2 > 23.5) ~ 1e-4
  // Acceptance probability = sum_x min(p, q) = 0.05 + 0.25 + 0.05 + 0.10 + 0.05 = 0.5.
  EXPECT_NEAR(static_cast<double>(accepted) / trials, 0.5, 0.01);
}

TEST(DraftPolicy, ShrinksOnRejectionGrowsOnAcceptanceTurnsOffAndBacksOff) {
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
  auto fail_probe = [&] {  // three misses in a row turn it off before the probe window is full
    for (int i = 0; i < 3; ++i) policy.record(1, 0);
  };
  auto plain_steps = [&] {
    int plain = 0;
    while (policy.draft_length(confident.data(), 5) == 0 && plain < 1000) ++plain;
    return plain;
  };
  fail_probe();  // nothing accepted: off
  EXPECT_FALSE(policy.active());
  EXPECT_EQ(plain_steps(), 10);  // then a re-probe at k = 1
  fail_probe();
  EXPECT_EQ(plain_steps(), 20);  // each failed re-probe doubles the gap
  fail_probe();
  EXPECT_EQ(plain_steps(), 40);
  for (int i = 0; i < 4; ++i) policy.record(1, 1);  // a probe that pays resets the gap
  EXPECT_TRUE(policy.active());
  fail_probe();
  EXPECT_EQ(plain_steps(), 10);
}

// A drafter that is never confident enough: its blocks are cut to nothing, which counts as misses, so it is
// switched off instead of drafting every step for nothing.
TEST(DraftPolicy, BlocksCutToNothingSwitchItOff) {
  DraftPolicyOptions options;
  options.max_draft = 3;
  options.off_steps = 10;
  DraftPolicy policy(options);
  const std::vector<float> unsure(5, -20.0f);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(policy.draft_length(unsure.data(), 5), 0);
  EXPECT_FALSE(policy.active());
  int plain = 0;
  while (!policy.active() && plain < 100) {
    EXPECT_EQ(policy.draft_length(unsure.data(), 5), 0);
    ++plain;
  }
  EXPECT_EQ(plain, 10);
}

TEST(DraftPolicy, FixedLengthIgnoresConfidenceAndNeverTurnsOff) {
  DraftPolicyOptions options;
  options.max_draft = 3;
  options.adaptive = false;
  DraftPolicy policy(options);
  const std::vector<float> unsure(5, -20.0f);
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(policy.draft_length(unsure.data(), 5), 3);
    policy.record(3, 0);
  }
}

}  // namespace
}  // namespace dsflash::testing
