// KvCacheManager: sequences grow as they go, reserve failures change nothing, exact byte accounting of fixed
// state + blocks, cached prefixes shared by refcount, committed blocks kept until the budget needs them.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "kv/kv_cache.h"
#include "kv_test_util.h"

namespace dsflash::kv {
namespace {

constexpr uint64_t kSeed = 1234;

using test::make_manager;
using test::small_layout;

std::vector<int32_t> prompt(int n, int32_t first = 0) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

TEST(KvSharing, FixedBytesAreEveryPartExactly) {
  const KvLayout l = small_layout();
  const int64_t rows = 7 * 8 * 528;          // 7 rings of 8 rows of 528 B
  const int64_t tags = 7 * 8 * 8;            // an int64 position per slot
  const int64_t tails = 2 * 2 * 512 * 4;     // L2: fp32 kv + score [2, 512]
  const int64_t engram = (2 + 1) * 8;        // 2 recent ids + the counter
  EXPECT_EQ(l.fixed_bytes_per_sequence(), rows + tags + tails + engram);
  EXPECT_EQ(l.block_bytes, 8 * (288 + 68) + 16 * (288 + 68));
}

TEST(KvSharing, OpenChargesOnlyFixedStateAndGrowsAsItGoes) {
  const KvLayout l = small_layout();
  const int64_t fixed = l.fixed_bytes_per_sequence();
  auto m = make_manager(l, fixed + 3 * l.block_bytes);
  auto seq = m->open_sequence();
  ASSERT_TRUE(seq.ok()) << seq.status().message();
  SequencePages& pages = (*seq)->pages();
  EXPECT_EQ(pages.num_blocks(), 0);
  EXPECT_EQ(m->used_bytes(), fixed);
  EXPECT_EQ((*seq)->fixed_bytes(), fixed);
  // Step by step: 10 prompt positions, then single decode positions.
  EXPECT_EQ(m->bytes_to_reserve(pages, 10), l.block_bytes);
  ASSERT_TRUE(m->reserve(pages, 10).ok());
  EXPECT_EQ(pages.num_blocks(), 1);
  for (int64_t n = 11; n <= 16; ++n) ASSERT_TRUE(m->reserve(pages, n).ok());
  EXPECT_EQ(pages.num_blocks(), 1);
  EXPECT_EQ(m->bytes_to_reserve(pages, 16), 0);
  ASSERT_TRUE(m->reserve(pages, 17).ok());
  EXPECT_EQ(pages.num_blocks(), 2);
  EXPECT_EQ(m->used_bytes(), fixed + 2 * l.block_bytes);
  EXPECT_EQ(m->free_bytes(), l.block_bytes);
  EXPECT_TRUE(m->can_reserve(pages, 48));
  EXPECT_FALSE(m->can_reserve(pages, 49));
}

TEST(KvSharing, ReserveFailureNamesBytesAndChangesNothing) {
  const KvLayout l = small_layout();
  const int64_t fixed = l.fixed_bytes_per_sequence();
  const int64_t budget = fixed + 3 * l.block_bytes + 17;
  auto m = make_manager(l, budget);
  auto seq = m->open_sequence();
  ASSERT_TRUE(seq.ok());
  SequencePages& pages = (*seq)->pages();
  ASSERT_TRUE(m->reserve(pages, 20).ok());
  const std::vector<int32_t> before = pages.block_ids();
  const KvStats st_before = m->stats();
  const Status s = m->reserve(pages, 60);  // 4 blocks: 2 more than fit
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(std::to_string(2 * l.block_bytes) + " B"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(std::to_string(l.block_bytes + 17) + " of " + std::to_string(budget) + " B free"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(pages.block_ids(), before);
  const KvStats st = m->stats();
  EXPECT_EQ(st.used_bytes, st_before.used_bytes);
  EXPECT_EQ(st.used_blocks, st_before.used_blocks);
  EXPECT_EQ(st.reserved_positions, 32);
  EXPECT_TRUE(m->reserve(pages, 48).ok());  // what does fit still works
}

TEST(KvSharing, SecondSequenceDoesNotFitBesideTheFirst) {
  const KvLayout l = small_layout();
  const int64_t fixed = l.fixed_bytes_per_sequence();
  auto m = make_manager(l, 2 * fixed - 1);
  auto a = m->open_sequence();
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(m->can_open());
  auto b = m->open_sequence();
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find(std::to_string(fixed) + " B of fixed state"), std::string::npos)
      << b.status().message();
  EXPECT_EQ(m->stats().num_sequences, 1);
  EXPECT_EQ(m->used_bytes(), fixed);
  ASSERT_TRUE(m->release(**a).ok());
  EXPECT_EQ(m->used_bytes(), 0);
  EXPECT_TRUE(m->open_sequence().ok());
}

// One sequence runs a prompt of 3 full blocks + 5 tokens and publishes its full blocks.
SequenceKv* run_and_commit(KvCacheManager& m, const std::vector<int32_t>& tokens) {
  auto seq = m.open_sequence();
  EXPECT_TRUE(seq.ok()) << seq.status().message();
  SequencePages& pages = (*seq)->pages();
  EXPECT_TRUE(m.reserve(pages, static_cast<int64_t>(tokens.size())).ok());
  for (int64_t b = 0; b < pages.num_blocks(); ++b) std::memset(pages.main_entry(1, b * 16), static_cast<int>(b + 1), 288);
  auto committed = m.commit_full_blocks(pages, tokens, kSeed);
  EXPECT_TRUE(committed.ok());
  EXPECT_EQ(*committed, static_cast<int64_t>(tokens.size()) / 16);
  return *seq;
}

TEST(KvSharing, CommitPublishesFullBlocksWithChainedHashes) {
  const KvLayout l = small_layout();
  auto m = make_manager(l, 64 << 20);
  const std::vector<int32_t> tokens = prompt(53);
  SequenceKv* seq = run_and_commit(*m, tokens);
  SequencePages& pages = seq->pages();
  EXPECT_EQ(pages.num_blocks(), 4);
  EXPECT_EQ(pages.num_frozen_blocks(), 3);
  EXPECT_EQ(pages.block_hashes(), hash_full_blocks(tokens, 16, kSeed));
  for (int b = 0; b < 3; ++b) EXPECT_EQ(m->pool().find_cached(pages.block_hashes()[b]), pages.block_ids()[b]);
  // Committing again does nothing; more tokens commit the next block, chained from the last.
  EXPECT_EQ(*m->commit_full_blocks(pages, tokens, kSeed), 0);
  const std::vector<int32_t> longer = prompt(64);
  EXPECT_EQ(*m->commit_full_blocks(pages, longer, kSeed), 1);
  EXPECT_EQ(pages.block_hashes(), hash_full_blocks(longer, 16, kSeed));
  // Blocks not reserved are not committed even if tokens say so.
  EXPECT_EQ(*m->commit_full_blocks(pages, prompt(100), kSeed), 0);
  EXPECT_FALSE(m->commit_full_blocks(pages, prompt(100), kSeed + 1).ok());  // another seed
  EXPECT_EQ(m->stats().committed_blocks, 4);
}

TEST(KvSharing, SecondSequenceSharesTheCachedPrefixWithoutNewMemory) {
  const KvLayout l = small_layout();
  const int64_t fixed = l.fixed_bytes_per_sequence();
  auto m = make_manager(l, 64 << 20);
  const std::vector<int32_t> tokens = prompt(53);
  SequenceKv* first = run_and_commit(*m, tokens);
  const int64_t used_before = m->used_bytes();
  // A second request: the same 48-token prefix, then its own tokens.
  std::vector<int32_t> other = prompt(48);
  for (int i = 0; i < 20; ++i) other.push_back(9000 + i);
  const std::vector<BlockHash> hashes = hash_full_blocks(other, 16, kSeed);
  ASSERT_EQ(hashes.size(), 4u);
  EXPECT_EQ(m->cached_prefix_blocks(hashes), 3);
  auto second = m->open_sequence();
  ASSERT_TRUE(second.ok());
  auto attached = m->attach_cached_prefix(**second, hashes, kSeed);
  ASSERT_TRUE(attached.ok()) << attached.status().message();
  EXPECT_EQ(*attached, 3);
  SequencePages& p2 = (*second)->pages();
  for (int b = 0; b < 3; ++b) {
    EXPECT_EQ(p2.block_ids()[b], first->pages().block_ids()[b]);
    EXPECT_EQ(m->block_refcount(p2.block_ids()[b]), 2);
    EXPECT_EQ(p2.main_entry(1, b * 16)[0], b + 1);  // the first sequence's bytes
  }
  EXPECT_EQ(m->used_bytes(), used_before + fixed);  // no block memory
  EXPECT_EQ(p2.num_frozen_blocks(), 3);
  EXPECT_EQ((*second)->num_positions(), 48);
  EXPECT_EQ((*second)->compressed(2)->num_entries(), 24);  // ratio 2
  EXPECT_EQ((*second)->compressed(4)->num_entries(), 48);  // ratio 1
  KvStats st = m->stats();
  EXPECT_EQ(st.shared_blocks, 3);
  EXPECT_EQ(st.used_blocks, 4);
  EXPECT_EQ(st.reserved_positions, 64 + 48);
  // It grows on its own blocks; committing continues the chain from the shared prefix.
  ASSERT_TRUE(m->reserve(p2, static_cast<int64_t>(other.size())).ok());
  EXPECT_EQ(*m->commit_full_blocks(p2, other, kSeed), 1);
  EXPECT_EQ(p2.block_hashes(), hashes);
  EXPECT_NE(p2.block_ids()[3], first->pages().block_ids()[3]);
  // Releasing the first keeps the shared blocks alive for the second.
  ASSERT_TRUE(m->release(*first).ok());
  for (int b = 0; b < 3; ++b) EXPECT_EQ(m->block_refcount(p2.block_ids()[b]), 1);
  EXPECT_EQ(p2.main_entry(1, 32)[0], 3);
  st = m->stats();
  EXPECT_EQ(st.shared_blocks, 0);
  EXPECT_EQ(st.cached_blocks, 0);  // the first's unshared blocks: block 3 was never full, so it is free
  EXPECT_EQ(st.used_blocks, 5);
}

TEST(KvSharing, AttachNeedsAnEmptyPageTableAndStopsAtTheFirstMiss) {
  const KvLayout l = small_layout();
  auto m = make_manager(l, 64 << 20);
  const std::vector<int32_t> tokens = prompt(53);
  (void)run_and_commit(*m, tokens);
  std::vector<BlockHash> hashes = hash_full_blocks(tokens, 16, kSeed);
  hashes[1] = BlockHash{1, 2};  // a miss in the middle: only block 0 is usable
  auto seq = m->open_sequence();
  ASSERT_TRUE(seq.ok());
  EXPECT_EQ(*m->attach_cached_prefix(**seq, hashes, kSeed), 1);
  EXPECT_FALSE(m->attach_cached_prefix(**seq, hashes, kSeed).ok());  // already has blocks
  auto other_seed = hash_full_blocks(tokens, 16, kSeed + 1);
  EXPECT_EQ(m->cached_prefix_blocks(other_seed), 0);
}

TEST(KvSharing, CachedBlocksSurviveReleaseAndAreEvictedUnderPressure) {
  const KvLayout l = small_layout();
  const int64_t fixed = l.fixed_bytes_per_sequence();
  // One sequence and 4 blocks.
  const int64_t budget = fixed + 4 * l.block_bytes;
  auto m = make_manager(l, budget);
  const std::vector<int32_t> tokens = prompt(53);
  SequenceKv* first = run_and_commit(*m, tokens);
  ASSERT_TRUE(m->release(*first).ok());
  KvStats st = m->stats();
  EXPECT_EQ(st.used_bytes, 0);
  EXPECT_EQ(st.cached_blocks, 3);
  EXPECT_EQ(st.cached_bytes, 3 * l.block_bytes);
  EXPECT_EQ(st.free_bytes, budget);  // cached blocks are reclaimable
  const std::vector<BlockHash> hashes = hash_full_blocks(tokens, 16, kSeed);
  EXPECT_EQ(m->cached_prefix_blocks(hashes), 3);

  // A different prompt needing 2 blocks: 1 free block + 1 eviction, the end of the chain first.
  auto seq = m->open_sequence();
  ASSERT_TRUE(seq.ok());
  ASSERT_TRUE(m->reserve((*seq)->pages(), 32).ok());
  EXPECT_EQ(m->stats().cached_blocks, 2);
  EXPECT_EQ(m->cached_prefix_blocks(hashes), 2);  // blocks 0 and 1 still usable
  ASSERT_TRUE(m->reserve((*seq)->pages(), 64).ok());  // all 4: the whole cache goes
  EXPECT_EQ(m->stats().cached_blocks, 0);
  EXPECT_EQ(m->cached_prefix_blocks(hashes), 0);
  EXPECT_EQ(m->stats().backing_bytes, 4 * l.block_bytes);
  EXPECT_FALSE(m->reserve((*seq)->pages(), 65).ok());
}

TEST(KvSharing, OpeningEvictsCachedBlocksThatNoLongerFitBesideTheFixedState) {
  const KvLayout l = small_layout();
  const int64_t fixed = l.fixed_bytes_per_sequence();
  // Two fixed states fit only if at most one block is held.
  const int64_t budget = 2 * fixed + 1 * l.block_bytes + 5;
  auto m = make_manager(l, budget);
  auto a = m->open_sequence();
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(m->reserve((*a)->pages(), 32).ok());  // budget - fixed holds 2 blocks (fixed > block)
  ASSERT_TRUE(m->commit_full_blocks((*a)->pages(), prompt(32), kSeed).ok());
  ASSERT_TRUE(m->release(**a).ok());
  EXPECT_EQ(m->stats().cached_blocks, 2);
  auto b = m->open_sequence();
  auto c = m->open_sequence();
  ASSERT_TRUE(b.ok() && c.ok());
  KvStats st = m->stats();
  EXPECT_EQ(st.cached_blocks, 1);  // block 1 (the chain's end) was evicted for c's fixed state
  EXPECT_EQ(m->cached_prefix_blocks(hash_full_blocks(prompt(32), 16, kSeed)), 1);
  EXPECT_LE(st.fixed_bytes + st.cached_bytes + st.global_bytes, budget);
  EXPECT_LE(st.backing_bytes + st.fixed_bytes, budget);
}

TEST(KvSharing, AccountingIsExactThroughALifecycle) {
  const KvLayout l = small_layout();
  const int64_t fixed = l.fixed_bytes_per_sequence();
  const int64_t budget = 3 * fixed + 9 * l.block_bytes + 123;
  auto m = make_manager(l, budget);
  auto check = [&](int64_t seqs, int64_t blocks, int64_t cached) {
    const KvStats st = m->stats();
    EXPECT_EQ(st.num_sequences, seqs);
    EXPECT_EQ(st.fixed_bytes, seqs * fixed);
    EXPECT_EQ(st.window_bytes, seqs * 7 * 8 * 528);
    EXPECT_EQ(st.global_bytes, blocks * l.block_bytes);
    EXPECT_EQ(st.used_bytes, seqs * fixed + blocks * l.block_bytes);
    EXPECT_EQ(st.free_bytes, budget - st.used_bytes);
    EXPECT_EQ(st.cached_bytes, cached * l.block_bytes);
    EXPECT_EQ(m->used_bytes(), st.used_bytes);
  };
  const std::vector<int32_t> tokens = prompt(40);
  SequenceKv* a = run_and_commit(*m, tokens);  // 3 blocks, 2 committed
  check(1, 3, 0);
  auto b = m->open_sequence();
  ASSERT_TRUE(b.ok());
  ASSERT_EQ(*m->attach_cached_prefix(**b, hash_full_blocks(tokens, 16, kSeed), kSeed), 2);
  check(2, 3, 0);  // shared blocks count once
  ASSERT_TRUE(m->reserve((*b)->pages(), 50).ok());
  check(2, 5, 0);
  auto c = m->open(30);
  ASSERT_TRUE(c.ok());
  check(3, 7, 0);
  ASSERT_TRUE(m->release(*a).ok());  // block 2 free; 0, 1 still held by b
  check(2, 6, 0);
  ASSERT_TRUE(m->release(**b).ok());  // 0, 1 become cached; b's own 2 blocks free
  check(1, 2, 2);
  ASSERT_TRUE(m->release(*c).ok());
  check(0, 0, 2);
}

TEST(KvSharing, ForeignAndReleasedSequencesAreRejected) {
  const KvLayout l = small_layout();
  auto a = make_manager(l, 64 << 20);
  auto b = make_manager(l, 64 << 20);
  auto seq = a->open_sequence();
  ASSERT_TRUE(seq.ok());
  EXPECT_FALSE(b->reserve((*seq)->pages(), 10).ok());
  EXPECT_FALSE(b->commit_full_blocks((*seq)->pages(), prompt(16), kSeed).ok());
  EXPECT_FALSE(b->attach_cached_prefix(**seq, {}, kSeed).ok());
  EXPECT_FALSE(b->release(**seq).ok());
  EXPECT_EQ(b->sequence(&(*seq)->pages()), nullptr);
  EXPECT_EQ(a->sequence(&(*seq)->pages()), *seq);
  EXPECT_TRUE(a->release(**seq).ok());
  EXPECT_EQ(a->stats().num_sequences, 0);
}

}  // namespace
}  // namespace dsflash::kv
