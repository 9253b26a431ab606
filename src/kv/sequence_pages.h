// Page table of one sequence's global KV (DESIGN.md "Memory formats", spec/MODEL.md §6): block i covers positions
// [i*block_tokens, (i+1)*block_tokens) of every KV source; entry j of source s lives in block j / entries_per_block(s)
// at KvLayout's offsets. Blocks come from the manager's BlockPool and may be shared with other sequences.
//
// The leading num_frozen_blocks() blocks are published (hashed: attached from the prefix cache or committed by
// KvCacheManager::commit_full_blocks) and read-only; their hashes are kept here so that committing continues the
// chain. Writes go only to entries past them (kv::CompressedKv::append checks). Owned by KvCacheManager.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "kv/block_hash.h"
#include "kv/kv_layout.h"

namespace dsflash::kv {

class KvCacheManager;

class SequencePages {
 public:
  SequencePages(const SequencePages&) = delete;
  SequencePages& operator=(const SequencePages&) = delete;

  int64_t id() const { return id_; }
  const KvLayout& layout() const { return *layout_; }
  int64_t num_blocks() const { return static_cast<int64_t>(block_ids_.size()); }
  const std::vector<int32_t>& block_ids() const { return block_ids_; }
  // Positions the blocks held can store (a multiple of block_tokens).
  int64_t capacity_positions() const { return num_blocks() * layout_->block_tokens; }
  // Entries of source `source` (index into layout().sources) the blocks held can store.
  int64_t capacity_entries(int source) const;
  // Global KV bytes mapped (whole blocks; shared blocks count in every sequence that maps them).
  int64_t global_bytes() const { return num_blocks() * layout_->block_bytes; }

  // Published, read-only leading blocks and their chained hashes ([num_frozen_blocks()]).
  int64_t num_frozen_blocks() const { return static_cast<int64_t>(block_hashes_.size()); }
  const std::vector<BlockHash>& block_hashes() const { return block_hashes_; }
  // Positions covered by the frozen blocks (their KV need not be computed again).
  int64_t frozen_positions() const { return num_frozen_blocks() * layout_->block_tokens; }
  // Whether entry `entry` of source `source` lies in a frozen block.
  bool entry_frozen(int source, int64_t entry) const;

  // Bytes of entry `entry` of source `source`; entry < capacity_entries(source).
  // main entry: [head_dim/2] packed e2m1 then [head_dim/16] e4m3 scales.
  uint8_t* main_entry(int source, int64_t entry) { return address(source, entry, false); }
  const uint8_t* main_entry(int source, int64_t entry) const {
    return const_cast<SequencePages*>(this)->address(source, entry, false);
  }
  // indexer key: [index_head_dim/2] packed e2m1 then [index_head_dim/32] ue8m0 scales.
  uint8_t* index_key(int source, int64_t entry) { return address(source, entry, true); }
  const uint8_t* index_key(int source, int64_t entry) const {
    return const_cast<SequencePages*>(this)->address(source, entry, true);
  }
  // The indexer keys of entries [first, first + count) in order: rows [count], entries < capacity_entries(source).
  // One block lookup per block instead of one per entry (the indexer gathers ~1M of them per step at 1M tokens).
  void index_keys(int source, int64_t first, int64_t count, const uint8_t** rows) const;

  // Grows the page table to hold `num_positions` positions (no-op when it already does), through the manager.
  // Error, nothing changed, when the manager's budget cannot hold the extra blocks.
  Status reserve_positions(int64_t num_positions);

 private:
  friend class KvCacheManager;
  friend class SequenceKv;
  SequencePages(KvCacheManager* owner, const KvLayout* layout, int64_t id) : owner_(owner), layout_(layout), id_(id) {}
  uint8_t* address(int source, int64_t entry, bool index_key);

  KvCacheManager* owner_;
  const KvLayout* layout_;
  int64_t id_;
  std::vector<int32_t> block_ids_;
  std::vector<uint8_t*> block_data_;      // [blocks] base address of each block
  std::vector<BlockHash> block_hashes_;   // [frozen blocks]
  uint64_t hash_seed_ = 0;                // seed of block_hashes_ (valid when any)
};

}  // namespace dsflash::kv
