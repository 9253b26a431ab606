// Byte layouts of the KV cache of one model (spec/MODEL.md §6; DESIGN.md "Memory formats"), derived from the
// config: what one global-KV block holds, what one sequence's fixed state (window rings, compressor tails, Engram
// history) costs, and the formula figures (bytes per token) that `dsflash inspect` and the benchmark report.
//
// Global KV lives only on the KV-source layers. One block covers `block_tokens` consecutive positions of one
// sequence and holds, for every KV source s (ratio r_s), the block_tokens / r_s entries those positions emit:
//   [s0 main entries][s0 indexer keys][s1 main entries][s1 indexer keys]...
//   main entry  : head_dim/2 packed e2m1 + head_dim/16 e4m3 scales        (288 B at head_dim 512)
//   indexer key : index_head_dim/2 packed e2m1 + index_head_dim/32 ue8m0 (68 B at index_head_dim 128)
// so block_bytes = block_tokens * (global bytes per token) exactly (890 * block_tokens on V4.1), and a sequence of
// N positions holds ceil(N / block_tokens) blocks: the only rounding is the last, partly filled block.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/model_config.h"

namespace dsflash::kv {

struct GlobalSource {
  int layer = 0;                 // KV-source layer id (V4.1: 2, 8, 14, 20)
  int ratio = 1;                 // positions per entry (2 encoder, 1 decoder)
  int64_t main_entry_bytes = 0;  // head_dim/2 + head_dim/16
  int64_t index_key_bytes = 0;   // index_head_dim/2 + index_head_dim/32
  int64_t entries_per_block = 0; // block_tokens / ratio
  int64_t main_offset = 0;       // byte offset of this source's main entries inside a block
  int64_t index_offset = 0;      // byte offset of this source's indexer keys inside a block
};

struct KvLayout {
  int64_t block_tokens = 0;  // positions covered by one global-KV block
  int64_t block_bytes = 0;   // bytes of one block (all sources)
  std::vector<GlobalSource> sources;

  // Entry dims (config.head_dim, config.index_head_dim).
  int64_t head_dim = 0;
  int64_t index_head_dim = 0;

  // Per-sequence fixed state (kv::SequenceKv carves exactly fixed_bytes_per_sequence() bytes out of one arena).
  int window = 0;                // window rows per layer (V4.1: 128)
  int num_window_layers = 0;     // layers with a window ring (backbone + DSpark stages)
  int64_t window_row_bytes = 0;  // head_dim e4m3 + head_dim/32 ue8m0 (528 B at 512)
  int64_t window_tag_bytes = 0;  // per ring slot: the int64 position it holds (8 B)
  int64_t tail_bytes = 0;        // fp32 kv + score [ratio, head_dim] of every ratio > 1 source
  int64_t engram_recent = 0;     // Engram history capacity: max_ngram - 1 ids (0 without Engram layers)
  int64_t engram_history_bytes = 0;  // (engram_recent + 1) int64: the counter + the recent compressed ids

  // block_tokens must be a positive multiple of every KV source's ratio. Errors name the config field.
  static Result<KvLayout> from_config(const ModelConfig& config, int64_t block_tokens = 64);

  // Index into `sources` of a layer, or -1 when the layer is not a KV source.
  int source_index(int layer) const;

  // Formula figure: global KV bytes per token, sum over sources of (main + index key) / ratio (890 on V4.1).
  double global_bytes_per_token() const;
  // Blocks that hold `num_positions` positions (ceil(num_positions / block_tokens)).
  int64_t blocks_for_positions(int64_t num_positions) const;
  // Global KV bytes allocated for a sequence of `num_positions` positions (whole blocks).
  int64_t global_bytes_for_positions(int64_t num_positions) const;
  // Window rings of one sequence: num_window_layers * window * window_row_bytes (2,703,360 B on V4.1 backbone).
  int64_t window_bytes_per_sequence() const;
  // Slot tags of the window rings: num_window_layers * window * window_tag_bytes.
  int64_t window_tag_bytes_per_sequence() const;
  // Window rings (rows + slot tags) + compressor tails + Engram history: what a sequence costs before its first
  // global block.
  int64_t fixed_bytes_per_sequence() const;

  // One line per figure, for `inspect` and the benchmark.
  std::string describe() const;
};

}  // namespace dsflash::kv
