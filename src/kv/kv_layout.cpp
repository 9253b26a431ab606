#include "kv/kv_layout.h"

#include <algorithm>
#include <sstream>

namespace dsflash::kv {

Result<KvLayout> KvLayout::from_config(const ModelConfig& config, int64_t block_tokens) {
  if (block_tokens <= 0) {
    return Status::Error("KV layout: block_tokens " + std::to_string(block_tokens) + " must be > 0");
  }
  if (config.head_dim <= 0 || config.head_dim % 32 != 0) {
    return Status::Error("KV layout: config head_dim " + std::to_string(config.head_dim) +
                         " must be a positive multiple of 32 (FP8 window rows, FP4 main KV blocks of 16)");
  }
  if (config.window_size <= 0) {
    return Status::Error("KV layout: config window_size " + std::to_string(config.window_size) + " must be > 0");
  }
  KvLayout layout;
  layout.block_tokens = block_tokens;
  layout.window = config.window_size;
  layout.num_window_layers = config.total_layers();
  layout.window_row_bytes = config.head_dim + config.head_dim / 32;
  layout.window_tag_bytes = static_cast<int64_t>(sizeof(int64_t));
  layout.head_dim = config.head_dim;
  layout.index_head_dim = config.index_head_dim;
  if (!config.kv_source_layers.empty() && (config.index_head_dim <= 0 || config.index_head_dim % 32 != 0)) {
    return Status::Error("KV layout: config index_head_dim " + std::to_string(config.index_head_dim) +
                         " must be a positive multiple of 32 (MXFP4 indexer keys)");
  }
  int64_t offset = 0;
  for (int layer : config.kv_source_layers) {
    const int ratio = config.compress_ratio(layer);
    if (ratio <= 0) {
      return Status::Error("KV layout: kv_source_layers entry " + std::to_string(layer) +
                           " has compress_ratios value " + std::to_string(ratio) + " (must be > 0)");
    }
    if (block_tokens % ratio != 0) {
      return Status::Error("KV layout: block_tokens " + std::to_string(block_tokens) +
                           " is not a multiple of the compress ratio " + std::to_string(ratio) + " of layer " +
                           std::to_string(layer));
    }
    GlobalSource source;
    source.layer = layer;
    source.ratio = ratio;
    source.main_entry_bytes = config.head_dim / 2 + config.head_dim / 16;
    source.index_key_bytes = config.index_head_dim / 2 + config.index_head_dim / 32;
    source.entries_per_block = block_tokens / ratio;
    source.main_offset = offset;
    offset += source.entries_per_block * source.main_entry_bytes;
    source.index_offset = offset;
    offset += source.entries_per_block * source.index_key_bytes;
    if (ratio > 1) layout.tail_bytes += 2 * static_cast<int64_t>(ratio) * config.head_dim * 4;
    layout.sources.push_back(source);
  }
  layout.block_bytes = offset;
  if (!config.engram_layer_ids.empty()) {
    const int64_t recent = std::max(config.engram_max_ngram_size - 1, 0);
    layout.engram_recent = recent;
    layout.engram_history_bytes = (recent + 1) * static_cast<int64_t>(sizeof(int64_t));
  }
  return layout;
}

int KvLayout::source_index(int layer) const {
  for (size_t i = 0; i < sources.size(); ++i) {
    if (sources[i].layer == layer) return static_cast<int>(i);
  }
  return -1;
}

double KvLayout::global_bytes_per_token() const {
  double total = 0;
  for (const GlobalSource& s : sources) {
    total += static_cast<double>(s.main_entry_bytes + s.index_key_bytes) / s.ratio;
  }
  return total;
}

int64_t KvLayout::blocks_for_positions(int64_t num_positions) const {
  if (num_positions <= 0 || block_bytes == 0) return 0;
  return (num_positions + block_tokens - 1) / block_tokens;
}

int64_t KvLayout::global_bytes_for_positions(int64_t num_positions) const {
  return blocks_for_positions(num_positions) * block_bytes;
}

int64_t KvLayout::window_bytes_per_sequence() const {
  return static_cast<int64_t>(num_window_layers) * window * window_row_bytes;
}

int64_t KvLayout::window_tag_bytes_per_sequence() const {
  return static_cast<int64_t>(num_window_layers) * window * window_tag_bytes;
}

int64_t KvLayout::fixed_bytes_per_sequence() const {
  return window_bytes_per_sequence() + window_tag_bytes_per_sequence() + tail_bytes + engram_history_bytes;
}

std::string KvLayout::describe() const {
  std::ostringstream out;
  out << "global KV: " << sources.size() << " sources, " << global_bytes_per_token() << " B/token (";
  for (size_t i = 0; i < sources.size(); ++i) {
    const GlobalSource& s = sources[i];
    out << (i ? ", " : "") << "L" << s.layer << " ratio " << s.ratio << ": " << s.main_entry_bytes << "+"
        << s.index_key_bytes << " B/entry";
  }
  out << "); block " << block_tokens << " tokens = " << block_bytes << " B\n";
  out << "window rings: " << num_window_layers << " layers x " << window << " rows x " << window_row_bytes
      << " B = " << window_bytes_per_sequence() << " B/sequence (+ " << window_tag_bytes_per_sequence()
      << " B slot tags)\n";
  out << "compressor tails: " << tail_bytes << " B/sequence; Engram history: " << engram_history_bytes
      << " B/sequence\n";
  return out.str();
}

}  // namespace dsflash::kv
