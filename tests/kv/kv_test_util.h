// Shared setup of the KV tests: a small config with the V4.1 KV dims and role pattern (sources L2 ratio 2 and
// L4 ratio 1, a window of 8, one DSpark layer; Engram on L1 with max n-gram 3 unless asked not to), its layout in
// 16-token blocks, and a manager with one open sequence on it.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>

#include "io/model_config.h"
#include "kv/kv_cache.h"

namespace dsflash::kv::test {

inline constexpr int64_t kBlockTokens = 16;

inline ModelConfig small_config(bool engram = true) {
  ModelConfig c;
  c.n_layers = 6;
  c.n_mtp_layers = 1;
  c.head_dim = 512;
  c.index_head_dim = 128;
  c.window_size = 8;
  c.compress_ratios = {0, 0, 2, 2, 1, 1, 0};
  c.kv_source_layers = {2, 4};
  if (engram) {
    c.engram_layer_ids = {1};
    c.engram_max_ngram_size = 3;
  }
  return c;
}

inline KvLayout small_layout() {
  auto layout = KvLayout::from_config(small_config(), kBlockTokens);
  EXPECT_TRUE(layout.ok()) << layout.status().message();
  return *layout;
}

inline std::unique_ptr<KvCacheManager> make_manager(const KvLayout& layout, int64_t budget) {
  auto m = KvCacheManager::create(layout, budget);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return std::move(*m);
}

// small_layout(), a manager of `budget` bytes on it, and one sequence opened there.
struct KvFixture {
  KvLayout layout;
  std::unique_ptr<KvCacheManager> manager;
  SequenceKv* seq = nullptr;
};

inline KvFixture make_fixture(int64_t budget = 64 << 20) {
  KvFixture f;
  f.layout = small_layout();
  f.manager = make_manager(f.layout, budget);
  auto seq = f.manager->open_sequence();
  EXPECT_TRUE(seq.ok()) << seq.status().message();
  f.seq = *seq;
  return f;
}

}  // namespace dsflash::kv::test
