// KV cache manager: byte layouts from the config (890 B/token on V4.1), block pool, per-sequence page tables,
// the byte budget (clear errors, nothing overwritten), release on finish.
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <string>

#include "io/model_config.h"
#include "kv/block_pool.h"
#include "kv/kv_cache.h"
#include "kv/kv_layout.h"
#include "kv_test_util.h"

namespace dsflash::kv {
namespace {

ModelConfig released_config() {
  auto config = ModelConfig::load(std::string(DSFLASH_SHARED_DIR) + "/spec/config_v41_flash.json");
  EXPECT_TRUE(config.ok()) << config.status().message();
  return *config;
}

// The KV tests' small config (sources L2 ratio 2 and L4 ratio 1), here without Engram.
ModelConfig config_without_engram() { return test::small_config(/*engram=*/false); }

TEST(KvLayout, ReleasedConfigGives890BytesPerToken) {
  const ModelConfig config = released_config();
  auto layout = KvLayout::from_config(config, 64);
  ASSERT_TRUE(layout.ok()) << layout.status().message();
  ASSERT_EQ(layout->sources.size(), 4u);
  EXPECT_EQ(layout->sources[0].layer, 2);
  EXPECT_EQ(layout->sources[3].layer, 20);
  for (const GlobalSource& s : layout->sources) {
    EXPECT_EQ(s.main_entry_bytes, 288);  // 512 e2m1 (256 B) + 32 e4m3 scales
    EXPECT_EQ(s.index_key_bytes, 68);    // 128 e2m1 (64 B) + 4 ue8m0 scales
    EXPECT_EQ(s.ratio, s.layer == 20 ? 1 : 2);
  }
  EXPECT_DOUBLE_EQ(layout->global_bytes_per_token(), 890.0);
  EXPECT_EQ(layout->block_bytes, 64 * 890);
  EXPECT_EQ(layout->window_row_bytes, 528);
  // 40 backbone + 3 DSpark rings of 128 rows.
  EXPECT_EQ(layout->num_window_layers, 43);
  EXPECT_EQ(layout->window_bytes_per_sequence(), 43 * 128 * 528);
  // Ratio-2 tails: fp32 kv + score [2, 512] on L2, L8, L14.
  EXPECT_EQ(layout->tail_bytes, 3 * 2 * 2 * 512 * 4);
}

TEST(KvLayout, MillionTokenContextStaysUnder095GB) {
  auto layout = KvLayout::from_config(released_config(), 64);
  ASSERT_TRUE(layout.ok());
  const int64_t bytes = layout->global_bytes_for_positions(1048576);
  EXPECT_EQ(bytes, int64_t{890} * 1048576);  // 1M is a multiple of the block: no rounding at all
  EXPECT_LT(bytes, 950'000'000);
}

TEST(KvLayout, RoundingIsOnlyTheLastBlock) {
  auto layout = KvLayout::from_config(released_config(), 64);
  ASSERT_TRUE(layout.ok());
  for (int64_t n : {1, 63, 64, 65, 1000, 4097, 100000}) {
    const int64_t bytes = layout->global_bytes_for_positions(n);
    EXPECT_GE(bytes, 890 * n);
    EXPECT_LT(bytes, 890 * n + layout->block_bytes) << n;
  }
  EXPECT_EQ(layout->global_bytes_for_positions(0), 0);
}

TEST(KvLayout, RejectsBadShapes) {
  ModelConfig c = config_without_engram();
  EXPECT_FALSE(KvLayout::from_config(c, 0).ok());
  auto odd = KvLayout::from_config(c, 63);  // not a multiple of ratio 2
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("layer 2"), std::string::npos) << odd.status().message();
  c.head_dim = 500;
  EXPECT_FALSE(KvLayout::from_config(c, 64).ok());
  c = config_without_engram();
  c.compress_ratios[4] = 0;
  EXPECT_FALSE(KvLayout::from_config(c, 64).ok());
}

TEST(BlockPool, AllocatesAllOrNothingAndReuses) {
  BlockPool pool(100, 4);
  auto a = pool.allocate(3);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(pool.used_blocks(), 3);
  auto too_many = pool.allocate(2);
  ASSERT_FALSE(too_many.ok());
  EXPECT_EQ(pool.used_blocks(), 3);  // nothing taken
  std::set<int32_t> distinct(a->begin(), a->end());
  EXPECT_EQ(distinct.size(), 3u);
  std::memset(pool.data((*a)[0]), 7, 100);
  ASSERT_TRUE(pool.release({(*a)[0]}).ok());
  EXPECT_FALSE(pool.release({(*a)[0]}).ok());           // double release
  EXPECT_FALSE(pool.release({(*a)[1], (*a)[1]}).ok());  // listed twice: nothing released
  EXPECT_TRUE(pool.in_use((*a)[1]));
  EXPECT_EQ(pool.used_blocks(), 2);
  auto b = pool.allocate(2);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(pool.backing_bytes(), 400);  // the released block was reused, one new block obtained
  EXPECT_FALSE(pool.release({99}).ok());
}

TEST(KvCache, PageTableAddressesAreDisjointAndStable) {
  auto layout = KvLayout::from_config(config_without_engram(), 16);
  ASSERT_TRUE(layout.ok());
  auto manager = KvCacheManager::create(*layout, 64 << 20);
  ASSERT_TRUE(manager.ok());
  auto seq = (*manager)->open(40);  // 3 blocks of 16 positions
  ASSERT_TRUE(seq.ok()) << seq.status().message();
  SequencePages& pages = **seq;
  EXPECT_EQ(pages.num_blocks(), 3);
  EXPECT_EQ(pages.capacity_positions(), 48);
  EXPECT_EQ(pages.capacity_entries(0), 24);  // ratio 2
  EXPECT_EQ(pages.capacity_entries(1), 48);  // ratio 1
  // Write a distinct pattern into every entry of both sources, then read it all back.
  auto fill = [&](int source, int64_t entry, bool key, int64_t bytes) {
    uint8_t* p = key ? pages.index_key(source, entry) : pages.main_entry(source, entry);
    for (int64_t i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(source * 131 + entry * 7 + i + (key ? 3 : 0));
  };
  auto check = [&](int source, int64_t entry, bool key, int64_t bytes) {
    const uint8_t* p = key ? pages.index_key(source, entry) : pages.main_entry(source, entry);
    for (int64_t i = 0; i < bytes; ++i) {
      if (p[i] != static_cast<uint8_t>(source * 131 + entry * 7 + i + (key ? 3 : 0))) return false;
    }
    return true;
  };
  for (int s = 0; s < 2; ++s) {
    for (int64_t e = 0; e < pages.capacity_entries(s); ++e) {
      fill(s, e, false, 288);
      fill(s, e, true, 68);
    }
  }
  // Growing keeps what was written (blocks are not moved).
  ASSERT_TRUE(pages.reserve_positions(100).ok());
  EXPECT_EQ(pages.num_blocks(), 7);
  for (int s = 0; s < 2; ++s) {
    for (int64_t e = 0; e < 24 * (s + 1); ++e) {
      EXPECT_TRUE(check(s, e, false, 288)) << s << " " << e;
      EXPECT_TRUE(check(s, e, true, 68)) << s << " " << e;
    }
  }
  EXPECT_EQ(pages.global_bytes(), 7 * layout->block_bytes);
}

TEST(KvCache, BudgetErrorsAreClearAndChangeNothing) {
  auto layout = KvLayout::from_config(config_without_engram(), 16);
  ASSERT_TRUE(layout.ok());
  const int64_t fixed = layout->fixed_bytes_per_sequence();
  // Room for one sequence's fixed state and 4 blocks, plus a little.
  const int64_t budget = fixed + 4 * layout->block_bytes + 100;
  auto manager = KvCacheManager::create(*layout, budget);
  ASSERT_TRUE(manager.ok());
  KvCacheManager& m = **manager;
  EXPECT_TRUE(m.can_open(64));
  EXPECT_FALSE(m.can_open(65));
  auto too_big = m.open(65);
  ASSERT_FALSE(too_big.ok());
  EXPECT_NE(too_big.status().message().find("KV cache full"), std::string::npos);
  EXPECT_NE(too_big.status().message().find("65 positions"), std::string::npos) << too_big.status().message();
  EXPECT_EQ(m.used_bytes(), 0);

  auto seq = m.open(30);  // 2 blocks
  ASSERT_TRUE(seq.ok());
  std::memset((*seq)->main_entry(1, 0), 0x5a, 288);
  Status grow = m.reserve(**seq, 100);  // would need 7 blocks
  ASSERT_FALSE(grow.ok());
  EXPECT_NE(grow.message().find("more global blocks"), std::string::npos) << grow.message();
  EXPECT_EQ((*seq)->num_blocks(), 2);
  EXPECT_EQ((*seq)->main_entry(1, 0)[287], 0x5a);
  // A second sequence does not fit beside the first (its fixed state alone exceeds what is left).
  EXPECT_FALSE(m.open(0).ok());

  KvStats st = m.stats();
  EXPECT_EQ(st.num_sequences, 1);
  EXPECT_EQ(st.global_bytes, 2 * layout->block_bytes);
  EXPECT_EQ(st.fixed_bytes, fixed);
  EXPECT_EQ(st.window_bytes, 7 * 8 * 528);
  EXPECT_EQ(st.used_bytes + st.free_bytes, budget);
  EXPECT_EQ(st.reserved_positions, 32);

  ASSERT_TRUE(m.release(*seq).ok());
  EXPECT_EQ(m.used_bytes(), 0);
  auto again = m.open(64);  // everything came back
  EXPECT_TRUE(again.ok());
}

TEST(KvCache, ReleaseRejectsForeignSequences) {
  auto layout = KvLayout::from_config(config_without_engram(), 16);
  ASSERT_TRUE(layout.ok());
  auto a = KvCacheManager::create(*layout, 16 << 20);
  auto b = KvCacheManager::create(*layout, 16 << 20);
  ASSERT_TRUE(a.ok() && b.ok());
  auto seq = (*a)->open(10);
  ASSERT_TRUE(seq.ok());
  EXPECT_FALSE((*b)->release(*seq).ok());
  EXPECT_FALSE((*b)->reserve(**seq, 20).ok());
  EXPECT_FALSE((*a)->release(nullptr).ok());
  EXPECT_TRUE((*a)->release(*seq).ok());
}

TEST(KvCache, ManySequencesShareTheBudget) {
  auto layout = KvLayout::from_config(released_config(), 64);
  ASSERT_TRUE(layout.ok());
  const int64_t per_seq = layout->fixed_bytes_per_sequence() + layout->global_bytes_for_positions(4096);
  auto manager = KvCacheManager::create(*layout, 10 * per_seq);
  ASSERT_TRUE(manager.ok());
  std::vector<SequencePages*> live;
  for (int i = 0; i < 10; ++i) {
    auto seq = (*manager)->open(4096);
    ASSERT_TRUE(seq.ok()) << i << ": " << seq.status().message();
    live.push_back(*seq);
  }
  EXPECT_FALSE((*manager)->open(1).ok());
  ASSERT_TRUE((*manager)->release(live[3]).ok());
  EXPECT_TRUE((*manager)->open(4096).ok());
  const KvStats st = (*manager)->stats();
  EXPECT_EQ(st.global_bytes, 10 * layout->global_bytes_for_positions(4096));
  EXPECT_DOUBLE_EQ(static_cast<double>(st.global_bytes) / static_cast<double>(st.reserved_positions), 890.0);
}

}  // namespace
}  // namespace dsflash::kv
