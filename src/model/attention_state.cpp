#include "model/attention_state.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "formats/quant.h"
#include "kv/kv_cache.h"

namespace dsflash {

WindowRing::WindowRing(int window, int64_t head_dim)
    : window_(window),
      head_dim_(head_dim),
      codes_(static_cast<size_t>(window) * static_cast<size_t>(head_dim), 0),
      scales_(static_cast<size_t>(window) * static_cast<size_t>(head_dim / 32), 0),
      positions_(static_cast<size_t>(window), -1) {}

void WindowRing::write(int64_t position, const uint8_t* codes, const uint8_t* scales) {
  const size_t slot = static_cast<size_t>(position % window_);
  std::memcpy(codes_.data() + slot * head_dim_, codes, static_cast<size_t>(head_dim_));
  std::memcpy(scales_.data() + slot * (head_dim_ / 32), scales, static_cast<size_t>(head_dim_ / 32));
  positions_[slot] = position;
}

bool WindowRing::holds(int64_t position) const {
  return position >= 0 && positions_[static_cast<size_t>(position % window_)] == position;
}

void WindowRing::read_slot(int slot, float* out) const {
  dequant_e4m3_ue8m0(slot_codes(slot), slot_scales(slot), head_dim_, 32, out);
}

void WindowRing::clear() {
  std::fill(codes_.begin(), codes_.end(), 0);
  std::fill(scales_.begin(), scales_.end(), 0);
  std::fill(positions_.begin(), positions_.end(), -1);
}

CompressedKv::CompressedKv(int ratio, int64_t head_dim, int64_t index_head_dim)
    : ratio_(ratio), head_dim_(head_dim), index_head_dim_(index_head_dim) {}

Status CompressedKv::append(const uint8_t* kv_packed, const uint8_t* kv_scales, const uint8_t* key_packed,
                            const uint8_t* key_scales) {
  if (pages_ != nullptr) {
    if (num_entries_ >= pages_->capacity_entries(source_)) {
      Status s = pages_->reserve_positions((num_entries_ + 1) * ratio_);
      if (!s.ok()) return s.with_context("compressed KV entry " + std::to_string(num_entries_));
    }
    uint8_t* kv_row = pages_->main_entry(source_, num_entries_);
    std::memcpy(kv_row, kv_packed, static_cast<size_t>(head_dim_ / 2));
    std::memcpy(kv_row + head_dim_ / 2, kv_scales, static_cast<size_t>(head_dim_ / 16));
    uint8_t* key_row = pages_->index_key(source_, num_entries_);
    std::memcpy(key_row, key_packed, static_cast<size_t>(index_head_dim_ / 2));
    std::memcpy(key_row + index_head_dim_ / 2, key_scales, static_cast<size_t>(index_head_dim_ / 32));
    ++num_entries_;
    return Status::Ok();
  }
  kv_.insert(kv_.end(), kv_packed, kv_packed + head_dim_ / 2);
  kv_.insert(kv_.end(), kv_scales, kv_scales + head_dim_ / 16);
  index_k_.insert(index_k_.end(), key_packed, key_packed + index_head_dim_ / 2);
  index_k_.insert(index_k_.end(), key_scales, key_scales + index_head_dim_ / 32);
  ++num_entries_;
  return Status::Ok();
}

Status CompressedKv::attach_pages(kv::SequencePages* pages, int source) {
  if (pages == nullptr) return Status::Error("compressed KV: attach_pages with no pages");
  const auto& sources = pages->layout().sources;
  if (source < 0 || source >= static_cast<int>(sources.size())) {
    return Status::Error("compressed KV: page layout has no source " + std::to_string(source));
  }
  const kv::GlobalSource& src = sources[static_cast<size_t>(source)];
  if (src.ratio != ratio_ || src.main_entry_bytes != kv_bytes(head_dim_) ||
      src.index_key_bytes != index_key_bytes(index_head_dim_)) {
    return Status::Error("compressed KV: page layout source " + std::to_string(source) + " (layer " +
                         std::to_string(src.layer) + ", ratio " + std::to_string(src.ratio) + ", " +
                         std::to_string(src.main_entry_bytes) + "+" + std::to_string(src.index_key_bytes) +
                         " B) does not match this cache (ratio " + std::to_string(ratio_) + ", " +
                         std::to_string(kv_bytes(head_dim_)) + "+" + std::to_string(index_key_bytes(index_head_dim_)) +
                         " B)");
  }
  if (num_entries_ > pages->capacity_entries(source)) {
    Status s = pages->reserve_positions(num_entries_ * ratio_);
    if (!s.ok()) return s.with_context("compressed KV: attaching pages");
  }
  for (int64_t e = 0; e < num_entries_; ++e) {
    std::memcpy(pages->main_entry(source, e), kv_row(e), static_cast<size_t>(kv_bytes(head_dim_)));
    std::memcpy(pages->index_key(source, e), index_key_row(e), static_cast<size_t>(index_key_bytes(index_head_dim_)));
  }
  pages_ = pages;
  source_ = source;
  kv_.clear();
  kv_.shrink_to_fit();
  index_k_.clear();
  index_k_.shrink_to_fit();
  return Status::Ok();
}

Status CompressedKv::reserve_positions(int64_t num_positions) {
  return pages_ != nullptr ? pages_->reserve_positions(num_positions) : Status::Ok();
}

const uint8_t* CompressedKv::kv_row(int64_t entry) const {
  if (pages_ != nullptr) return pages_->main_entry(source_, entry);
  return kv_.data() + static_cast<size_t>(entry) * static_cast<size_t>(kv_bytes(head_dim_));
}

const uint8_t* CompressedKv::index_key_row(int64_t entry) const {
  if (pages_ != nullptr) return pages_->index_key(source_, entry);
  return index_k_.data() + static_cast<size_t>(entry) * static_cast<size_t>(index_key_bytes(index_head_dim_));
}

void CompressedKv::read_kv(int64_t entry, float* out) const {
  const uint8_t* row = kv_row(entry);
  dequant_e2m1_e4m3(row, row + head_dim_ / 2, head_dim_, 16, out);
}

void CompressedKv::read_index_key(int64_t entry, float* out) const {
  const uint8_t* row = index_key_row(entry);
  dequant_e2m1_ue8m0(row, row + index_head_dim_ / 2, index_head_dim_, 32, out);
}

void CompressedKv::truncate(int64_t num_entries) {
  num_entries = std::clamp<int64_t>(num_entries, 0, num_entries_);
  if (pages_ == nullptr) {
    kv_.resize(static_cast<size_t>(num_entries * kv_bytes(head_dim_)));
    index_k_.resize(static_cast<size_t>(num_entries * index_key_bytes(index_head_dim_)));
  }
  num_entries_ = num_entries;
}

void CompressorTail::reset() {
  const size_t n = static_cast<size_t>(ratio) * static_cast<size_t>(head_dim);
  kv.assign(n, 0.0f);
  score.assign(n, -std::numeric_limits<float>::infinity());
}

Result<AttentionState> AttentionState::create(const ModelConfig& config) {
  if (config.head_dim <= 0 || config.head_dim % 32 != 0) {
    return Status::Error("attention state: head_dim " + std::to_string(config.head_dim) +
                         " must be a positive multiple of 32 (FP8 and FP4 cache blocks)");
  }
  if (config.window_size <= 0) {
    return Status::Error("attention state: window_size " + std::to_string(config.window_size) + " must be > 0");
  }
  if (!config.kv_source_layers.empty() && (config.index_head_dim <= 0 || config.index_head_dim % 32 != 0)) {
    return Status::Error("attention state: index_head_dim " + std::to_string(config.index_head_dim) +
                         " must be a positive multiple of 32 (MXFP4 indexer keys)");
  }
  const int layers = config.total_layers();
  if (static_cast<int>(config.compress_ratios.size()) < layers) {
    return Status::Error("attention state: compress_ratios has " + std::to_string(config.compress_ratios.size()) +
                         " entries, the model has " + std::to_string(layers) + " layers");
  }
  AttentionState state;
  state.windows_.reserve(static_cast<size_t>(layers));
  state.compressed_slot_.assign(static_cast<size_t>(layers), -1);
  for (int layer = 0; layer < layers; ++layer) {
    state.windows_.emplace_back(config.window_size, config.head_dim);
  }
  for (int layer : config.kv_source_layers) {
    if (layer < 0 || layer >= config.n_layers) {
      return Status::Error("attention state: kv_source_layers entry " + std::to_string(layer) + " out of range");
    }
    const int ratio = config.compress_ratios[static_cast<size_t>(layer)];
    if (ratio <= 0) {
      return Status::Error("attention state: KV source layer " + std::to_string(layer) + " has compress ratio " +
                           std::to_string(ratio));
    }
    state.compressed_slot_[static_cast<size_t>(layer)] = static_cast<int>(state.compressed_.size());
    state.compressed_.emplace_back(ratio, config.head_dim, config.index_head_dim);
    CompressorTail tail;
    if (ratio > 1) {
      tail.ratio = ratio;
      tail.head_dim = config.head_dim;
      tail.reset();
    }
    state.tails_.push_back(std::move(tail));
  }
  return state;
}

Status AttentionState::attach_pages(kv::SequencePages* pages) {
  if (pages == nullptr) return Status::Error("attention state: attach_pages with no pages");
  for (int layer = 0; layer < num_layers(); ++layer) {
    CompressedKv* kv = compressed(layer);
    if (kv == nullptr) continue;
    const int source = pages->layout().source_index(layer);
    if (source < 0) {
      return Status::Error("attention state: the page layout has no KV source for layer " + std::to_string(layer));
    }
    Status s = kv->attach_pages(pages, source);
    if (!s.ok()) return s.with_context("layer " + std::to_string(layer));
  }
  return Status::Ok();
}

Status AttentionState::reserve_positions(int64_t num_positions) {
  for (CompressedKv& kv : compressed_) {
    Status s = kv.reserve_positions(num_positions);
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

CompressedKv* AttentionState::compressed(int layer) {
  if (layer < 0 || layer >= num_layers()) return nullptr;
  const int slot = compressed_slot_[static_cast<size_t>(layer)];
  return slot < 0 ? nullptr : &compressed_[static_cast<size_t>(slot)];
}

const CompressedKv* AttentionState::compressed(int layer) const {
  return const_cast<AttentionState*>(this)->compressed(layer);
}

CompressorTail* AttentionState::tail(int layer) {
  if (layer < 0 || layer >= num_layers()) return nullptr;
  const int slot = compressed_slot_[static_cast<size_t>(layer)];
  if (slot < 0 || tails_[static_cast<size_t>(slot)].ratio <= 1) return nullptr;
  return &tails_[static_cast<size_t>(slot)];
}

const CompressorTail* AttentionState::tail(int layer) const { return const_cast<AttentionState*>(this)->tail(layer); }

void AttentionState::clear() {
  for (WindowRing& ring : windows_) ring.clear();
  for (CompressedKv& kv : compressed_) kv.clear();
  for (CompressorTail& tail : tails_) {
    if (tail.ratio > 1) tail.reset();
  }
}

size_t AttentionState::bytes() const {
  size_t total = global_kv_bytes();
  for (const WindowRing& ring : windows_) total += ring.bytes();
  for (const CompressorTail& tail : tails_) total += (tail.kv.size() + tail.score.size()) * sizeof(float);
  return total;
}

size_t AttentionState::global_kv_bytes() const {
  size_t total = 0;
  for (const CompressedKv& kv : compressed_) total += kv.bytes();
  return total;
}

void Csa2Shared::reset(int64_t start, int64_t tokens, int64_t floor) {
  start_pos = start;
  num_tokens = tokens;
  window_floor = floor;
  prefill_end = 0;
  topk_layer = -1;
  topk_width = 0;
  topk.clear();
  candidate_layer = -1;
  candidate_width = 0;
  candidates.clear();
}

void AttentionTrace::clear() { *this = AttentionTrace(); }

}  // namespace dsflash
