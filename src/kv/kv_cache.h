// The KV cache manager (policy) and the per-sequence page table of global KV (DESIGN.md "Memory formats",
// spec/MODEL.md §6). One byte budget covers everything the KV state of all live sequences occupies:
//   global KV blocks  : KvLayout::block_bytes each, taken from the BlockPool as a sequence grows;
//   per-sequence state: window rings (every layer, window rows of 528 B), compressor tails, Engram history,
//                       charged in full when the sequence is opened (their size does not depend on its length).
// A request that cannot fit gets an error naming what it needs and what is free; nothing already held changes.
// Not thread-safe: the scheduler thread owns the manager and every SequencePages it hands out.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "kv/block_pool.h"
#include "kv/kv_layout.h"

namespace dsflash::kv {

class KvCacheManager;

// Page table of one sequence's global KV: block i covers positions [i*block_tokens, (i+1)*block_tokens) of every
// KV source. Entry j of source s lives in block j / entries_per_block(s). Owned by the manager.
class SequencePages {
 public:
  int64_t id() const { return id_; }
  const KvLayout& layout() const { return *layout_; }
  int64_t num_blocks() const { return static_cast<int64_t>(block_ids_.size()); }
  const std::vector<int32_t>& block_ids() const { return block_ids_; }
  // Positions the blocks held can store (a multiple of block_tokens).
  int64_t capacity_positions() const { return num_blocks() * layout_->block_tokens; }
  // Entries of source `source` (index into layout().sources) the blocks held can store.
  int64_t capacity_entries(int source) const;
  // Global KV bytes held (whole blocks).
  int64_t global_bytes() const { return num_blocks() * layout_->block_bytes; }

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

  // Grows the page table to hold `num_positions` positions (no-op when it already does). Error, nothing changed,
  // when the manager's budget cannot hold the extra blocks.
  Status reserve_positions(int64_t num_positions);

 private:
  friend class KvCacheManager;
  SequencePages(KvCacheManager* owner, const KvLayout* layout, int64_t id) : owner_(owner), layout_(layout), id_(id) {}
  uint8_t* address(int source, int64_t entry, bool index_key);

  KvCacheManager* owner_;
  const KvLayout* layout_;
  int64_t id_;
  std::vector<int32_t> block_ids_;
  std::vector<uint8_t*> block_data_;  // [blocks] base address of each block
};

struct KvStats {
  int64_t budget_bytes = 0;
  int64_t used_bytes = 0;          // global blocks in use + fixed per-sequence state of live sequences
  int64_t global_bytes = 0;        // global KV blocks in use
  int64_t fixed_bytes = 0;         // window rings + tails + Engram history of live sequences
  int64_t window_bytes = 0;        // of which window rings
  int64_t free_bytes = 0;          // budget_bytes - used_bytes
  int64_t num_sequences = 0;
  int64_t used_blocks = 0;
  int64_t reserved_positions = 0;  // sum over live sequences of capacity_positions()
  double formula_global_bytes_per_token = 0;  // KvLayout::global_bytes_per_token()

  std::string describe() const;
};

class KvCacheManager {
 public:
  // budget_bytes: what global blocks plus per-sequence fixed state may occupy in total.
  static Result<std::unique_ptr<KvCacheManager>> create(const KvLayout& layout, int64_t budget_bytes);

  const KvLayout& layout() const { return layout_; }
  int64_t budget_bytes() const { return budget_bytes_; }

  // Bytes a new sequence reserving `num_positions` positions occupies: fixed state + whole blocks.
  int64_t bytes_for_sequence(int64_t num_positions) const;
  // Whether a new sequence reserving `num_positions` positions fits in what is free now.
  bool can_open(int64_t num_positions) const { return bytes_for_sequence(num_positions) <= free_bytes(); }
  int64_t free_bytes() const { return budget_bytes_ - used_bytes(); }
  int64_t used_bytes() const;

  // A new sequence with blocks for `num_positions` positions (0: only the fixed state). Error when it does not
  // fit; nothing changes then.
  Result<SequencePages*> open(int64_t num_positions);
  // Grows `seq` to `num_positions` positions. Error (nothing changes) when the budget cannot hold it.
  Status reserve(SequencePages& seq, int64_t num_positions);
  // Returns every block and the fixed state of a finished (or cancelled) sequence. `seq` is invalid afterwards.
  Status release(SequencePages* seq);

  KvStats stats() const;

 private:
  KvCacheManager(const KvLayout& layout, int64_t budget_bytes);

  KvLayout layout_;
  int64_t budget_bytes_;
  BlockPool pool_;
  int64_t next_id_ = 0;
  std::map<int64_t, std::unique_ptr<SequencePages>> sequences_;
};

}  // namespace dsflash::kv
