// Storage of fixed-size global-KV blocks (DESIGN.md "Memory formats") with reference counts and a content-hash
// index (the prefix cache's sharing). A pool holds at most `max_blocks` blocks of `block_bytes` each.
//
// A block is in one of three states:
//   in use  : refcount > 0 (one reference per page table that maps it); may be hashed (committed);
//   cached  : refcount 0 but hashed: still findable by find_cached() and can be taken again (retain()), kept
//             until an allocation needs its memory; then evicted least recently released first (LRU);
//   free    : refcount 0, not hashed.
// held_blocks() = in use + cached is what the pool charges against its limit; allocate() uses free blocks first
// and evicts cached ones only when it would otherwise fail. The contents of a hashed block are read-only by
// contract (callers never write a committed block; KvCacheManager enforces it for its sequences).
//
// Memory is obtained on a block's first use and kept for reuse after release, so a pool sized for a large budget
// costs nothing until it is used; set_max_blocks() gives back kept memory beyond the new limit, so backed blocks
// never exceed max_blocks. Not thread-safe: one scheduler thread owns it.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "kv/block_hash.h"

namespace dsflash::kv {

class BlockPool {
 public:
  BlockPool(int64_t block_bytes, int64_t max_blocks);
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  int64_t block_bytes() const { return block_bytes_; }
  int64_t max_blocks() const { return max_blocks_; }
  // Blocks with refcount > 0 (each counted once however many references it has).
  int64_t used_blocks() const { return used_blocks_; }
  // Blocks with refcount 0 that are still findable by hash (evictable).
  int64_t cached_blocks() const { return static_cast<int64_t>(lru_.size()); }
  // used + cached: what the pool holds against max_blocks.
  int64_t held_blocks() const { return used_blocks_ + cached_blocks(); }
  // Blocks an allocation can still get (evicting cached blocks if it must): max_blocks - used_blocks.
  int64_t free_blocks() const { return max_blocks_ - used_blocks_; }
  // Blocks with refcount > 1.
  int64_t shared_blocks() const { return shared_blocks_; }
  // Blocks that carry a hash (in use or cached).
  int64_t hashed_blocks() const { return static_cast<int64_t>(cached_index_.size()); }
  // Bytes of host memory obtained and kept (blocks held plus free blocks kept for reuse).
  int64_t backing_bytes() const { return backed_blocks_ * block_bytes_; }

  // `count` new blocks with refcount 1 and no hash, all or nothing: an error (and no change) when
  // count > free_blocks(). Evicts cached blocks (LRU) only as far as needed.
  Result<std::vector<int32_t>> allocate(int64_t count);
  // One more reference to a block in use or cached (a cached block leaves the LRU and is in use again).
  // Error for a free or unknown block.
  Status retain(int32_t block);
  // Drops one reference; at refcount 0 the block becomes cached (hashed: appended to the LRU, so it is evicted
  // after every block released before it) or free. Error when the block is not in use.
  Status release(int32_t block);
  // Drops one reference per entry, in list order; all or nothing: error (nothing released) when an entry is
  // not in use or appears more often than its refcount.
  Status release(const std::vector<int32_t>& blocks);
  int32_t refcount(int32_t block) const;
  bool in_use(int32_t block) const { return refcount(block) > 0; }

  // Publishes a full block in use under `hash`, so that find_cached(hash) returns it until it is evicted.
  // Error when the block is not in use or already has a hash. When another block is already cached under
  // `hash`, that one stays the cached block and this one is left unhashed (Ok; block_hash() tells).
  Status commit_block(int32_t block, const BlockHash& hash);
  // The block cached under `hash` (in use or cached), without taking a reference.
  std::optional<int32_t> find_cached(const BlockHash& hash) const;
  // The hash a block was published under, if any.
  std::optional<BlockHash> block_hash(int32_t block) const;

  // Changes the limit. Lowering evicts cached blocks (LRU) and gives back kept free memory until
  // held_blocks() <= max_blocks and backed blocks <= max_blocks; error (nothing changed) when more than
  // `max_blocks` blocks are in use.
  Status set_max_blocks(int64_t max_blocks);

  // Bytes of a block in use: [block_bytes]. Block ids are stable for the block's lifetime.
  uint8_t* data(int32_t block) { return blocks_[static_cast<size_t>(block)].data.get(); }
  const uint8_t* data(int32_t block) const { return blocks_[static_cast<size_t>(block)].data.get(); }

 private:
  struct Block {
    int32_t refcount = 0;
    bool hashed = false;
    BlockHash hash;
    std::list<int32_t>::iterator lru;  // valid while cached
    std::unique_ptr<uint8_t[]> data;   // [block_bytes], null until first use or after its memory was given back
  };

  bool valid(int32_t block) const { return block >= 0 && static_cast<size_t>(block) < blocks_.size(); }
  // Least recently released cached block -> free (its hash is dropped).
  void evict_lru();
  // A free block id with memory: kept memory first, then an id whose memory was given back, then a new id.
  int32_t take_free_block();

  int64_t block_bytes_ = 0;
  int64_t max_blocks_ = 0;
  int64_t used_blocks_ = 0;
  int64_t shared_blocks_ = 0;
  int64_t backed_blocks_ = 0;
  std::vector<Block> blocks_;          // index = block id
  std::vector<int32_t> free_backed_;   // free blocks with memory kept (LIFO)
  std::vector<int32_t> free_unbacked_; // free ids without memory
  std::list<int32_t> lru_;             // cached blocks, front = least recently released
  std::unordered_map<BlockHash, int32_t, BlockHashKey> cached_index_;  // hash -> block (in use or cached)
};

}  // namespace dsflash::kv
