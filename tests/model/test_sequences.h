// Sequences for layer tests: a KV cache manager of its own and leases of sequences on it, reserved up front (the
// forward never allocates KV).
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "io/model_config.h"
#include "kv/kv_cache.h"

namespace dsflash::testing {

class TestKv {
 public:
  explicit TestKv(const ModelConfig& config, int64_t budget_bytes = int64_t{1} << 30) {
    auto layout = kv::KvLayout::from_config(config);
    EXPECT_TRUE(layout.ok()) << layout.status().message();
    auto manager = kv::KvCacheManager::create(*layout, budget_bytes);
    EXPECT_TRUE(manager.ok()) << manager.status().message();
    manager_ = std::move(*manager);
  }
  // A new sequence with room for `positions` positions.
  kv::SequenceLease open(int64_t positions = 4096) {
    auto seq = manager_->open_sequence();
    EXPECT_TRUE(seq.ok()) << seq.status().message();
    Status s = manager_->reserve((*seq)->pages(), positions);
    EXPECT_TRUE(s.ok()) << s.message();
    return kv::SequenceLease(manager_.get(), *seq);
  }
  kv::KvCacheManager& manager() { return *manager_; }

 private:
  std::unique_ptr<kv::KvCacheManager> manager_;
};

}  // namespace dsflash::testing
