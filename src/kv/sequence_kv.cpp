#include "kv/sequence_kv.h"

#include <cassert>

namespace dsflash::kv {

SequenceKv::SequenceKv(KvCacheManager* owner, const KvLayout* layout, int64_t id)
    : pages_(owner, layout, id), fixed_bytes_(layout->fixed_bytes_per_sequence()) {
  const KvLayout& l = *layout;
  arena_.reset(static_cast<uint8_t*>(
      ::operator new[](static_cast<size_t>(fixed_bytes_ > 0 ? fixed_bytes_ : 1), std::align_val_t{64})));
  uint8_t* cursor = arena_.get();
  auto take = [&cursor](int64_t bytes) {
    uint8_t* p = cursor;
    cursor += bytes;
    return p;
  };
  has_engram_ = l.engram_history_bytes > 0;
  if (has_engram_) {
    engram_ = EngramHistory(l.engram_recent, reinterpret_cast<int64_t*>(take(l.engram_history_bytes)));
  }
  int64_t* tags = reinterpret_cast<int64_t*>(take(l.window_tag_bytes_per_sequence()));
  for (size_t s = 0; s < l.sources.size(); ++s) {
    compressed_.emplace_back(&pages_, static_cast<int>(s));
    const int ratio = l.sources[s].ratio;
    if (ratio > 1) {
      const size_t n = static_cast<size_t>(ratio) * static_cast<size_t>(l.head_dim);
      CompressorTail tail;
      tail.ratio = ratio;
      tail.head_dim = l.head_dim;
      tail.kv = {reinterpret_cast<float*>(take(static_cast<int64_t>(n * sizeof(float)))), n};
      tail.score = {reinterpret_cast<float*>(take(static_cast<int64_t>(n * sizeof(float)))), n};
      tail_of_source_.push_back(static_cast<int>(tails_.size()));
      tails_.push_back(tail);
    } else {
      tail_of_source_.push_back(-1);
    }
  }
  source_of_layer_.assign(static_cast<size_t>(l.num_window_layers), -1);
  for (size_t s = 0; s < l.sources.size(); ++s) {
    const int layer = l.sources[s].layer;
    if (layer >= 0 && layer < l.num_window_layers) source_of_layer_[static_cast<size_t>(layer)] = static_cast<int>(s);
  }
  const int64_t codes_bytes = static_cast<int64_t>(l.window) * l.head_dim;
  const int64_t scales_bytes = static_cast<int64_t>(l.window) * (l.head_dim / 32);
  for (int layer = 0; layer < l.num_window_layers; ++layer) {
    uint8_t* codes = take(codes_bytes);
    uint8_t* scales = take(scales_bytes);
    windows_.emplace_back(l.window, l.head_dim, codes, scales, tags + static_cast<int64_t>(layer) * l.window);
  }
  assert(cursor == arena_.get() + fixed_bytes_);
  clear();
}

CompressedKv* SequenceKv::compressed(int layer) {
  if (layer < 0 || layer >= num_layers()) return nullptr;
  const int s = source_of_layer_[static_cast<size_t>(layer)];
  return s < 0 ? nullptr : &compressed_[static_cast<size_t>(s)];
}

const CompressedKv* SequenceKv::compressed(int layer) const {
  return const_cast<SequenceKv*>(this)->compressed(layer);
}

CompressorTail* SequenceKv::tail(int layer) {
  if (layer < 0 || layer >= num_layers()) return nullptr;
  const int s = source_of_layer_[static_cast<size_t>(layer)];
  if (s < 0) return nullptr;
  const int t = tail_of_source_[static_cast<size_t>(s)];
  return t < 0 ? nullptr : &tails_[static_cast<size_t>(t)];
}

const CompressorTail* SequenceKv::tail(int layer) const { return const_cast<SequenceKv*>(this)->tail(layer); }

void SequenceKv::clear() {
  for (WindowRing& w : windows_) w.clear();
  for (CompressedKv& c : compressed_) c.clear();
  for (CompressorTail& t : tails_) t.reset();
  if (has_engram_) engram_.reset();
  num_positions_ = 0;
}

void SequenceKv::adopt_frozen_prefix() {
  const int64_t positions = pages_.frozen_positions();
  for (CompressedKv& c : compressed_) (void)c.set_num_entries(positions / c.ratio());
  num_positions_ = positions;
}

Status SequenceKv::restart_at(int64_t position) {
  for (const CompressedKv& c : compressed_) {
    if (position < 0 || position > c.num_entries() * c.ratio()) {
      return Status::Error("KV state: cannot restart at position " + std::to_string(position) + ": a KV source holds " +
                           std::to_string(c.num_entries()) + " entries of ratio " + std::to_string(c.ratio()));
    }
  }
  for (WindowRing& w : windows_) w.clear();
  for (CompressorTail& t : tails_) t.reset();
  if (has_engram_) engram_.reset();
  num_positions_ = position;
  return Status::Ok();
}

int64_t SequenceKv::global_kv_bytes() const {
  int64_t bytes = 0;
  for (const CompressedKv& kv : compressed_) bytes += static_cast<int64_t>(kv.bytes());
  return bytes;
}

}  // namespace dsflash::kv
