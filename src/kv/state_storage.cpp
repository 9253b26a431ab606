#include "kv/state_storage.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "formats/quant.h"
#include "kv/sequence_pages.h"

namespace dsflash::kv {

void WindowRing::write(int64_t position, const uint8_t* codes, const uint8_t* scales) {
  const int64_t slot = position % window_;
  std::memcpy(codes_ + slot * head_dim_, codes, static_cast<size_t>(head_dim_));
  std::memcpy(scales_ + slot * (head_dim_ / 32), scales, static_cast<size_t>(head_dim_ / 32));
  positions_[slot] = position;
}

void WindowRing::restore_slot(int slot, const uint8_t* codes, const uint8_t* scales, int64_t tag) {
  std::memcpy(codes_ + static_cast<int64_t>(slot) * head_dim_, codes, static_cast<size_t>(head_dim_));
  std::memcpy(scales_ + static_cast<int64_t>(slot) * (head_dim_ / 32), scales, static_cast<size_t>(head_dim_ / 32));
  positions_[slot] = tag;
}

void WindowRing::read_slot(int slot, float* out, WindowRowDequant dequant) const {
  dequant(slot_codes(slot), slot_scales(slot), head_dim_, out);
}

void WindowRing::clear() { std::fill(positions_, positions_ + window_, int64_t{-1}); }

CompressedKv::CompressedKv(SequencePages* pages, int source) : pages_(pages), source_(source) {
  const GlobalSource& s = pages->layout().sources[static_cast<size_t>(source)];
  ratio_ = s.ratio;
  head_dim_ = pages->layout().head_dim;
  index_head_dim_ = pages->layout().index_head_dim;
}

int64_t CompressedKv::capacity_entries() const { return pages_->capacity_entries(source_); }

Status CompressedKv::append(const uint8_t* kv_packed, const uint8_t* kv_scales, const uint8_t* key_packed,
                            const uint8_t* key_scales) {
  const int64_t entry = num_entries_;
  if (entry >= capacity_entries()) {
    return Status::Error("compressed KV (layer " + std::to_string(pages_->layout().sources[source_].layer) +
                         "): entry " + std::to_string(entry) + " (positions up to " +
                         std::to_string((entry + 1) * ratio_) + ") is past the " +
                         std::to_string(pages_->capacity_positions()) +
                         " positions reserved; reserve before the forward (KvCacheManager::reserve)");
  }
  if (pages_->entry_frozen(source_, entry)) {
    return Status::Error("compressed KV (layer " + std::to_string(pages_->layout().sources[source_].layer) +
                         "): entry " + std::to_string(entry) + " lies in published block " +
                         std::to_string(entry * ratio_ / pages_->layout().block_tokens) + " (read-only, may be shared)");
  }
  uint8_t* kv_row = pages_->main_entry(source_, entry);
  std::memcpy(kv_row, kv_packed, static_cast<size_t>(head_dim_ / 2));
  std::memcpy(kv_row + head_dim_ / 2, kv_scales, static_cast<size_t>(head_dim_ / 16));
  uint8_t* key_row = pages_->index_key(source_, entry);
  std::memcpy(key_row, key_packed, static_cast<size_t>(index_head_dim_ / 2));
  std::memcpy(key_row + index_head_dim_ / 2, key_scales, static_cast<size_t>(index_head_dim_ / 32));
  ++num_entries_;
  return Status::Ok();
}

const uint8_t* CompressedKv::kv_row(int64_t entry) const {
  return static_cast<const SequencePages*>(pages_)->main_entry(source_, entry);
}

const uint8_t* CompressedKv::index_key_row(int64_t entry) const {
  return static_cast<const SequencePages*>(pages_)->index_key(source_, entry);
}

void CompressedKv::index_key_rows(int64_t first, int64_t count, const uint8_t** rows) const {
  static_cast<const SequencePages*>(pages_)->index_keys(source_, first, count, rows);
}

void CompressedKv::read_kv(int64_t entry, float* out, CompressedRowDequant dequant) const {
  const uint8_t* row = kv_row(entry);
  dequant(row, row + head_dim_ / 2, head_dim_, out);
}

void CompressedKv::read_index_key(int64_t entry, float* out) const {
  const uint8_t* row = index_key_row(entry);
  dequant_e2m1_ue8m0(row, row + index_head_dim_ / 2, index_head_dim_, 32, out);
}

void CompressedKv::truncate(int64_t num_entries) { num_entries_ = std::clamp<int64_t>(num_entries, 0, num_entries_); }

Status CompressedKv::set_num_entries(int64_t num_entries) {
  if (num_entries < 0 || num_entries > capacity_entries()) {
    return Status::Error("compressed KV: " + std::to_string(num_entries) + " entries declared, pages hold " +
                         std::to_string(capacity_entries()));
  }
  num_entries_ = num_entries;
  return Status::Ok();
}

void CompressorTail::reset() {
  std::fill(kv.begin(), kv.end(), 0.0f);
  std::fill(score.begin(), score.end(), -std::numeric_limits<float>::infinity());
}

void RowJournal::arm(int64_t first, int64_t num_rows, int64_t row_width) {
  first_position = first;
  capacity = num_rows;
  width = row_width;
  rows.assign(static_cast<size_t>(num_rows * row_width), 0.0f);
}

void CompressorTail::store(int64_t position, const float* kv_row, const float* score_row) {
  const size_t slot = static_cast<size_t>((position % ratio) * head_dim);
  const size_t n = static_cast<size_t>(head_dim);
  std::memcpy(&kv[slot], kv_row, n * sizeof(float));
  std::memcpy(&score[slot], score_row, n * sizeof(float));
  if (journal != nullptr && position >= journal->first_position &&
      position < journal->first_position + journal->capacity) {
    float* row = &journal->rows[static_cast<size_t>((position - journal->first_position) * journal->width)];
    std::memcpy(row, kv_row, n * sizeof(float));
    std::memcpy(row + n, score_row, n * sizeof(float));
  }
}

void EngramHistory::append(std::span<const int64_t> ids) {
  if (journal_ != nullptr) journal_->insert(journal_->end(), ids.begin(), ids.end());
  const int64_t n = static_cast<int64_t>(ids.size());
  if (capacity_ > 0) {
    int64_t* recent = storage_ + 1;
    const int64_t old = size();
    const int64_t keep_old = std::clamp<int64_t>(capacity_ - n, 0, old);  // old ids that stay
    std::memmove(recent, recent + (old - keep_old), static_cast<size_t>(keep_old) * sizeof(int64_t));
    const int64_t take = std::min(n, capacity_);
    if (take > 0) std::memcpy(recent + keep_old, ids.data() + (n - take), static_cast<size_t>(take) * sizeof(int64_t));
  }
  storage_[0] += n;
}

Status EngramHistory::restore(int64_t num_positions, std::span<const int64_t> recent) {
  const int64_t want = num_positions < capacity_ ? num_positions : capacity_;
  if (num_positions < 0 || static_cast<int64_t>(recent.size()) != want) {
    return Status::Error("Engram history: restore after " + std::to_string(num_positions) + " positions needs " +
                         std::to_string(want) + " recent ids, got " + std::to_string(recent.size()));
  }
  if (!recent.empty()) std::memcpy(storage_ + 1, recent.data(), recent.size() * sizeof(int64_t));
  storage_[0] = num_positions;
  return Status::Ok();
}

}  // namespace dsflash::kv
