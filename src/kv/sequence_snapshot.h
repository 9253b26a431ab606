// Rollback of a sequence's mutable state over its next R rows (speculative decoding, spec/MODEL.md §4.10): before
// a verification forward of R rows at positions [p, p + R), capture() saves what those rows overwrite; after it,
// keep(seq, a) puts back everything the rows [p + a, p + R) changed, so the sequence equals one that processed only
// [p, p + a). Saved per sequence (no other state is touched):
//   window rings (every layer)   : the slots (p + i) % window, i < R: codes [head_dim] e4m3, scales [head_dim/32]
//                                  ue8m0 and the slot tag int64
//   compressor tails (ratio > 1) : the slots (p + i) % ratio, i < min(R, ratio): kv, score [head_dim] fp32; and
//                                  a journal of the rows the R rows store (RowJournal), since with R > ratio a
//                                  kept row's slot may be overwritten by a rejected one (the pending half-group)
//   compressed KV                : the entry count of every source (entries past it are dropped, bytes kept)
//   Engram history               : its size and recent ids, and a journal of the ids the rows append
//   num_positions
// Exact for R <= window (no ring slot written twice; max_rows()); capture() refuses more, and refuses position 0
// (a prefill stores only a trailing partial group). capture() arms the journals in seq: keep() or disarm() must
// follow before the snapshot goes away. Storage only: which rows to keep is the caller's policy (engine/).
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "kv/sequence_kv.h"

namespace dsflash::kv {

class SequenceSnapshot {
 public:
  // The most rows one snapshot can roll back for sequences of `layout`: min(window, tail ratios).
  static int64_t max_rows(const KvLayout& layout);

  // Saves the state [seq.num_positions(), + rows) would overwrite and arms seq's journals. Error (nothing saved)
  // when rows is outside [1, max_rows()] or seq is at position 0. Reuses its buffers.
  Status capture(SequenceKv& seq, int64_t rows);
  // After the seq processed the captured rows (or fewer): keeps the first `kept` of them, rolls the rest back and
  // disarms. Error (seq unchanged, still armed) when seq is not the captured sequence at an expected position or
  // kept is outside [0, rows processed].
  Status keep(SequenceKv& seq, int64_t kept);
  // Disarms seq's journals without changing its state.
  void disarm(SequenceKv& seq);

  int64_t first_position() const { return first_position_; }
  int64_t rows() const { return rows_; }
  bool empty() const { return rows_ == 0; }

 private:
  int64_t sequence_id_ = -1;
  int64_t first_position_ = 0;
  int64_t rows_ = 0;
  // Per window layer l, row i (slot (p + i) % window): codes, scales, tag.
  std::vector<uint8_t> ring_codes_;   // [layers, rows, head_dim]
  std::vector<uint8_t> ring_scales_;  // [layers, rows, head_dim/32]
  std::vector<int64_t> ring_tags_;    // [layers, rows]
  // Per tail (window layers in order that have one), row i < min(rows, ratio) (slot (p + i) % ratio): kv, score.
  std::vector<float> tail_rows_;      // [tails, min(rows, ratio), 2, head_dim]
  std::vector<RowJournal> tail_journals_;  // [tails] rows [rows, 2 * head_dim] stored by the processed rows
  std::vector<int64_t> entries_;      // [layers] entry count of the layer's compressed KV, -1 = not a source
  std::vector<int64_t> engram_;       // [1 + size] positions hashed, recent ids; empty without Engram
  std::vector<int64_t> engram_journal_;  // ids appended since capture
};

}  // namespace dsflash::kv
