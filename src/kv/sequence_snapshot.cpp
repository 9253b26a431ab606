#include "kv/sequence_snapshot.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace dsflash::kv {

int64_t SequenceSnapshot::max_rows(const KvLayout& layout) { return layout.window; }

Status SequenceSnapshot::capture(SequenceKv& seq, int64_t rows) {
  const int64_t limit = max_rows(seq.layout());
  if (rows < 1 || rows > limit) {
    return Status::Error("KV snapshot: " + std::to_string(rows) + " rows, a snapshot holds 1 .. " +
                         std::to_string(limit) + " (the window)");
  }
  if (seq.num_positions() == 0) return Status::Error("KV snapshot: a sequence at position 0 (a prefill) cannot be captured");
  const int layers = seq.num_layers();
  const int64_t p = seq.num_positions();
  const int64_t d = seq.layout().head_dim;
  ring_codes_.resize(static_cast<size_t>(layers * rows * d));
  ring_scales_.resize(static_cast<size_t>(layers * rows * (d / 32)));
  ring_tags_.resize(static_cast<size_t>(layers * rows));
  tail_rows_.clear();
  entries_.assign(static_cast<size_t>(layers), -1);
  size_t num_tails = 0;
  for (int l = 0; l < layers; ++l) num_tails += seq.tail(l) != nullptr ? 1 : 0;
  tail_journals_.resize(num_tails);
  size_t tail_index = 0;
  for (int l = 0; l < layers; ++l) {
    const WindowRing& ring = seq.window(l);
    for (int64_t i = 0; i < rows; ++i) {
      const int slot = static_cast<int>((p + i) % ring.window());
      const size_t row = static_cast<size_t>(l * rows + i);
      std::memcpy(&ring_codes_[row * static_cast<size_t>(d)], ring.slot_codes(slot), static_cast<size_t>(d));
      std::memcpy(&ring_scales_[row * static_cast<size_t>(d / 32)], ring.slot_scales(slot),
                  static_cast<size_t>(d / 32));
      ring_tags_[row] = ring.slot_position(slot);
    }
    if (const CompressedKv* kv = seq.compressed(l)) entries_[static_cast<size_t>(l)] = kv->num_entries();
    if (CompressorTail* tail = seq.tail(l)) {
      const int64_t touched = std::min<int64_t>(rows, tail->ratio);
      const auto n = static_cast<std::ptrdiff_t>(tail->head_dim);
      for (int64_t i = 0; i < touched; ++i) {
        const auto slot = static_cast<std::ptrdiff_t>(((p + i) % tail->ratio) * tail->head_dim);
        tail_rows_.insert(tail_rows_.end(), tail->kv.begin() + slot, tail->kv.begin() + slot + n);
        tail_rows_.insert(tail_rows_.end(), tail->score.begin() + slot, tail->score.begin() + slot + n);
      }
      RowJournal& journal = tail_journals_[tail_index++];
      journal.arm(p, rows, 2 * tail->head_dim);
      tail->journal = &journal;
    }
  }
  engram_.clear();
  engram_journal_.clear();
  if (EngramHistory* history = seq.engram()) {
    engram_.push_back(history->num_positions());
    engram_.insert(engram_.end(), history->recent().begin(), history->recent().end());
    history->set_journal(&engram_journal_);
  }
  sequence_id_ = seq.id();
  first_position_ = p;
  rows_ = rows;
  return Status::Ok();
}

void SequenceSnapshot::disarm(SequenceKv& seq) {
  for (int l = 0; l < seq.num_layers(); ++l) {
    if (CompressorTail* tail = seq.tail(l)) tail->journal = nullptr;
  }
  if (EngramHistory* history = seq.engram()) history->set_journal(nullptr);
}

Status SequenceSnapshot::keep(SequenceKv& seq, int64_t kept) {
  if (rows_ == 0 || seq.id() != sequence_id_ || seq.num_layers() * rows_ != static_cast<int64_t>(ring_tags_.size())) {
    return Status::Error("KV snapshot: not a snapshot of sequence " + std::to_string(seq.id()));
  }
  const int64_t p = first_position_;
  const int64_t processed = seq.num_positions() - p;
  if (processed < 0 || processed > rows_ || kept < 0 || kept > processed) {
    return Status::Error("KV snapshot: keeping " + std::to_string(kept) + " rows of a sequence at position " +
                         std::to_string(seq.num_positions()) + " captured at " + std::to_string(p) + " for " +
                         std::to_string(rows_) + " rows");
  }
  disarm(seq);
  if (kept == processed) return Status::Ok();
  const int64_t q = p + kept;  // the position the sequence continues at
  const int64_t d = seq.layout().head_dim;
  size_t tail_row = 0, tail_index = 0;
  for (int l = 0; l < seq.num_layers(); ++l) {
    WindowRing& ring = seq.window(l);
    for (int64_t i = kept; i < rows_; ++i) {
      const size_t row = static_cast<size_t>(l * rows_ + i);
      ring.restore_slot(static_cast<int>((p + i) % ring.window()), &ring_codes_[row * static_cast<size_t>(d)],
                        &ring_scales_[row * static_cast<size_t>(d / 32)], ring_tags_[row]);
    }
    if (CompressedKv* kv = seq.compressed(l)) {
      // Groups completed by a kept row stay; those completed by rolled-back rows go.
      kv->truncate(std::max(entries_[static_cast<size_t>(l)], q / kv->ratio()));
    }
    if (CompressorTail* tail = seq.tail(l)) {
      const RowJournal& journal = tail_journals_[tail_index++];
      const int64_t r = tail->ratio;
      const size_t n = static_cast<size_t>(tail->head_dim);
      const int64_t touched = std::min<int64_t>(rows_, r);
      for (int64_t i = 0; i < touched; ++i, tail_row += 2 * n) {
        const int64_t residue = (p + i) % r;
        // The plain run's slot holds the latest position < q with this residue: a kept row, or what was there.
        const int64_t latest = q - 1 - (((q - 1 - residue) % r) + r) % r;
        const float* kv_row = &tail_rows_[tail_row];
        const float* score_row = &tail_rows_[tail_row + n];
        if (latest >= p) {
          kv_row = &journal.rows[static_cast<size_t>((latest - p) * journal.width)];
          score_row = kv_row + n;
        }
        const size_t slot = static_cast<size_t>(residue) * n;
        std::memcpy(&tail->kv[slot], kv_row, n * sizeof(float));
        std::memcpy(&tail->score[slot], score_row, n * sizeof(float));
      }
    }
  }
  if (EngramHistory* history = seq.engram(); history != nullptr && !engram_.empty()) {
    Status s = history->restore(engram_[0], std::span<const int64_t>(engram_.data() + 1, engram_.size() - 1));
    if (!s.ok()) return s.with_context("KV snapshot");
    const int64_t replay = std::min<int64_t>(kept, static_cast<int64_t>(engram_journal_.size()));
    history->append(std::span<const int64_t>(engram_journal_.data(), static_cast<size_t>(replay)));
  }
  seq.num_positions_ = q;
  return Status::Ok();
}

}  // namespace dsflash::kv
