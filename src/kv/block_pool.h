// Storage of fixed-size global-KV blocks (DESIGN.md "Memory formats"): a pool of at most `max_blocks` blocks of
// `block_bytes` each. Memory is obtained on a block's first use and kept for reuse after release, so a pool
// sized for a large budget costs nothing until it is used. Not thread-safe: one scheduler thread owns it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/status.h"

namespace dsflash::kv {

class BlockPool {
 public:
  BlockPool(int64_t block_bytes, int64_t max_blocks);

  int64_t block_bytes() const { return block_bytes_; }
  int64_t max_blocks() const { return max_blocks_; }
  int64_t used_blocks() const { return used_blocks_; }
  int64_t free_blocks() const { return max_blocks_ - used_blocks_; }
  // Bytes of host memory obtained so far (blocks ever used, in use or free for reuse).
  int64_t backing_bytes() const { return static_cast<int64_t>(storage_.size()) * block_bytes_; }

  // `count` block ids, all or nothing: an error (and no change) when fewer than `count` are free.
  Result<std::vector<int32_t>> allocate(int64_t count);
  // Returns blocks to the pool. An id that is out of range or not in use is an error (nothing is released).
  Status release(const std::vector<int32_t>& blocks);
  bool in_use(int32_t block) const;
  // Bytes of a block in use: [block_bytes].
  uint8_t* data(int32_t block) { return storage_[static_cast<size_t>(block)].get(); }
  const uint8_t* data(int32_t block) const { return storage_[static_cast<size_t>(block)].get(); }

 private:
  int64_t block_bytes_ = 0;
  int64_t max_blocks_ = 0;
  int64_t used_blocks_ = 0;
  std::vector<std::unique_ptr<uint8_t[]>> storage_;  // [blocks obtained so far], index = block id
  std::vector<uint8_t> in_use_;                      // [blocks obtained so far]
  std::vector<int32_t> free_ids_;                    // obtained blocks not in use (reused first, LIFO)
};

}  // namespace dsflash::kv
