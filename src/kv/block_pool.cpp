#include "kv/block_pool.h"

#include <string>

namespace dsflash::kv {

BlockPool::BlockPool(int64_t block_bytes, int64_t max_blocks)
    : block_bytes_(block_bytes > 0 ? block_bytes : 0), max_blocks_(max_blocks > 0 ? max_blocks : 0) {}

Result<std::vector<int32_t>> BlockPool::allocate(int64_t count) {
  if (count < 0) return Status::Error("block pool: cannot allocate " + std::to_string(count) + " blocks");
  if (count > free_blocks()) {
    return Status::Error("block pool: " + std::to_string(count) + " blocks of " + std::to_string(block_bytes_) +
                         " B requested, " + std::to_string(free_blocks()) + " of " + std::to_string(max_blocks_) +
                         " free");
  }
  std::vector<int32_t> ids;
  ids.reserve(static_cast<size_t>(count));
  while (static_cast<int64_t>(ids.size()) < count && !free_ids_.empty()) {
    ids.push_back(free_ids_.back());
    free_ids_.pop_back();
  }
  while (static_cast<int64_t>(ids.size()) < count) {
    // Uninitialised on purpose: pages are written before they are read, and untouched pages stay unbacked.
    storage_.push_back(std::make_unique_for_overwrite<uint8_t[]>(static_cast<size_t>(block_bytes_)));
    in_use_.push_back(0);
    ids.push_back(static_cast<int32_t>(storage_.size() - 1));
  }
  for (int32_t id : ids) in_use_[static_cast<size_t>(id)] = 1;
  used_blocks_ += count;
  return ids;
}

bool BlockPool::in_use(int32_t block) const {
  return block >= 0 && static_cast<size_t>(block) < in_use_.size() && in_use_[static_cast<size_t>(block)] != 0;
}

Status BlockPool::release(const std::vector<int32_t>& blocks) {
  // Mark as we go so that a block listed twice is caught; undo the marks on error (nothing is released).
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (!in_use(blocks[i])) {
      for (size_t j = 0; j < i; ++j) in_use_[static_cast<size_t>(blocks[j])] = 1;
      return Status::Error("block pool: release of block " + std::to_string(blocks[i]) + " (list index " +
                           std::to_string(i) + ") that is not in use or listed twice");
    }
    in_use_[static_cast<size_t>(blocks[i])] = 0;
  }
  free_ids_.insert(free_ids_.end(), blocks.begin(), blocks.end());
  used_blocks_ -= static_cast<int64_t>(blocks.size());
  return Status::Ok();
}

}  // namespace dsflash::kv
