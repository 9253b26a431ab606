#include "model/attention_state.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "formats/quant.h"

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

void CompressedKv::append(const uint8_t* kv_packed, const uint8_t* kv_scales, const uint8_t* key_packed,
                          const uint8_t* key_scales) {
  kv_.insert(kv_.end(), kv_packed, kv_packed + head_dim_ / 2);
  kv_.insert(kv_.end(), kv_scales, kv_scales + head_dim_ / 16);
  index_k_.insert(index_k_.end(), key_packed, key_packed + index_head_dim_ / 2);
  index_k_.insert(index_k_.end(), key_scales, key_scales + index_head_dim_ / 32);
  ++num_entries_;
}

void CompressedKv::read_kv(int64_t entry, float* out) const {
  const uint8_t* row = kv_.data() + static_cast<size_t>(entry) * static_cast<size_t>(kv_bytes(head_dim_));
  dequant_e2m1_e4m3(row, row + head_dim_ / 2, head_dim_, 16, out);
}

void CompressedKv::read_index_key(int64_t entry, float* out) const {
  const uint8_t* row =
      index_k_.data() + static_cast<size_t>(entry) * static_cast<size_t>(index_key_bytes(index_head_dim_));
  dequant_e2m1_ue8m0(row, row + index_head_dim_ / 2, index_head_dim_, 32, out);
}

void CompressedKv::truncate(int64_t num_entries) {
  num_entries = std::clamp<int64_t>(num_entries, 0, num_entries_);
  kv_.resize(static_cast<size_t>(num_entries * kv_bytes(head_dim_)));
  index_k_.resize(static_cast<size_t>(num_entries * index_key_bytes(index_head_dim_)));
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
  topk_layer = -1;
  topk_width = 0;
  topk.clear();
  candidate_layer = -1;
  candidate_width = 0;
  candidates.clear();
}

void AttentionTrace::clear() { *this = AttentionTrace(); }

}  // namespace dsflash
