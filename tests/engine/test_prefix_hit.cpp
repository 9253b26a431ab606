// The prefix cache on the scheduler: a request whose prompt starts with a cached prefix maps the cached blocks
// (RAM tier, or read back from the SSD tier after a restart) and replays only the window before the hit through
// the encoder (Encoder SWA Bounded Replay, spec §7). Approximate by design: measured against a cold prefill.
// With no verified hit, everything is bit for bit a run without a cache.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "engine/scheduler.h"
#include "engine_test_util.h"
#include "prefix/fingerprint.h"
#include "prefix/prefix_cache.h"
#include "../prefix/prefix_test_util.h"

namespace dsflash::testing {
namespace {

using engine::Event;
using engine::Request;
using engine::RequestId;
using engine::Scheduler;
using engine::SchedulerOptions;

struct RequestRun {
  std::vector<float> first_logits;  // the prompt's last row
  std::vector<int32_t> generated;
  int64_t cached_tokens = 0;
};

class PrefixHitTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!goldens_present()) GTEST_SKIP() << "goldens not found under " << goldens_dir();
    runner_ = golden_runner(GetParam());
    ASSERT_NE(runner_, nullptr);
    auto fp = prefix::fingerprint_checkpoint(runner_->checkpoint());
    ASSERT_TRUE(fp.ok()) << fp.status().message();
    fingerprint_ = *fp;
    auto layout = kv::KvLayout::from_config(runner_->config());
    ASSERT_TRUE(layout.ok());
    layout_ = *layout;
  }
  std::unique_ptr<prefix::PrefixCache> make_cache(const std::string& dir = "") {
    prefix::PrefixCacheOptions options;
    options.cache_dir = dir;
    return std::make_unique<prefix::PrefixCache>(fingerprint_, layout_, options);
  }
  // A scheduler using `cache` (null: none); its KV manager holds the RAM tier for as long as it lives.
  std::unique_ptr<Scheduler> make_scheduler(prefix::PrefixCache* cache) {
    SchedulerOptions options;
    options.prefix_cache = cache;
    auto scheduler = Scheduler::create(runner_->weights(), runner_->context(), options);
    EXPECT_TRUE(scheduler.ok());
    return std::move(*scheduler);
  }
  // One request through `scheduler`, to completion.
  RequestRun run(Scheduler& scheduler, const std::vector<int32_t>& prompt, int64_t max_new) {
    Request r;
    r.prompt = prompt;
    r.max_new_tokens = max_new;
    r.return_logits = true;
    auto id = scheduler.submit(r);
    EXPECT_TRUE(id.ok()) << id.status().message();
    std::vector<Event> events;
    Status s = scheduler.run_to_completion(&events);
    EXPECT_TRUE(s.ok()) << s.message();
    RequestRun out;
    for (const Event& e : events) {
      if (e.kind == Event::Kind::kToken && out.first_logits.empty()) out.first_logits = e.logits;
    }
    out.generated = scheduler.record(*id)->generated;
    out.cached_tokens = scheduler.record(*id)->cached_tokens;
    return out;
  }
  // A cold run: a scheduler of its own without a cache.
  RequestRun cold(const std::vector<int32_t>& prompt, int64_t max_new) {
    auto scheduler = make_scheduler(nullptr);
    return run(*scheduler, prompt, max_new);
  }
  std::vector<int32_t> random_prompt(int64_t n, uint32_t seed) const {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> id(3, static_cast<int32_t>(runner_->config().vocab_size - 1));
    std::vector<int32_t> p(static_cast<size_t>(n));
    for (auto& t : p) t = id(rng);
    return p;
  }
  const ModelRunner* runner_ = nullptr;
  prefix::Fingerprint fingerprint_;
  kv::KvLayout layout_;
};

double kl_divergence(const std::vector<float>& p_logits, const std::vector<float>& q_logits) {
  auto log_softmax = [](const std::vector<float>& x) {
    double m = x[0];
    for (float v : x) m = std::max(m, static_cast<double>(v));
    double sum = 0;
    for (float v : x) sum += std::exp(v - m);
    std::vector<double> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] - m - std::log(sum);
    return out;
  };
  const auto lp = log_softmax(p_logits), lq = log_softmax(q_logits);
  double kl = 0;
  for (size_t i = 0; i < lp.size(); ++i) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
  return kl;
}

TEST_P(PrefixHitTest, ASecondRequestReusesTheFirstOnesBlocks) {
  auto cache = make_cache();
  auto scheduler = make_scheduler(cache.get());
  const std::vector<int32_t> first = random_prompt(300, 5);
  RequestRun a = run(*scheduler, first, 4);
  EXPECT_EQ(a.cached_tokens, 0);
  EXPECT_EQ(cache->stats().stored_blocks, 4);  // 300 prompt + 3 fed tokens: 4 whole blocks
  std::vector<int32_t> second = first;
  for (int32_t t : random_prompt(60, 6)) second.push_back(t);
  RequestRun hit = run(*scheduler, second, 4);
  RequestRun reference = cold(second, 4);
  EXPECT_EQ(hit.cached_tokens, 256);
  EXPECT_EQ(cache->stats().ram_hit_blocks, 4);
  // The first request's blocks are shared, not copied: the second allocated blocks only for its own suffix.
  ASSERT_EQ(hit.first_logits.size(), reference.first_logits.size());
  EXPECT_LT(kl_divergence(reference.first_logits, hit.first_logits), 0.05);
}

// Hit vs cold over random prompts of 300-900 tokens with hits at several H: top-1 agreement and mean KL, printed
// for the notes, with a bound. Bounded replay is approximate by design; the bound is 10x the measured mean.
TEST_P(PrefixHitTest, DeviationOfAHitFromAColdPrefill) {
  const int prompts = 12;
  int agree = 0, hits = 0;
  double kl_sum = 0, kl_max = 0;
  for (int p = 0; p < prompts; ++p) {
    auto cache = make_cache();
    auto scheduler = make_scheduler(cache.get());
    const int64_t n = 300 + 50 * p;
    const std::vector<int32_t> prompt = random_prompt(n, 100 + p);
    const int64_t prefix_len = 64 * (1 + p % 4) + 10 * (p % 3);  // hits of 64..256 tokens
    (void)run(*scheduler, std::vector<int32_t>(prompt.begin(), prompt.begin() + prefix_len + 1), 1);
    RequestRun hit = run(*scheduler, prompt, 1);
    RequestRun reference = cold(prompt, 1);
    hits += hit.cached_tokens > 0;
    agree += hit.generated[0] == reference.generated[0];
    const double kl = kl_divergence(reference.first_logits, hit.first_logits);
    kl_sum += kl;
    kl_max = std::max(kl_max, kl);
  }
  std::printf("[prefix hit vs cold] %s: %d prompts of 300-850 tokens, hits of 64-256 tokens: %d hits, top-1 %d/%d, "
              "mean KL %.3g nats, max %.3g\n",
              GetParam().c_str(), prompts, hits, agree, prompts, kl_sum / prompts, kl_max);
  EXPECT_EQ(hits, prompts);
  EXPECT_GE(agree, prompts - 2);
  EXPECT_LT(kl_sum / prompts, 2e-3);
}

TEST_P(PrefixHitTest, TheSsdTierServesAHitAfterARestartWithTheSameBytes) {
  ScratchDir dir;
  const std::vector<int32_t> prompt = random_prompt(400, 9);
  const std::vector<int32_t> first(prompt.begin(), prompt.begin() + 200);
  RequestRun ram_hit;
  {
    auto cache = make_cache(dir.path());
    auto scheduler = make_scheduler(cache.get());
    (void)run(*scheduler, first, 2);
    cache->flush();
    ram_hit = run(*scheduler, prompt, 2);
    EXPECT_EQ(cache->stats().disk_hit_blocks, 0);
    EXPECT_GT(cache->stats().disk.writes, 0);
  }
  // A restart: a new cache and scheduler (empty RAM) on the same directory, which also holds the blocks the
  // second request stored; the same prompt prefix of 200 tokens is asked for.
  auto restarted = make_cache(dir.path());
  auto scheduler = make_scheduler(restarted.get());
  RequestRun disk_hit = run(*scheduler, prompt, 2);
  EXPECT_EQ(ram_hit.cached_tokens, 192);
  EXPECT_EQ(disk_hit.cached_tokens, 384);  // the second request's own blocks were written too
  EXPECT_EQ(restarted->stats().disk_hit_blocks, 6);
  // The same hit length from the SSD as from RAM gives the same bytes and so the same logits.
  auto again = make_cache(dir.path());
  auto ram_only = make_scheduler(again.get());
  const std::vector<int32_t> shorter(prompt.begin(), prompt.begin() + 250);
  RequestRun from_disk = run(*ram_only, shorter, 2);
  auto warm_cache = make_cache();
  auto warm = make_scheduler(warm_cache.get());
  (void)run(*warm, first, 2);
  RequestRun from_ram = run(*warm, shorter, 2);
  EXPECT_EQ(from_disk.cached_tokens, 192);
  EXPECT_EQ(from_ram.cached_tokens, 192);
  EXPECT_EQ(count_mismatches(from_disk.first_logits, from_ram.first_logits), 0);
  EXPECT_EQ(from_disk.generated, from_ram.generated);
}

// A hit's replay (rows whose compressed entries are already cached, so the KV sources' compressor skips them) in
// the same forward as another request's decode rows: each gets what it gets alone, bit for bit.
TEST_P(PrefixHitTest, AHitReplayedInTheStepsOfAnotherDecodeGivesWhatItGivesAlone) {
  const std::vector<int32_t> first = random_prompt(300, 21);
  std::vector<int32_t> hit_prompt = first;
  for (int32_t t : random_prompt(50, 22)) hit_prompt.push_back(t);
  const std::vector<int32_t> other_prompt = random_prompt(40, 23);
  constexpr int64_t kHitTokens = 4, kOtherTokens = 12;

  auto alone_cache = make_cache();
  auto alone = make_scheduler(alone_cache.get());
  (void)run(*alone, first, 1);
  const RequestRun hit_alone = run(*alone, hit_prompt, kHitTokens);
  ASSERT_GT(hit_alone.cached_tokens, 0);
  const RequestRun other_alone = cold(other_prompt, kOtherTokens);

  auto cache = make_cache();
  auto scheduler = make_scheduler(cache.get());
  (void)run(*scheduler, first, 1);
  // The other request starts first and is decoding when the hit arrives.
  Request other;
  other.prompt = other_prompt;
  other.max_new_tokens = kOtherTokens;
  other.return_logits = true;
  auto other_id = scheduler->submit(other);
  ASSERT_TRUE(other_id.ok());
  std::vector<Event> events;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(scheduler->step(&events).ok());
  ASSERT_LT(scheduler->record(*other_id)->generated.size(), 4u);
  Request hit = other;
  hit.prompt = hit_prompt;
  hit.max_new_tokens = kHitTokens;
  auto hit_id = scheduler->submit(hit);
  ASSERT_TRUE(hit_id.ok());
  ASSERT_TRUE(scheduler->run_to_completion(&events).ok());
  std::vector<float> hit_first_logits;
  for (const Event& e : events) {
    if (e.kind == Event::Kind::kToken && e.id == *hit_id && hit_first_logits.empty()) hit_first_logits = e.logits;
  }
  EXPECT_EQ(scheduler->record(*hit_id)->cached_tokens, hit_alone.cached_tokens);
  EXPECT_EQ(count_mismatches(hit_first_logits, hit_alone.first_logits), 0);
  EXPECT_EQ(scheduler->record(*hit_id)->generated, hit_alone.generated);
  EXPECT_EQ(scheduler->record(*other_id)->generated, other_alone.generated);
}

TEST_P(PrefixHitTest, WithoutAVerifiedHitTheLogitsAreThoseOfARunWithoutACache) {
  ScratchDir dir;
  const std::vector<int32_t> prompt = random_prompt(400, 13);
  {
    auto cache = make_cache(dir.path());
    auto scheduler = make_scheduler(cache.get());
    (void)run(*scheduler, std::vector<int32_t>(prompt.begin(), prompt.begin() + 300), 1);
  }
  // Damage every record: one flipped byte each.
  int damaged = 0;
  for (const auto& sub : std::filesystem::recursive_directory_iterator(dir.path())) {
    if (sub.path().extension() != ".kvb") continue;
    std::fstream f(sub.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1000);
    f.put('\x5a');
    ++damaged;
  }
  ASSERT_GT(damaged, 0);
  auto cache = make_cache(dir.path());
  auto scheduler = make_scheduler(cache.get());
  RequestRun with_cache = run(*scheduler, prompt, 3);
  RequestRun without = cold(prompt, 3);
  EXPECT_EQ(with_cache.cached_tokens, 0);
  EXPECT_EQ(cache->stats().disk.corrupt_removed, 1);  // the first block's record fails: the lookup stops there
  EXPECT_EQ(count_mismatches(with_cache.first_logits, without.first_logits), 0);
  EXPECT_EQ(with_cache.generated, without.generated);
  // A cache of another model never hits either.
  prefix::PrefixCacheOptions options;
  options.cache_dir = dir.path();
  prefix::Fingerprint other = fingerprint_;
  other.low ^= 1;
  prefix::PrefixCache foreign(other, layout_, options);
  auto foreign_scheduler = make_scheduler(&foreign);
  RequestRun foreign_run = run(*foreign_scheduler, prompt, 3);
  EXPECT_EQ(foreign_run.cached_tokens, 0);
  EXPECT_EQ(count_mismatches(foreign_run.first_logits, without.first_logits), 0);
}

INSTANTIATE_TEST_SUITE_P(Goldens, PrefixHitTest, ::testing::Values("tiny-a", "tiny-b"));

}  // namespace
}  // namespace dsflash::testing
