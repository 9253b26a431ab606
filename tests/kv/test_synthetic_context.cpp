// kv::fill_synthetic_context (benchmarks' synthetic depth): every source holds depth / ratio entries whose rows
// decode to finite values in the quantisers' ranges, the windows hold exactly the last `window` positions, tails
// hold the pending slots, positions = depth; deterministic in the seed; refuses a used or unreserved sequence.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "formats/formats.h"
#include "kv/kv_cache.h"
#include "kv/synthetic_context.h"
#include "kv_test_util.h"

namespace dsflash::kv {
namespace {

using test::KvFixture;
using test::make_fixture;

TEST(SyntheticContext, FillsEverySourceWindowAndTailWithFiniteValues) {
  for (int64_t depth : {int64_t{0}, int64_t{5}, int64_t{8}, int64_t{1001}}) {
    KvFixture f = make_fixture();
    ASSERT_TRUE(f.manager->reserve(f.seq->pages(), depth).ok());
    ASSERT_TRUE(fill_synthetic_context(*f.seq, depth, 42).ok()) << depth;
    EXPECT_EQ(f.seq->num_positions(), depth);
    std::vector<float> row(512), key(128);
    for (int layer : {2, 4}) {
      const CompressedKv* kv = f.seq->compressed(layer);
      ASSERT_NE(kv, nullptr);
      ASSERT_EQ(kv->num_entries(), depth / kv->ratio()) << layer;
      for (int64_t e = 0; e < kv->num_entries(); ++e) {
        kv->read_kv(e, row.data());
        kv->read_index_key(e, key.data());
        float amax = 0;
        for (float v : row) {
          ASSERT_TRUE(std::isfinite(v));
          amax = std::max(amax, std::fabs(v));
        }
        EXPECT_LE(amax, 6.0f * 0.5f);  // e2m1 max 6 times a scale below 2^-1
        for (float v : key) {
          ASSERT_TRUE(std::isfinite(v));
          EXPECT_LE(std::fabs(v), 6.0f);
        }
      }
    }
    const CompressorTail* tail = f.seq->tail(2);
    ASSERT_NE(tail, nullptr);
    for (int slot = 0; slot < 2; ++slot) {
      const bool pending = slot < depth % 2;
      const float score = tail->score[static_cast<size_t>(slot * 512)];
      EXPECT_EQ(std::isfinite(score), pending) << depth << " slot " << slot;
    }
    for (int layer = 0; layer < f.seq->num_layers(); ++layer) {
      const WindowRing& ring = f.seq->window(layer);
      for (int64_t p = 0; p < depth; ++p) EXPECT_EQ(ring.holds(p), p >= depth - ring.window()) << p;
      for (int slot = 0; slot < ring.window(); ++slot) {
        if (ring.slot_position(slot) < 0) continue;
        ring.read_slot(slot, row.data());
        for (float v : row) {
          ASSERT_TRUE(std::isfinite(v));
          EXPECT_LE(std::fabs(v), 448.0f / 64.0f);
        }
      }
    }
  }
}

TEST(SyntheticContext, DeterministicInTheSeed) {
  KvFixture a = make_fixture(), b = make_fixture(), c = make_fixture();
  for (KvFixture* f : {&a, &b, &c}) ASSERT_TRUE(f->manager->reserve(f->seq->pages(), 300).ok());
  ASSERT_TRUE(fill_synthetic_context(*a.seq, 300, 7).ok());
  ASSERT_TRUE(fill_synthetic_context(*b.seq, 300, 7).ok());
  ASSERT_TRUE(fill_synthetic_context(*c.seq, 300, 8).ok());
  const CompressedKv* ka = a.seq->compressed(4);
  const CompressedKv* kb = b.seq->compressed(4);
  const CompressedKv* kc = c.seq->compressed(4);
  bool differs = false;
  for (int64_t e = 0; e < 300; ++e) {
    EXPECT_EQ(std::memcmp(ka->index_key_row(e), kb->index_key_row(e), 68), 0);
    EXPECT_EQ(std::memcmp(ka->kv_row(e), kb->kv_row(e), 288), 0);
    differs |= std::memcmp(ka->index_key_row(e), kc->index_key_row(e), 68) != 0;
  }
  EXPECT_TRUE(differs);
}

TEST(SyntheticContext, RefusesUsedOrUnreservedSequences) {
  KvFixture f = make_fixture();
  EXPECT_FALSE(fill_synthetic_context(*f.seq, 100, 1).ok());  // nothing reserved
  EXPECT_EQ(f.seq->num_positions(), 0);
  ASSERT_TRUE(f.manager->reserve(f.seq->pages(), 100).ok());
  ASSERT_TRUE(fill_synthetic_context(*f.seq, 50, 1).ok());
  EXPECT_FALSE(fill_synthetic_context(*f.seq, 50, 1).ok());  // already holds positions
  EXPECT_EQ(f.seq->num_positions(), 50);
  EXPECT_FALSE(fill_synthetic_context(*f.seq, -1, 1).ok());
}

}  // namespace
}  // namespace dsflash::kv
