// Storage of one sequence's per-layer attention state and Engram history, in the byte formats of
// src/model/attention_state.h and DESIGN.md "Memory formats". These are views: the bytes belong to the
// sequence's fixed-state arena (kv::SequenceKv) or, for compressed KV, to its global-KV pages; nothing here
// allocates, so the forward never allocates KV.
//   window ring row (every layer)  : head_dim e4m3 + head_dim/32 ue8m0                      (528 B at 512)
//   window slot tag                : int64 absolute position held, -1 = empty                 (8 B)
//   compressed main KV (KV sources): head_dim/2 packed e2m1 + head_dim/16 e4m3 scales      (288 B at 512)
//   indexer key (KV sources)       : index_head_dim/2 packed e2m1 + index_head_dim/32 ue8m0 (68 B at 128)
//   compressor tail (ratio > 1)    : fp32 kv / score [ratio, head_dim]
//   Engram history                 : int64 [1 + max_ngram-1]: positions hashed, recent compressed ids
//
// Member names follow dsflash::WindowRing / CompressedKv / CompressorTail (model/attention_state.h) so the model
// can switch by namespace. Differences: CompressedKv never grows (reserve through KvCacheManager before a step;
// append past the reserved capacity or into a published block is an error), CompressorTail's kv/score are spans,
// EngramHistory has accessors (num_positions(), recent()) instead of public vectors.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "kernels/kv_dequant.h"

namespace dsflash::kv {

class SequencePages;

// Sliding-window ring of one layer: slot = position % window. Each slot remembers which absolute position it
// holds (-1 = empty), so readers never see a row that was not written (bounded replay, truncated windows).
class WindowRing {
 public:
  WindowRing() = default;
  // codes [window, head_dim] e4m3, scales [window, head_dim/32] ue8m0, positions [window] (not owned).
  // Call clear() before first use (the arena's bytes are uninitialised).
  WindowRing(int window, int64_t head_dim, uint8_t* codes, uint8_t* scales, int64_t* positions)
      : window_(window), head_dim_(head_dim), codes_(codes), scales_(scales), positions_(positions) {}

  int window() const { return window_; }
  int64_t head_dim() const { return head_dim_; }
  static int64_t row_bytes(int64_t head_dim) { return head_dim + head_dim / 32; }
  // Rows + slot tags of one ring.
  static int64_t storage_bytes(int window, int64_t head_dim) {
    return window * (row_bytes(head_dim) + static_cast<int64_t>(sizeof(int64_t)));
  }

  // Stores the row of `position` (>= 0): codes [head_dim] e4m3, scales [head_dim/32] ue8m0.
  void write(int64_t position, const uint8_t* codes, const uint8_t* scales);
  // Puts a slot back as it was (a rollback, kv/sequence_snapshot.h): codes [head_dim], scales [head_dim/32], tag
  // = the position it held or -1.
  void restore_slot(int slot, const uint8_t* codes, const uint8_t* scales, int64_t tag);
  // The position held by `slot`, or -1.
  int64_t slot_position(int slot) const { return positions_[slot]; }
  bool holds(int64_t position) const { return position >= 0 && positions_[position % window_] == position; }
  // Dequantised row of a slot: out [head_dim] fp32 (bf16-representable values). The slot must be filled.
  // dequant: a kernel table's (Backend::dequant_window_row); every one gives the oracle's bits.
  void read_slot(int slot, float* out, WindowRowDequant dequant = reference_kv_dequant().window_row) const;
  const uint8_t* slot_codes(int slot) const { return codes_ + static_cast<int64_t>(slot) * head_dim_; }
  const uint8_t* slot_scales(int slot) const { return scales_ + static_cast<int64_t>(slot) * (head_dim_ / 32); }
  // Every slot empty (rows are left as they are: an empty slot is never read).
  void clear();
  size_t bytes() const { return static_cast<size_t>(storage_bytes(window_, head_dim_)); }

 private:
  int window_ = 0;
  int64_t head_dim_ = 0;
  uint8_t* codes_ = nullptr;      // [window, head_dim] e4m3
  uint8_t* scales_ = nullptr;     // [window, head_dim/32] ue8m0
  int64_t* positions_ = nullptr;  // [window] absolute position per slot, -1 = empty
};

// The global (compressed) KV of one KV source, kept in a sequence's pages: entry j stands for the group of tokens
// [j*ratio, (j+1)*ratio) and holds the main KV row (FP4 e2m1, e4m3 scale per 16) and the indexer key (MXFP4).
class CompressedKv {
 public:
  CompressedKv() = default;
  // `source` indexes pages->layout().sources; entry sizes follow the layout.
  CompressedKv(SequencePages* pages, int source);

  int ratio() const { return ratio_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t index_head_dim() const { return index_head_dim_; }
  int source() const { return source_; }
  int64_t num_entries() const { return num_entries_; }
  static int64_t kv_bytes(int64_t head_dim) { return head_dim / 2 + head_dim / 16; }
  static int64_t index_key_bytes(int64_t index_head_dim) { return index_head_dim / 2 + index_head_dim / 32; }
  // Entries the pages reserved so far can hold.
  int64_t capacity_entries() const;

  // Appends entry num_entries(): kv_packed [head_dim/2], kv_scales [head_dim/16] e4m3,
  // key_packed [index_head_dim/2], key_scales [index_head_dim/32] ue8m0. Never grows the pages: error (nothing
  // stored) when the entry lies past the reserved capacity or in a published (frozen, possibly shared) block.
  Status append(const uint8_t* kv_packed, const uint8_t* kv_scales, const uint8_t* key_packed,
                const uint8_t* key_scales);
  // Stored rows of an entry < num_entries(): [kv_bytes] / [index_key_bytes].
  const uint8_t* kv_row(int64_t entry) const;
  const uint8_t* index_key_row(int64_t entry) const;
  // The indexer key rows of entries [first, first + count) < num_entries(), in order: rows [count].
  void index_key_rows(int64_t first, int64_t count, const uint8_t** rows) const;
  // Dequantised rows (exact): out [head_dim] / [index_head_dim] fp32. dequant: a kernel table's
  // (Backend::dequant_compressed_row); every one gives the oracle's bits.
  void read_kv(int64_t entry, float* out, CompressedRowDequant dequant = reference_kv_dequant().compressed_row) const;
  void read_index_key(int64_t entry, float* out) const;
  // Drops entries >= num_entries (clamped to [0, num_entries()]). Blocks stay mapped.
  void truncate(int64_t num_entries);
  void clear() { truncate(0); }
  // Declares entries [0, num_entries) present without writing them: a prefix attached from the cache.
  // Error when they exceed the pages' capacity.
  Status set_num_entries(int64_t num_entries);
  // Bytes of the entries held (num_entries * (kv_bytes + index_key_bytes)); the pages hold whole blocks.
  size_t bytes() const {
    return static_cast<size_t>(num_entries_ * (kv_bytes(head_dim_) + index_key_bytes(index_head_dim_)));
  }

 private:
  SequencePages* pages_ = nullptr;  // not owned
  int source_ = -1;
  int ratio_ = 1;
  int64_t head_dim_ = 0;
  int64_t index_head_dim_ = 0;
  int64_t num_entries_ = 0;
};

// The pending part of a ratio > 1 group (model.py Compressor kv_state / score_state): slot = position % ratio.
// Slots keep their last values after a group is emitted (as the reference's buffers do).
// Journal of rows written while a rollback snapshot is armed (kv/sequence_snapshot.h): the rows of positions
// [first_position, first_position + capacity), in position order.
struct RowJournal {
  int64_t first_position = 0;
  int64_t capacity = 0;       // rows
  int64_t width = 0;          // values per row
  std::vector<float> rows;    // [capacity, width]
  void arm(int64_t first, int64_t num_rows, int64_t row_width);
};

struct CompressorTail {
  int ratio = 0;
  int64_t head_dim = 0;
  std::span<float> kv;     // [ratio, head_dim] fp32, 0 after reset()
  std::span<float> score;  // [ratio, head_dim] fp32, -inf after reset()
  RowJournal* journal = nullptr;  // armed by a snapshot: every store() of a position it covers is copied there
  // Stores the row of `position` in slot position % ratio: kv [head_dim], score [head_dim] fp32 (journaled as
  // [kv ; score]).
  void store(int64_t position, const float* kv_row, const float* score_row);
  static int64_t storage_bytes(int ratio, int64_t head_dim) {
    return 2 * static_cast<int64_t>(ratio) * head_dim * static_cast<int64_t>(sizeof(float));
  }
  void reset();
};

// The Engram hasher's per-sequence state (model/engram_hash.h NgramHasher): positions hashed so far and the last
// up to capacity() = max_ngram-1 compressed ids (kDead inside image spans), oldest first. Storage only.
class EngramHistory {
 public:
  static constexpr int64_t kDead = -1;

  EngramHistory() = default;
  // storage [1 + capacity] int64 (not owned): [0] positions hashed, [1..] recent ids oldest first.
  // Call reset() before first use.
  EngramHistory(int64_t capacity, int64_t* storage) : capacity_(capacity), storage_(storage) {}
  static int64_t storage_bytes(int64_t capacity) { return (capacity + 1) * static_cast<int64_t>(sizeof(int64_t)); }

  int64_t capacity() const { return capacity_; }
  // Positions hashed so far (= start_pos of the next call).
  int64_t num_positions() const { return storage_[0]; }
  // Ids held: min(capacity, num_positions).
  int64_t size() const { return num_positions() < capacity_ ? num_positions() : capacity_; }
  // [size()] most recent compressed ids, oldest first.
  std::span<const int64_t> recent() const { return {storage_ + 1, static_cast<size_t>(size())}; }

  // The compressed ids (or kDead) of positions num_positions() .. num_positions()+ids.size()-1: keeps the last
  // capacity() of them and advances num_positions().
  void append(std::span<const int64_t> ids);
  // Armed by a rollback snapshot: append() also pushes its ids here (null = off).
  void set_journal(std::vector<int64_t>* journal) { journal_ = journal; }
  // Sets the state of a sequence restored after `num_positions` positions; recent must hold
  // min(capacity, num_positions) ids (error otherwise, nothing changed).
  Status restore(int64_t num_positions, std::span<const int64_t> recent);
  void reset() { storage_[0] = 0; }
  size_t bytes() const { return static_cast<size_t>(storage_bytes(capacity_)); }

 private:
  int64_t capacity_ = 0;
  int64_t* storage_ = nullptr;
  std::vector<int64_t>* journal_ = nullptr;  // not owned
};

}  // namespace dsflash::kv
