#include "kv/block_pool.h"

#include <string>

namespace dsflash::kv {

BlockPool::BlockPool(int64_t block_bytes, int64_t max_blocks)
    : block_bytes_(block_bytes > 0 ? block_bytes : 0), max_blocks_(max_blocks > 0 ? max_blocks : 0) {}

int32_t BlockPool::refcount(int32_t block) const {
  return valid(block) ? blocks_[static_cast<size_t>(block)].refcount : 0;
}

void BlockPool::evict_lru() {
  const int32_t id = lru_.front();
  lru_.pop_front();
  Block& b = blocks_[static_cast<size_t>(id)];
  cached_index_.erase(b.hash);
  b.hashed = false;
  b.hash = BlockHash{};
  free_backed_.push_back(id);
}

int32_t BlockPool::take_free_block() {
  int32_t id;
  if (!free_backed_.empty()) {
    id = free_backed_.back();
    free_backed_.pop_back();
    return id;
  }
  if (!free_unbacked_.empty()) {
    id = free_unbacked_.back();
    free_unbacked_.pop_back();
  } else {
    id = static_cast<int32_t>(blocks_.size());
    blocks_.emplace_back();
  }
  // Uninitialised on purpose: entries are written before they are read, and untouched pages stay unbacked.
  blocks_[static_cast<size_t>(id)].data = std::make_unique_for_overwrite<uint8_t[]>(static_cast<size_t>(block_bytes_));
  ++backed_blocks_;
  return id;
}

Result<std::vector<int32_t>> BlockPool::allocate(int64_t count) {
  if (count < 0) return Status::Error("block pool: cannot allocate " + std::to_string(count) + " blocks");
  if (count > free_blocks()) {
    return Status::Error("block pool: " + std::to_string(count) + " blocks of " + std::to_string(block_bytes_) +
                         " B requested, " + std::to_string(free_blocks()) + " of " + std::to_string(max_blocks_) +
                         " free (" + std::to_string(cached_blocks()) + " of them cached)");
  }
  // Evict only what the limit requires: blocks that are neither in use nor cached come first.
  while (held_blocks() + count > max_blocks_) evict_lru();
  std::vector<int32_t> ids;
  ids.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const int32_t id = take_free_block();
    blocks_[static_cast<size_t>(id)].refcount = 1;
    ids.push_back(id);
  }
  used_blocks_ += count;
  return ids;
}

Status BlockPool::retain(int32_t block) {
  if (!valid(block)) return Status::Error("block pool: retain of unknown block " + std::to_string(block));
  Block& b = blocks_[static_cast<size_t>(block)];
  if (b.refcount == 0) {
    if (!b.hashed) return Status::Error("block pool: retain of free block " + std::to_string(block));
    lru_.erase(b.lru);
    ++used_blocks_;
  } else if (b.refcount == 1) {
    ++shared_blocks_;
  }
  ++b.refcount;
  return Status::Ok();
}

Status BlockPool::release(int32_t block) {
  if (!in_use(block)) {
    return Status::Error("block pool: release of block " + std::to_string(block) + " that is not in use");
  }
  Block& b = blocks_[static_cast<size_t>(block)];
  --b.refcount;
  if (b.refcount == 1) --shared_blocks_;
  if (b.refcount > 0) return Status::Ok();
  --used_blocks_;
  if (b.hashed) {
    b.lru = lru_.insert(lru_.end(), block);
  } else {
    free_backed_.push_back(block);
  }
  return Status::Ok();
}

Status BlockPool::release(const std::vector<int32_t>& blocks) {
  // Check first (counting repeats), so that an error releases nothing.
  std::unordered_map<int32_t, int32_t> wanted;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const int32_t n = ++wanted[blocks[i]];
    if (n > refcount(blocks[i])) {
      return Status::Error("block pool: release of block " + std::to_string(blocks[i]) + " (list index " +
                           std::to_string(i) + ") that is not in use or listed more often than its refcount " +
                           std::to_string(refcount(blocks[i])));
    }
  }
  for (int32_t id : blocks) (void)release(id);
  return Status::Ok();
}

Status BlockPool::commit_block(int32_t block, const BlockHash& hash) {
  if (!in_use(block)) {
    return Status::Error("block pool: commit of block " + std::to_string(block) + " that is not in use");
  }
  Block& b = blocks_[static_cast<size_t>(block)];
  if (b.hashed) return Status::Error("block pool: block " + std::to_string(block) + " is already committed");
  if (cached_index_.count(hash) != 0) return Status::Ok();  // the first block under a hash stays the cached one
  b.hashed = true;
  b.hash = hash;
  cached_index_.emplace(hash, block);
  return Status::Ok();
}

std::optional<int32_t> BlockPool::find_cached(const BlockHash& hash) const {
  auto it = cached_index_.find(hash);
  if (it == cached_index_.end()) return std::nullopt;
  return it->second;
}

std::optional<BlockHash> BlockPool::block_hash(int32_t block) const {
  if (!valid(block) || !blocks_[static_cast<size_t>(block)].hashed) return std::nullopt;
  return blocks_[static_cast<size_t>(block)].hash;
}

Status BlockPool::set_max_blocks(int64_t max_blocks) {
  if (max_blocks < 0) max_blocks = 0;
  if (used_blocks_ > max_blocks) {
    return Status::Error("block pool: cannot lower the limit to " + std::to_string(max_blocks) + " blocks, " +
                         std::to_string(used_blocks_) + " are in use");
  }
  max_blocks_ = max_blocks;
  while (held_blocks() > max_blocks_) evict_lru();
  while (backed_blocks_ > max_blocks_ && !free_backed_.empty()) {
    const int32_t id = free_backed_.back();
    free_backed_.pop_back();
    blocks_[static_cast<size_t>(id)].data.reset();
    --backed_blocks_;
    free_unbacked_.push_back(id);
  }
  return Status::Ok();
}

}  // namespace dsflash::kv
