// The model's CompressedKv keeping its entries in kv pages: attach copies what it holds, appends grow the pages
// through the manager, a refused budget is an error that stores nothing.
#include <gtest/gtest.h>

#include <vector>

#include "kv/kv_cache.h"
#include "model/attention_state.h"

namespace dsflash::kv {
namespace {

ModelConfig config() {
  ModelConfig c;
  c.n_layers = 6;
  c.n_mtp_layers = 0;
  c.head_dim = 512;
  c.index_head_dim = 128;
  c.window_size = 8;
  c.compress_ratios = {0, 0, 2, 2, 1, 1};
  c.kv_source_layers = {2, 4};
  return c;
}

// Entry e of a test pattern: main [256 + 32] and key [64 + 4] bytes.
void entry_bytes(int64_t e, std::vector<uint8_t>* main, std::vector<uint8_t>* key) {
  main->resize(288);
  key->resize(68);
  // Packed e2m1 codes: any byte. Scales: finite e4m3 (< 0x7f) and ue8m0 (< 0xff) values, so reads compare.
  for (size_t i = 0; i < 256; ++i) (*main)[i] = static_cast<uint8_t>(e * 31 + i);
  for (size_t i = 256; i < 288; ++i) (*main)[i] = static_cast<uint8_t>(0x30 + (e + i) % 0x40);
  for (size_t i = 0; i < 64; ++i) (*key)[i] = static_cast<uint8_t>(e * 17 + i * 3);
  for (size_t i = 64; i < 68; ++i) (*key)[i] = static_cast<uint8_t>(110 + (e * 3 + i) % 30);
}

TEST(PagedCompressedKv, AttachCopiesAndAppendsGrowThePages) {
  const ModelConfig c = config();
  auto layout = KvLayout::from_config(c, 16);
  ASSERT_TRUE(layout.ok());
  auto manager = KvCacheManager::create(*layout, 16 << 20);
  ASSERT_TRUE(manager.ok());
  dsflash::CompressedKv owned(1, 512, 128), paged(1, 512, 128);
  std::vector<uint8_t> m, k;
  for (int64_t e = 0; e < 5; ++e) {
    entry_bytes(e, &m, &k);
    ASSERT_TRUE(owned.append(m.data(), m.data() + 256, k.data(), k.data() + 64).ok());
    ASSERT_TRUE(paged.append(m.data(), m.data() + 256, k.data(), k.data() + 64).ok());
  }
  auto pages = (*manager)->open(0);
  ASSERT_TRUE(pages.ok());
  EXPECT_FALSE(paged.attach_pages(*pages, 0).ok());  // source 0 is layer 2 at ratio 2: mismatch
  ASSERT_TRUE(paged.attach_pages(*pages, 1).ok());
  EXPECT_TRUE(paged.paged());
  EXPECT_EQ((*pages)->num_blocks(), 1);
  for (int64_t e = 5; e < 40; ++e) {  // crosses two block boundaries
    entry_bytes(e, &m, &k);
    ASSERT_TRUE(owned.append(m.data(), m.data() + 256, k.data(), k.data() + 64).ok());
    ASSERT_TRUE(paged.append(m.data(), m.data() + 256, k.data(), k.data() + 64).ok());
  }
  EXPECT_EQ((*pages)->num_blocks(), 3);
  EXPECT_EQ(paged.bytes(), owned.bytes());
  std::vector<float> a(512), b(512), ka(128), kb(128);
  for (int64_t e = 0; e < 40; ++e) {
    owned.read_kv(e, a.data());
    paged.read_kv(e, b.data());
    EXPECT_EQ(a, b) << e;
    owned.read_index_key(e, ka.data());
    paged.read_index_key(e, kb.data());
    EXPECT_EQ(ka, kb) << e;
  }
  paged.truncate(10);
  EXPECT_EQ(paged.num_entries(), 10);
  EXPECT_TRUE((*manager)->release(*pages).ok());
}

TEST(PagedCompressedKv, RefusedBudgetStoresNothing) {
  const ModelConfig c = config();
  auto layout = KvLayout::from_config(c, 16);
  ASSERT_TRUE(layout.ok());
  auto manager = KvCacheManager::create(*layout, layout->fixed_bytes_per_sequence() + layout->block_bytes);
  ASSERT_TRUE(manager.ok());
  auto pages = (*manager)->open(16);
  ASSERT_TRUE(pages.ok());
  auto state = AttentionState::create(c);
  ASSERT_TRUE(state.ok());
  ASSERT_TRUE(state->attach_pages(*pages).ok());
  EXPECT_TRUE(state->reserve_positions(16).ok());
  Status refused = state->reserve_positions(17);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("KV cache full"), std::string::npos) << refused.message();
  dsflash::CompressedKv* kv = state->compressed(4);
  ASSERT_NE(kv, nullptr);
  std::vector<uint8_t> m, k;
  for (int64_t e = 0; e < 16; ++e) {
    entry_bytes(e, &m, &k);
    ASSERT_TRUE(kv->append(m.data(), m.data() + 256, k.data(), k.data() + 64).ok());
  }
  entry_bytes(16, &m, &k);
  Status s = kv->append(m.data(), m.data() + 256, k.data(), k.data() + 64);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(kv->num_entries(), 16);
  std::vector<float> row(512), expected(512);
  kv->read_kv(15, row.data());
  entry_bytes(15, &m, &k);
  dsflash::CompressedKv check(1, 512, 128);
  ASSERT_TRUE(check.append(m.data(), m.data() + 256, k.data(), k.data() + 64).ok());
  check.read_kv(0, expected.data());
  EXPECT_EQ(row, expected);  // the last stored entry is intact
}

}  // namespace
}  // namespace dsflash::kv
