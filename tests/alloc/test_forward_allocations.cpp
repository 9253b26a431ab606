// No heap allocation inside a forward step (DESIGN.md, src/model): after one warm-up step of a shape, the call
// dsflash::forward(weights, batch, ctx, &out) with the caller's Workspace and a ForwardOutput reused from the
// warm-up allocates nothing, on any thread (the caller and the pool's workers). Measured region: exactly that
// call. Outside it (not measured): building the batch, reserving the KV pages (the forward never allocates KV).
//
// This binary replaces the global operator new / delete: every allocation, on every thread, bumps a counter
// while counting is switched on.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "engine/engine_test_util.h"

namespace {
std::atomic<bool> counting{false};
std::atomic<int64_t> allocations{0};

void* counted_alloc(size_t size, size_t alignment) {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
  if (size == 0) size = 1;
  void* p = alignment <= alignof(std::max_align_t) ? std::malloc(size)
                                                    : std::aligned_alloc(alignment, (size + alignment - 1) / alignment * alignment);
  return p;
}
}  // namespace

void* operator new(size_t size) {
  void* p = counted_alloc(size, 0);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void* operator new[](size_t size) { return operator new(size); }
void* operator new(size_t size, const std::nothrow_t&) noexcept { return counted_alloc(size, 0); }
void* operator new[](size_t size, const std::nothrow_t&) noexcept { return counted_alloc(size, 0); }
void* operator new(size_t size, std::align_val_t a) {
  void* p = counted_alloc(size, static_cast<size_t>(a));
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void* operator new[](size_t size, std::align_val_t a) { return operator new(size, a); }
// The replaced operator new above takes its memory from malloc / aligned_alloc, so free is the matching release;
// GCC sees a `new` expression's pointer reach std::free and warns regardless.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { std::free(p); }

namespace dsflash::testing {
namespace {

// Heap allocations (all threads) made by one forward call.
int64_t allocations_of_forward(const ModelRunner& runner, const ForwardBatch& batch, const ComputeContext& ctx,
                               ForwardOutput* out, Status* status) {
  allocations.store(0);
  counting.store(true);
  *status = dsflash::forward(runner.weights(), batch, ctx, out);
  counting.store(false);
  return allocations.load();
}

class ForwardAllocations : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    runner_ = golden_runner(GetParam());
    ASSERT_NE(runner_, nullptr);
    ctx_ = runner_->context();
    ASSERT_NE(ctx_.pool, nullptr);
    ctx_.workspace = &workspace_;
    prompt_ = golden_prompt(GetParam(), "rand.index_k_fix");
    ASSERT_GE(prompt_.size(), 24u);
  }
  // A sequence that has seen the first `length` prompt tokens, with KV room for `extra` more positions.
  kv::SequenceLease prefilled(int64_t length, int64_t extra) {
    auto lease = runner_->new_sequence();
    EXPECT_TRUE(lease.ok());
    SequenceState& seq = **lease;
    EXPECT_TRUE(seq.pages().reserve_positions(length + extra).ok());
    ForwardBatch batch;
    engine::add_exact(batch, seq, prompt_.data(), length, LogitsRows::kNone);
    EXPECT_TRUE(dsflash::forward(runner_->weights(), batch, ctx_, nullptr).ok());
    return std::move(*lease);
  }

  const ModelRunner* runner_ = nullptr;
  Workspace workspace_;
  ComputeContext ctx_;
  std::vector<int32_t> prompt_;
};

TEST_P(ForwardAllocations, DecodeStepsOfOneAndOfFourSequences) {
  for (const int batch_size : {1, 4}) {
    SCOPED_TRACE(batch_size);
    constexpr int kSteps = 6;  // one warm-up, then measured steps of the same shape
    std::vector<kv::SequenceLease> seqs;
    for (int b = 0; b < batch_size; ++b) seqs.push_back(prefilled(16 + 3 * b, kSteps));
    ForwardBatch batch;
    ForwardOutput out;
    for (int step = 0; step < kSteps; ++step) {
      batch.clear();
      for (int b = 0; b < batch_size; ++b) engine::add_decode_rows(batch, *seqs[static_cast<size_t>(b)], &prompt_[static_cast<size_t>(step + b)], 1, 0);
      Status status;
      const int64_t count = allocations_of_forward(*runner_, batch, ctx_, &out, &status);
      ASSERT_TRUE(status.ok()) << status.message();
      ASSERT_EQ(out.rows.size(), static_cast<size_t>(batch_size));
      if (step > 0) {
        EXPECT_EQ(count, 0) << "decode step " << step;
      }
    }
  }
}

TEST_P(ForwardAllocations, PrefillChunkOfAFixedShape) {
  constexpr int64_t kChunk = 8;
  ForwardOutput out;
  for (int rep = 0; rep < 3; ++rep) {
    // The same chunk shape each time: 8 rows after a 12-token prefix, logits of every row.
    kv::SequenceLease seq = prefilled(12, kChunk);
    ForwardBatch batch;
    engine::add_exact(batch, *seq, prompt_.data() + 12, kChunk, LogitsRows::kAll);
    Status status;
    const int64_t count = allocations_of_forward(*runner_, batch, ctx_, &out, &status);
    ASSERT_TRUE(status.ok()) << status.message();
    ASSERT_EQ(out.rows.size(), static_cast<size_t>(kChunk));
    if (rep > 0) {
      EXPECT_EQ(count, 0) << "prefill chunk " << rep;
    }
  }
  EXPECT_GT(workspace_.capacity_bytes(), 0u);
}

TEST(WorkspaceArena, GrowsOnceThenReusesItsMemory) {
  Arena arena;
  for (int step = 0; step < 3; ++step) {
    arena.reset();
    {
      ArenaScope scope(arena);
      auto a = arena.take<float>(100000);
      auto b = arena.take<uint8_t>(300000);
      a[0] = 1.0f;
      b[0] = 1;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % Arena::kAlignment, 0u);
    }
    auto c = arena.take<double>(50000);
    c[0] = 1.0;
    if (step == 0) {
      EXPECT_GE(arena.growths(), 1);
    }
  }
  const int64_t grown = arena.growths();
  allocations.store(0);
  counting.store(true);
  arena.reset();
  auto d = arena.take<float>(100000);
  counting.store(false);
  d[0] = 1.0f;
  EXPECT_EQ(arena.growths(), grown);
  EXPECT_EQ(allocations.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Goldens, ForwardAllocations, ::testing::Values("tiny-a", "tiny-b"));

}  // namespace
}  // namespace dsflash::testing
