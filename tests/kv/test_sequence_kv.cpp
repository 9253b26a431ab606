// kv::SequenceKv and its storage views: window rings, compressed KV in pages (no growth), compressor tails,
// Engram history; same bytes and reads as the model's classes; one arena of exactly the charged size.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <set>
#include <utility>
#include <vector>

#include "formats/quant.h"
#include "kv/kv_cache.h"
#include "kv_test_util.h"

namespace dsflash::kv {
namespace {

using test::KvFixture;
using test::make_fixture;
using test::small_config;

// Window row of a position: codes any e4m3 byte but NaN (0x7f/0xff), scales finite ue8m0.
void window_row(int64_t pos, std::vector<uint8_t>* codes, std::vector<uint8_t>* scales) {
  codes->resize(512);
  scales->resize(16);
  for (size_t i = 0; i < 512; ++i) (*codes)[i] = static_cast<uint8_t>((pos * 37 + i) % 0x7e);
  for (size_t i = 0; i < 16; ++i) (*scales)[i] = static_cast<uint8_t>(120 + (pos + i) % 10);
}

// Compressed entry e: main [256 + 32], key [64 + 4].
void entry(int64_t e, std::vector<uint8_t>* main, std::vector<uint8_t>* key) {
  main->resize(288);
  key->resize(68);
  for (size_t i = 0; i < 256; ++i) (*main)[i] = static_cast<uint8_t>(e * 31 + i);
  for (size_t i = 256; i < 288; ++i) (*main)[i] = static_cast<uint8_t>(0x30 + (e + i) % 0x40);
  for (size_t i = 0; i < 64; ++i) (*key)[i] = static_cast<uint8_t>(e * 17 + i * 3);
  for (size_t i = 64; i < 68; ++i) (*key)[i] = static_cast<uint8_t>(110 + (e * 3 + i) % 30);
}

TEST(SequenceKv, HasTheModelsLayersSourcesAndTails) {
  KvFixture f = make_fixture();
  SequenceKv& s = *f.seq;
  EXPECT_EQ(s.num_layers(), 7);
  for (int layer = 0; layer < 7; ++layer) {
    EXPECT_EQ(s.window(layer).window(), 8);
    EXPECT_EQ(s.window(layer).head_dim(), 512);
    EXPECT_EQ(s.compressed(layer) != nullptr, layer == 2 || layer == 4) << layer;
    EXPECT_EQ(s.tail(layer) != nullptr, layer == 2) << layer;
  }
  EXPECT_EQ(s.compressed(2)->ratio(), 2);
  EXPECT_EQ(s.compressed(4)->ratio(), 1);
  EXPECT_EQ(s.compressed(4)->index_head_dim(), 128);
  EXPECT_EQ(s.compressed(-1), nullptr);
  EXPECT_EQ(s.tail(99), nullptr);
  ASSERT_NE(s.engram(), nullptr);
  EXPECT_EQ(s.engram()->capacity(), 2);
  EXPECT_EQ(s.fixed_bytes(), f.layout.fixed_bytes_per_sequence());
  // The views' bytes add up to the charged arena.
  size_t total = s.engram()->bytes() + s.tail(2)->kv.size_bytes() + s.tail(2)->score.size_bytes();
  for (int layer = 0; layer < 7; ++layer) total += s.window(layer).bytes();
  EXPECT_EQ(static_cast<int64_t>(total), s.fixed_bytes());
}

TEST(SequenceKv, StateStartsEmptyAndTheRegionsAreDisjoint) {
  KvFixture f = make_fixture();
  SequenceKv& s = *f.seq;
  for (int layer = 0; layer < 7; ++layer) {
    for (int slot = 0; slot < 8; ++slot) EXPECT_EQ(s.window(layer).slot_position(slot), -1);
  }
  for (float v : s.tail(2)->kv) EXPECT_EQ(v, 0.0f);
  for (float v : s.tail(2)->score) EXPECT_TRUE(std::isinf(v) && v < 0);
  EXPECT_EQ(s.engram()->num_positions(), 0);
  // Fill every window ring completely, the tail and the history; then check nothing overwrote anything.
  std::vector<uint8_t> codes, scales;
  for (int layer = 0; layer < 7; ++layer) {
    for (int64_t p = 0; p < 8; ++p) {
      window_row(p + 100 * layer, &codes, &scales);
      s.window(layer).write(p, codes.data(), scales.data());
    }
  }
  std::iota(s.tail(2)->kv.begin(), s.tail(2)->kv.end(), 1.0f);
  std::iota(s.tail(2)->score.begin(), s.tail(2)->score.end(), -5000.0f);
  const std::vector<int64_t> ids = {11, 12, 13};
  s.engram()->append(ids);
  for (int layer = 0; layer < 7; ++layer) {
    for (int slot = 0; slot < 8; ++slot) {
      window_row(slot + 100 * layer, &codes, &scales);
      EXPECT_EQ(s.window(layer).slot_position(slot), slot);
      EXPECT_EQ(std::memcmp(s.window(layer).slot_codes(slot), codes.data(), 512), 0) << layer << " " << slot;
      EXPECT_EQ(std::memcmp(s.window(layer).slot_scales(slot), scales.data(), 16), 0) << layer << " " << slot;
    }
  }
  for (size_t i = 0; i < s.tail(2)->kv.size(); ++i) {
    EXPECT_EQ(s.tail(2)->kv[i], 1.0f + static_cast<float>(i));
    EXPECT_EQ(s.tail(2)->score[i], -5000.0f + static_cast<float>(i));
  }
  EXPECT_EQ(s.engram()->num_positions(), 3);
  s.clear();
  EXPECT_EQ(s.window(3).slot_position(5), -1);
  EXPECT_EQ(s.tail(2)->kv[7], 0.0f);
  EXPECT_EQ(s.engram()->num_positions(), 0);
}

TEST(WindowRingStorage, RoundTripsTheLatestRowOfEverySlot) {
  KvFixture f = make_fixture();
  WindowRing& ring = f.seq->window(0);
  std::vector<uint8_t> codes, scales;
  for (int64_t p = 0; p < 21; ++p) {  // wraps twice
    window_row(p, &codes, &scales);
    ring.write(p, codes.data(), scales.data());
  }
  std::vector<float> got(512), want(512);
  for (int slot = 0; slot < 8; ++slot) {
    const int64_t latest = slot >= 5 ? 8 + slot : 16 + slot;  // the last p < 21 with p % 8 == slot
    EXPECT_EQ(ring.slot_position(slot), latest);
    window_row(latest, &codes, &scales);
    EXPECT_EQ(std::memcmp(ring.slot_codes(slot), codes.data(), 512), 0);
    EXPECT_EQ(std::memcmp(ring.slot_scales(slot), scales.data(), 16), 0);
    ring.read_slot(slot, got.data());
    dequant_e4m3_ue8m0(codes.data(), scales.data(), 512, 32, want.data());
    EXPECT_EQ(got, want) << slot;
  }
  EXPECT_TRUE(ring.holds(20));
  EXPECT_TRUE(ring.holds(13));
  EXPECT_FALSE(ring.holds(12));  // overwritten by 20
  EXPECT_FALSE(ring.holds(21));
  EXPECT_FALSE(ring.holds(-1));
  EXPECT_EQ(ring.bytes(), 8u * (528 + 8));
}

TEST(CompressedKvStorage, RoundTripsEntriesAcrossBlocks) {
  KvFixture f = make_fixture();
  ASSERT_TRUE(f.manager->reserve(f.seq->pages(), 40).ok());  // 3 blocks: 48 entries at ratio 1
  CompressedKv& kv = *f.seq->compressed(4);
  std::vector<uint8_t> m, k;
  for (int64_t e = 0; e < 48; ++e) {
    entry(e, &m, &k);
    ASSERT_TRUE(kv.append(m.data(), m.data() + 256, k.data(), k.data() + 64).ok()) << e;
  }
  EXPECT_EQ(kv.num_entries(), 48);
  EXPECT_EQ(kv.bytes(), 48u * (288 + 68));
  // The rows of a run of entries, across block boundaries, are the rows one at a time.
  for (const auto& [first, count] : {std::pair<int64_t, int64_t>{0, 48}, {5, 30}, {15, 2}, {16, 16}, {47, 1}, {3, 0}}) {
    std::vector<const uint8_t*> rows(static_cast<size_t>(count) + 1, nullptr);
    kv.index_key_rows(first, count, rows.data());
    for (int64_t i = 0; i < count; ++i) EXPECT_EQ(rows[static_cast<size_t>(i)], kv.index_key_row(first + i)) << first + i;
    EXPECT_EQ(rows[static_cast<size_t>(count)], nullptr) << "wrote past the run";
  }
  std::vector<float> got(512), want(512), got_k(128), want_k(128);
  for (int64_t e = 0; e < 48; ++e) {
    entry(e, &m, &k);
    EXPECT_EQ(std::memcmp(kv.kv_row(e), m.data(), 288), 0) << e;
    EXPECT_EQ(std::memcmp(kv.index_key_row(e), k.data(), 68), 0) << e;
    kv.read_kv(e, got.data());
    dequant_e2m1_e4m3(m.data(), m.data() + 256, 512, 16, want.data());
    EXPECT_EQ(got, want) << e;
    kv.read_index_key(e, got_k.data());
    dequant_e2m1_ue8m0(k.data(), k.data() + 64, 128, 32, want_k.data());
    EXPECT_EQ(got_k, want_k) << e;
  }
  // The ratio-2 source of the same pages is independent of this one.
  CompressedKv& half = *f.seq->compressed(2);
  EXPECT_EQ(half.capacity_entries(), 24);
  entry(999, &m, &k);
  ASSERT_TRUE(half.append(m.data(), m.data() + 256, k.data(), k.data() + 64).ok());
  entry(0, &m, &k);
  EXPECT_EQ(std::memcmp(kv.kv_row(0), m.data(), 288), 0);
  kv.truncate(10);
  EXPECT_EQ(kv.num_entries(), 10);
  kv.truncate(50);  // clamped: never grows
  EXPECT_EQ(kv.num_entries(), 10);
}

TEST(CompressedKvStorage, AppendWithoutReserveIsAnErrorThatStoresNothing) {
  KvFixture f = make_fixture();
  CompressedKv& kv = *f.seq->compressed(4);
  std::vector<uint8_t> m, k;
  entry(0, &m, &k);
  Status s = kv.append(m.data(), m.data() + 256, k.data(), k.data() + 64);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("reserve before the forward"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("layer 4"), std::string::npos) << s.message();
  EXPECT_EQ(kv.num_entries(), 0);
  EXPECT_EQ(f.seq->pages().num_blocks(), 0);  // nothing grew behind the caller's back
  ASSERT_TRUE(f.manager->reserve(f.seq->pages(), 16).ok());
  for (int64_t e = 0; e < 16; ++e) ASSERT_TRUE(kv.append(m.data(), m.data() + 256, k.data(), k.data() + 64).ok());
  EXPECT_FALSE(kv.append(m.data(), m.data() + 256, k.data(), k.data() + 64).ok());  // block full
  EXPECT_EQ(kv.num_entries(), 16);
}

TEST(CompressedKvStorage, PublishedBlocksAreReadOnly) {
  KvFixture f = make_fixture();
  SequencePages& pages = f.seq->pages();
  ASSERT_TRUE(f.manager->reserve(pages, 32).ok());
  CompressedKv& kv = *f.seq->compressed(4);
  std::vector<uint8_t> m, k;
  for (int64_t e = 0; e < 16; ++e) {
    entry(e, &m, &k);
    ASSERT_TRUE(kv.append(m.data(), m.data() + 256, k.data(), k.data() + 64).ok());
  }
  std::vector<int32_t> tokens(16, 5);
  ASSERT_EQ(*f.manager->commit_full_blocks(pages, tokens, 1), 1);
  kv.truncate(15);  // pretend to rewrite the last entry of the published block
  entry(77, &m, &k);
  Status s = kv.append(m.data(), m.data() + 256, k.data(), k.data() + 64);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("published block 0"), std::string::npos) << s.message();
  entry(15, &m, &k);
  EXPECT_EQ(std::memcmp(kv.kv_row(15), m.data(), 288), 0);  // untouched
}

TEST(CompressorTailStorage, ResetRestoresZeroAndMinusInfinity) {
  KvFixture f = make_fixture();
  CompressorTail& tail = *f.seq->tail(2);
  EXPECT_EQ(tail.ratio, 2);
  EXPECT_EQ(tail.head_dim, 512);
  ASSERT_EQ(tail.kv.size(), 1024u);
  ASSERT_EQ(tail.score.size(), 1024u);
  EXPECT_EQ(CompressorTail::storage_bytes(2, 512), f.layout.tail_bytes);
  tail.kv[1023] = 3.5f;
  tail.score[0] = 1.0f;
  std::memcpy(&tail.kv[512], tail.score.data(), 4);
  tail.reset();
  EXPECT_EQ(tail.kv[1023], 0.0f);
  EXPECT_EQ(tail.kv[512], 0.0f);
  EXPECT_TRUE(std::isinf(tail.score[0]) && tail.score[0] < 0);
}

TEST(EngramHistoryStorage, KeepsTheLastIds) {
  KvFixture f = make_fixture();
  EngramHistory& h = *f.seq->engram();
  std::vector<int64_t> all;  // every id appended; the history keeps the last N-1 = 2
  int64_t next = 100;
  for (int64_t n : {1, 0, 2, 1, 5, 3}) {
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < n; ++i) ids.push_back(i % 3 == 2 ? EngramHistory::kDead : next++);
    h.append(ids);
    all.insert(all.end(), ids.begin(), ids.end());
    const std::vector<int64_t> want(all.end() - std::min<std::ptrdiff_t>(2, static_cast<std::ptrdiff_t>(all.size())), all.end());
    EXPECT_EQ(h.num_positions(), static_cast<int64_t>(all.size()));
    EXPECT_EQ(std::vector<int64_t>(h.recent().begin(), h.recent().end()), want) << h.num_positions();
  }
}

TEST(EngramHistoryStorage, RestoreChecksTheCount) {
  KvFixture f = make_fixture();
  EngramHistory& h = *f.seq->engram();
  const std::vector<int64_t> two = {7, 8};
  const std::vector<int64_t> one = {9};
  EXPECT_FALSE(h.restore(5, one).ok());
  EXPECT_EQ(h.num_positions(), 0);
  ASSERT_TRUE(h.restore(5, two).ok());
  EXPECT_EQ(h.num_positions(), 5);
  EXPECT_EQ(h.recent()[1], 8);
  ASSERT_TRUE(h.restore(1, one).ok());
  EXPECT_EQ(h.size(), 1);
  EXPECT_FALSE(h.restore(-1, {}).ok());
}

TEST(SequenceKv, ModelWithoutEngramHasNoHistoryAndNoBytesForIt) {
  ModelConfig c = small_config();
  c.engram_layer_ids.clear();
  auto layout = KvLayout::from_config(c, 16);
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->engram_history_bytes, 0);
  auto m = KvCacheManager::create(*layout, 16 << 20);
  ASSERT_TRUE(m.ok());
  auto seq = (*m)->open_sequence();
  ASSERT_TRUE(seq.ok());
  EXPECT_EQ((*seq)->engram(), nullptr);
  EXPECT_EQ((*seq)->fixed_bytes(), layout->fixed_bytes_per_sequence());
}

}  // namespace
}  // namespace dsflash::kv
