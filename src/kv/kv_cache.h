// The KV cache manager (policy): one byte budget for every per-sequence KV byte of all live sequences
// (DESIGN.md "Memory formats", spec/MODEL.md §6):
//   fixed state : window rings (rows + slot tags), compressor tails, Engram history: one arena of
//                 KvLayout::fixed_bytes_per_sequence() per sequence, allocated and charged by open_sequence();
//   global KV   : KvLayout::block_bytes per block, from the BlockPool, mapped into a sequence's page table as it
//                 grows (reserve() before each step) or shared from the prefix cache (attach_cached_prefix()).
// Charged bytes = fixed state of live sequences + blocks held by the pool (in use, each counted once however many
// sequences map it, plus cached blocks nobody references) <= budget, always. Cached blocks are reclaimable: free
// bytes count them, and an allocation that needs their room evicts them, least recently released first.
//
// Use by the engine, per sequence:
//   SequenceKv* seq = open_sequence();                       // fixed state only
//   hashes = hash_full_blocks(prompt, layout().block_tokens, seed);
//   attach_cached_prefix(*seq, hashes);                      // shared blocks, refcount+1, no new memory
//   per step: can_reserve(seq->pages(), n) ? reserve(seq->pages(), n) : preempt someone;
//             forward (writes windows / tails / compressed entries past the frozen blocks, never allocates);
//             commit_full_blocks(seq->pages(), tokens so far, seed);   // publish the blocks just filled
//   release(*seq);                                           // shared and cached blocks survive
// A request that cannot fit gets an error naming what it needs and what is free; nothing already held changes.
// Not thread-safe: the scheduler thread owns the manager and every sequence it hands out.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "kv/block_hash.h"
#include "kv/block_pool.h"
#include "kv/kv_layout.h"
#include "kv/sequence_kv.h"
#include "kv/sequence_pages.h"

namespace dsflash::kv {

struct KvStats {
  int64_t budget_bytes = 0;
  int64_t used_bytes = 0;          // global blocks in use + fixed state of live sequences
  int64_t global_bytes = 0;        // global KV blocks in use (shared blocks once)
  int64_t fixed_bytes = 0;         // window rings + slot tags + tails + Engram history of live sequences
  int64_t window_bytes = 0;        // of which window ring rows
  int64_t cached_bytes = 0;        // cached blocks no sequence references (reclaimable, counted in free_bytes)
  int64_t free_bytes = 0;          // budget_bytes - used_bytes
  int64_t num_sequences = 0;
  int64_t used_blocks = 0;         // blocks with refcount > 0
  int64_t shared_blocks = 0;       // of which mapped by more than one sequence
  int64_t committed_blocks = 0;    // hashed blocks, in use or cached
  int64_t cached_blocks = 0;       // hashed blocks with refcount 0
  int64_t backing_bytes = 0;       // host memory the pool keeps (<= budget - fixed_bytes)
  int64_t reserved_positions = 0;  // sum over live sequences of capacity_positions()
  double formula_global_bytes_per_token = 0;  // KvLayout::global_bytes_per_token()

  std::string describe() const;
};

class KvCacheManager {
 public:
  // budget_bytes: what global blocks plus per-sequence fixed state may occupy in total.
  static Result<std::unique_ptr<KvCacheManager>> create(const KvLayout& layout, int64_t budget_bytes);
  KvCacheManager(const KvCacheManager&) = delete;
  KvCacheManager& operator=(const KvCacheManager&) = delete;

  const KvLayout& layout() const { return layout_; }
  int64_t budget_bytes() const { return budget_bytes_; }
  int64_t used_bytes() const { return pool_.used_blocks() * layout_.block_bytes + fixed_total_; }
  // budget - used: includes cached blocks (an allocation may evict them).
  int64_t free_bytes() const { return budget_bytes_ - used_bytes(); }

  // --- opening --------------------------------------------------------------------------------------------
  // Bytes a new sequence reserving `num_positions` positions occupies: fixed state + whole blocks.
  int64_t bytes_for_sequence(int64_t num_positions) const;
  // Whether a new sequence reserving `num_positions` positions fits in what is free now.
  bool can_open(int64_t num_positions = 0) const { return bytes_for_sequence(num_positions) <= free_bytes(); }
  // A new sequence with its fixed state (no blocks yet). Error, nothing changed, when the fixed state does not fit
  // (cached blocks are evicted to make room if they must).
  Result<SequenceKv*> open_sequence();
  // open_sequence() + reserve(num_positions), returning the page table (the model's AttentionState::attach_pages
  // path, until the model keeps its state in SequenceKv). All or nothing.
  Result<SequencePages*> open(int64_t num_positions);

  // --- growing --------------------------------------------------------------------------------------------
  // Bytes of the blocks `seq` still needs to hold `num_positions` positions (0 when it already does).
  int64_t bytes_to_reserve(const SequencePages& seq, int64_t num_positions) const;
  bool can_reserve(const SequencePages& seq, int64_t num_positions) const {
    return bytes_to_reserve(seq, num_positions) <= free_bytes();
  }
  // Grows `seq` to hold `num_positions` positions (new blocks, refcount 1). Error naming the bytes needed and
  // free, nothing changed, when the budget cannot hold them.
  Status reserve(SequencePages& seq, int64_t num_positions);

  // --- sharing --------------------------------------------------------------------------------------------
  // How many leading hashes of `hashes` (hash_full_blocks of a prompt) name cached blocks.
  int64_t cached_prefix_blocks(std::span<const BlockHash> hashes) const;
  // Maps the longest cached prefix of `hashes` into `seq`, which must have no blocks yet: each block's refcount
  // +1, no new memory, and they become seq's frozen (read-only) blocks. Returns the number of blocks mapped
  // (0 when none is cached). `seed`: the seed the hashes were made with (commit_full_blocks must use it too).
  Result<int64_t> attach_cached_prefix(SequencePages& seq, std::span<const BlockHash> hashes, uint64_t seed);
  // Same, then SequenceKv::adopt_frozen_prefix() (compressed entries and num_positions cover the prefix).
  Result<int64_t> attach_cached_prefix(SequenceKv& seq, std::span<const BlockHash> hashes, uint64_t seed);
  // Hashes and publishes every full block of `seq` not yet frozen: `tokens` = the token ids of positions
  // 0 .. tokens.size()-1, all of whose KV has been written; blocks [num_frozen, min(tokens.size() / block_tokens,
  // num_blocks)) are committed, chained from the last frozen hash. Returns the number of blocks newly frozen.
  // Error (nothing changed) when `seed` differs from the one the sequence's frozen blocks were hashed with.
  Result<int64_t> commit_full_blocks(SequencePages& seq, std::span<const int32_t> tokens, uint64_t seed);

  // A new sequence holding a copy of `source`'s state (fixed state and the bytes of its blocks, in blocks of its
  // own; frozen blocks are shared, not copied): an independent continuation of the same prefix (tests, benchmarks
  // that clone a prefilled state, speculative snapshots). All or nothing.
  Result<SequenceKv*> fork(const SequenceKv& source);

  // A block read back from a lower tier (the SSD tier of the prefix cache): `bytes` [block_bytes] copied into a
  // new block, published under `hash` and left cached (refcount 0, evictable), so attach_cached_prefix finds it.
  // No-op when `hash` is cached already. Error (nothing changed) when the budget has no block to give.
  Status import_cached_block(const BlockHash& hash, std::span<const uint8_t> bytes);
  // The bytes of a block in use or cached: [block_bytes] (to write it to a lower tier).
  const uint8_t* block_data(int32_t block) const { return pool_.data(block); }

  // --- finishing ------------------------------------------------------------------------------------------
  // Drops the sequence's block references (last block first, so a cached chain is evicted from its end) and its
  // fixed state. Blocks other sequences map survive; published blocks stay cached. `seq` is invalid afterwards.
  Status release(SequencePages* seq);
  Status release(SequenceKv& seq) { return release(&seq.pages()); }

  // The live sequence owning `pages` (nullptr when none).
  SequenceKv* sequence(const SequencePages* pages);
  // Refcount of a block (tests, stats).
  int32_t block_refcount(int32_t block) const { return pool_.refcount(block); }
  const BlockPool& pool() const { return pool_; }

  KvStats stats() const;

 private:
  KvCacheManager(const KvLayout& layout, int64_t budget_bytes);
  // Blocks the pool may hold when the live fixed state is `fixed_total`.
  int64_t max_blocks_for(int64_t fixed_total) const;
  Status check_owned(const SequencePages& seq) const;

  KvLayout layout_;
  int64_t budget_bytes_;
  BlockPool pool_;
  int64_t fixed_total_ = 0;  // fixed state of live sequences
  int64_t next_id_ = 0;
  std::map<int64_t, std::unique_ptr<SequenceKv>> sequences_;
};

// A sequence opened from a manager and released when the lease goes (tests, benchmarks, one-off runs).
// Converts to SequenceKv& wherever a sequence is taken.
class SequenceLease {
 public:
  SequenceLease(KvCacheManager* manager, SequenceKv* seq) : manager_(manager), seq_(seq) {}
  SequenceLease(SequenceLease&& other) noexcept : manager_(other.manager_), seq_(other.seq_) { other.seq_ = nullptr; }
  SequenceLease& operator=(SequenceLease&& other) noexcept {
    if (this != &other) {
      reset();
      manager_ = other.manager_;
      seq_ = other.seq_;
      other.seq_ = nullptr;
    }
    return *this;
  }
  SequenceLease(const SequenceLease&) = delete;
  SequenceLease& operator=(const SequenceLease&) = delete;
  ~SequenceLease() { reset(); }

  SequenceKv& operator*() const { return *seq_; }
  SequenceKv* operator->() const { return seq_; }
  operator SequenceKv&() const { return *seq_; }  // NOLINT: implicit by design
  SequenceKv* get() const { return seq_; }

 private:
  void reset() {
    if (seq_ != nullptr) (void)manager_->release(*seq_);
    seq_ = nullptr;
  }
  KvCacheManager* manager_ = nullptr;
  SequenceKv* seq_ = nullptr;
};

}  // namespace dsflash::kv
