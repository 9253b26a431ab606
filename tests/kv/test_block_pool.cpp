// BlockPool: reference counts, chained block hashes, the hash -> block cache and its LRU eviction.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>

#include <numeric>
#include <set>
#include <vector>

#include "kv/block_hash.h"
#include "kv/block_pool.h"

namespace dsflash::kv {
namespace {

std::vector<int32_t> tokens(int32_t first, int n = 64) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

BlockHash hash_of(int32_t first, const BlockHash& parent = kRootBlockHash, uint64_t seed = 7) {
  const std::vector<int32_t> t = tokens(first);
  return compute_block_hash(parent, t, seed);
}

TEST(BlockHash, SameInputsSameHash) {
  EXPECT_EQ(hash_of(0), hash_of(0));
  const BlockHash a = hash_of(0);
  EXPECT_EQ(hash_of(64, a), hash_of(64, a));
  EXPECT_NE(hash_of(0), kRootBlockHash);
}

TEST(BlockHash, AnyChangeChangesTheHash) {
  const BlockHash base = hash_of(0);
  std::vector<int32_t> t = tokens(0);
  t[63] = 1000;  // last token
  EXPECT_NE(compute_block_hash(kRootBlockHash, t, 7), base);
  t = tokens(0);
  t[0] = 1;  // first token
  EXPECT_NE(compute_block_hash(kRootBlockHash, t, 7), base);
  EXPECT_NE(hash_of(0, kRootBlockHash, 8), base);                 // seed
  EXPECT_NE(hash_of(0, BlockHash{1, 0}, 7), base);                // parent low word
  EXPECT_NE(hash_of(0, BlockHash{0, 1}, 7), base);                // parent high word
  EXPECT_NE(compute_block_hash(kRootBlockHash, tokens(0, 63), 7), base);  // length
}

TEST(BlockHash, ChainDependsOnEveryEarlierBlock) {
  // Same second block after different first blocks: different hashes.
  EXPECT_NE(hash_of(64, hash_of(0)), hash_of(64, hash_of(1)));
  // hash_full_blocks chains exactly like compute_block_hash and ignores a partial last block.
  std::vector<int32_t> prompt = tokens(0, 64 * 3 + 10);
  const std::vector<BlockHash> h = hash_full_blocks(prompt, 64, 7);
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(h[0], hash_of(0));
  EXPECT_EQ(h[1], hash_of(64, h[0]));
  EXPECT_EQ(h[2], hash_of(128, h[1]));
  prompt[100] = -5;  // inside block 1: block 0 keeps its hash, blocks 1 and 2 change
  const std::vector<BlockHash> g = hash_full_blocks(prompt, 64, 7);
  EXPECT_EQ(g[0], h[0]);
  EXPECT_NE(g[1], h[1]);
  EXPECT_NE(g[2], h[2]);
  EXPECT_TRUE(hash_full_blocks(tokens(0, 63), 64, 7).empty());
}

TEST(BlockPool, RetainAndReleaseCountReferences) {
  BlockPool pool(100, 4);
  auto a = pool.allocate(2);
  ASSERT_TRUE(a.ok());
  const int32_t b = (*a)[0];
  EXPECT_EQ(pool.refcount(b), 1);
  ASSERT_TRUE(pool.retain(b).ok());
  ASSERT_TRUE(pool.retain(b).ok());
  EXPECT_EQ(pool.refcount(b), 3);
  EXPECT_EQ(pool.used_blocks(), 2);  // counted once however many references
  EXPECT_EQ(pool.shared_blocks(), 1);
  ASSERT_TRUE(pool.release(b).ok());
  ASSERT_TRUE(pool.release(b).ok());
  EXPECT_EQ(pool.shared_blocks(), 0);
  EXPECT_TRUE(pool.in_use(b));
  ASSERT_TRUE(pool.release(b).ok());
  EXPECT_FALSE(pool.in_use(b));
  EXPECT_EQ(pool.used_blocks(), 1);
  EXPECT_EQ(pool.free_blocks(), 3);
}

TEST(BlockPool, DoubleReleaseIsAnError) {
  BlockPool pool(100, 4);
  auto a = pool.allocate(1);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(pool.release((*a)[0]).ok());
  const Status again = pool.release((*a)[0]);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.message().find("not in use"), std::string::npos) << again.message();
  EXPECT_FALSE(pool.retain((*a)[0]).ok());  // a free, unhashed block cannot be taken back
  EXPECT_FALSE(pool.retain(42).ok());
  EXPECT_FALSE(pool.release(-1).ok());
  EXPECT_EQ(pool.used_blocks(), 0);
}

TEST(BlockPool, ListReleaseIsAllOrNothingAgainstRefcounts) {
  BlockPool pool(100, 4);
  auto a = pool.allocate(2);
  ASSERT_TRUE(a.ok());
  const int32_t x = (*a)[0], y = (*a)[1];
  ASSERT_TRUE(pool.retain(x).ok());                  // x: 2 references
  EXPECT_TRUE(pool.release({x, x}).ok());            // both references
  EXPECT_FALSE(pool.in_use(x));
  EXPECT_FALSE(pool.release({y, y}).ok());           // y has only one: nothing released
  EXPECT_EQ(pool.refcount(y), 1);
  EXPECT_FALSE(pool.release({y, x}).ok());           // x is free: y stays
  EXPECT_EQ(pool.refcount(y), 1);
}

TEST(BlockPool, CommittedBlockIsFoundAndSharedWithoutNewMemory) {
  BlockPool pool(100, 4);
  auto a = pool.allocate(1);
  ASSERT_TRUE(a.ok());
  const int32_t b = (*a)[0];
  const BlockHash h = hash_of(0);
  EXPECT_FALSE(pool.find_cached(h).has_value());
  ASSERT_TRUE(pool.commit_block(b, h).ok());
  EXPECT_FALSE(pool.commit_block(b, hash_of(1)).ok());  // already committed
  ASSERT_EQ(pool.find_cached(h), b);
  EXPECT_EQ(pool.block_hash(b), h);
  EXPECT_EQ(pool.hashed_blocks(), 1);
  // A second user takes the same block: refcount 2, no new memory.
  const int64_t backing = pool.backing_bytes();
  ASSERT_TRUE(pool.retain(*pool.find_cached(h)).ok());
  EXPECT_EQ(pool.refcount(b), 2);
  EXPECT_EQ(pool.backing_bytes(), backing);
  EXPECT_EQ(pool.used_blocks(), 1);
}

TEST(BlockPool, CommitOfAHashAlreadyCachedKeepsTheFirstBlock) {
  BlockPool pool(100, 4);
  auto a = pool.allocate(2);
  ASSERT_TRUE(a.ok());
  const BlockHash h = hash_of(0);
  ASSERT_TRUE(pool.commit_block((*a)[0], h).ok());
  ASSERT_TRUE(pool.commit_block((*a)[1], h).ok());
  EXPECT_EQ(pool.find_cached(h), (*a)[0]);
  EXPECT_FALSE(pool.block_hash((*a)[1]).has_value());
  ASSERT_TRUE(pool.release((*a)[1]).ok());  // unhashed: plainly free, not cached
  EXPECT_EQ(pool.cached_blocks(), 0);
  EXPECT_FALSE(pool.commit_block((*a)[1], hash_of(5)).ok());  // not in use
}

TEST(BlockPool, ReleasedHashedBlockStaysFindableAndComesBack) {
  BlockPool pool(100, 4);
  auto a = pool.allocate(1);
  ASSERT_TRUE(a.ok());
  const int32_t b = (*a)[0];
  pool.data(b)[0] = 0x42;
  ASSERT_TRUE(pool.commit_block(b, hash_of(0)).ok());
  ASSERT_TRUE(pool.release(b).ok());
  EXPECT_EQ(pool.used_blocks(), 0);
  EXPECT_EQ(pool.cached_blocks(), 1);
  EXPECT_EQ(pool.held_blocks(), 1);
  EXPECT_EQ(pool.free_blocks(), 4);  // cached blocks are reclaimable
  ASSERT_EQ(pool.find_cached(hash_of(0)), b);
  ASSERT_TRUE(pool.retain(b).ok());
  EXPECT_EQ(pool.cached_blocks(), 0);
  EXPECT_EQ(pool.used_blocks(), 1);
  EXPECT_EQ(pool.data(b)[0], 0x42);  // contents kept
}

TEST(BlockPool, AllocationUsesFreeBlocksBeforeEvictingCachedOnes) {
  BlockPool pool(100, 4);
  auto a = pool.allocate(2);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(pool.commit_block((*a)[0], hash_of(0)).ok());
  ASSERT_TRUE(pool.commit_block((*a)[1], hash_of(64)).ok());
  ASSERT_TRUE(pool.release(*a).ok());
  EXPECT_EQ(pool.cached_blocks(), 2);
  auto b = pool.allocate(2);  // two never-used blocks are left: no eviction
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(pool.cached_blocks(), 2);
  EXPECT_TRUE(pool.find_cached(hash_of(0)).has_value());
  EXPECT_TRUE(pool.find_cached(hash_of(64)).has_value());
}

TEST(BlockPool, EvictsLeastRecentlyReleasedFirstAndOnlyAsFarAsNeeded) {
  BlockPool pool(100, 3);
  auto a = pool.allocate(3);
  ASSERT_TRUE(a.ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(pool.commit_block((*a)[i], hash_of(64 * i)).ok());
  // Release order 1, 2, 0: block 1 is the least recently released.
  ASSERT_TRUE(pool.release((*a)[1]).ok());
  ASSERT_TRUE(pool.release((*a)[2]).ok());
  ASSERT_TRUE(pool.release((*a)[0]).ok());
  auto one = pool.allocate(1);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ((*one)[0], (*a)[1]);  // its memory is reused
  EXPECT_FALSE(pool.find_cached(hash_of(64)).has_value());
  EXPECT_TRUE(pool.find_cached(hash_of(128)).has_value());
  EXPECT_TRUE(pool.find_cached(hash_of(0)).has_value());
  EXPECT_FALSE(pool.block_hash((*a)[1]).has_value());
  // Taking a cached block back protects it: the next eviction skips it.
  ASSERT_TRUE(pool.retain((*a)[2]).ok());
  auto two = pool.allocate(1);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ((*two)[0], (*a)[0]);
  EXPECT_EQ(pool.cached_blocks(), 0);
  EXPECT_FALSE(pool.allocate(1).ok());  // all three in use now
  EXPECT_EQ(pool.backing_bytes(), 300);
}

TEST(BlockPool, FailedAllocationEvictsNothing) {
  BlockPool pool(100, 2);
  auto a = pool.allocate(2);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(pool.commit_block((*a)[0], hash_of(0)).ok());
  ASSERT_TRUE(pool.release((*a)[0]).ok());
  EXPECT_FALSE(pool.allocate(2).ok());  // only one is reclaimable
  EXPECT_EQ(pool.cached_blocks(), 1);
  EXPECT_TRUE(pool.find_cached(hash_of(0)).has_value());
}

TEST(BlockPool, LoweringTheLimitEvictsAndGivesMemoryBack) {
  BlockPool pool(100, 4);
  auto a = pool.allocate(4);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(pool.commit_block((*a)[0], hash_of(0)).ok());
  ASSERT_TRUE(pool.commit_block((*a)[1], hash_of(64)).ok());
  ASSERT_TRUE(pool.release({(*a)[0], (*a)[1], (*a)[2]}).ok());  // 1 in use, 2 cached, 1 free (kept)
  EXPECT_EQ(pool.backing_bytes(), 400);
  EXPECT_FALSE(pool.set_max_blocks(0).ok());  // one block is in use
  EXPECT_EQ(pool.max_blocks(), 4);
  ASSERT_TRUE(pool.set_max_blocks(2).ok());
  EXPECT_EQ(pool.cached_blocks(), 1);  // the least recently released cached block went
  EXPECT_FALSE(pool.find_cached(hash_of(0)).has_value());
  EXPECT_TRUE(pool.find_cached(hash_of(64)).has_value());
  EXPECT_EQ(pool.backing_bytes(), 200);  // never more than the limit
  ASSERT_TRUE(pool.set_max_blocks(4).ok());
  auto more = pool.allocate(3);  // 2 unbacked ids + evicting the cached one
  ASSERT_TRUE(more.ok());
  EXPECT_EQ(pool.backing_bytes(), 400);
  std::set<int32_t> ids(more->begin(), more->end());
  ids.insert((*a)[3]);
  EXPECT_EQ(ids.size(), 4u);
  for (int32_t id : ids) EXPECT_NE(pool.data(id), nullptr);
}

}  // namespace
}  // namespace dsflash::kv

namespace dsflash::kv {
namespace {

// The chained hash is the one-shot xxh3-128 of [parent lo, parent hi, tokens] with the seed (an independent
// oracle for the streaming state compute_block_hash uses).
TEST(BlockHash, IsTheOneShotDigestOfParentAndTokens) {
  const std::vector<int32_t> tokens = {5, 6, 7, 8};
  const BlockHash parent{11, 22};
  for (uint64_t seed : {uint64_t{7}, uint64_t{0x1234}}) {
    std::vector<uint8_t> bytes(16 + tokens.size() * 4);
    std::memcpy(bytes.data(), &parent.lo, 8);
    std::memcpy(bytes.data() + 8, &parent.hi, 8);
    std::memcpy(bytes.data() + 16, tokens.data(), tokens.size() * 4);
    const XXH128_hash_t want = XXH3_128bits_withSeed(bytes.data(), bytes.size(), seed);
    const BlockHash got = compute_block_hash(parent, tokens, seed);
    EXPECT_EQ(got.lo, want.low64) << seed;
    EXPECT_EQ(got.hi, want.high64) << seed;
  }
}

}  // namespace
}  // namespace dsflash::kv
