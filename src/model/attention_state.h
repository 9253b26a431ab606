// Per-sequence attention state of all layers, the CSA2 sharing of one forward call, and the optional
// recorder of attention intermediates (spec/MODEL.md §4.3-§4.5, §6; DESIGN.md "Memory formats").
//
// Everything is held in the byte formats of the KV cache from the start, and rows are dequantised when read
// (dequantisation is exact: each stored value equals the reference's fake-quantised bf16 value):
//   window ring row (every layer)  : head_dim e4m3 + head_dim/32 ue8m0                  (528 B at 512)
//   compressed main KV (KV sources): head_dim/2 packed e2m1 + head_dim/16 e4m3 scales  (288 B at 512)
//   indexer key (KV sources)       : index_head_dim/2 packed e2m1 + index_head_dim/32 ue8m0 (68 B at 128)
//   compressor tail (ratio > 1)    : fp32 kv / score [ratio, head_dim] (the pending part of a group)
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "io/model_config.h"

namespace dsflash {

namespace kv {
class SequencePages;  // kv/kv_cache.h: a sequence's global-KV page table (engine-owned storage)
}

// Sliding-window ring of one layer: slot = position % window. Each slot remembers which absolute position it
// holds (-1 = empty), so readers never see a row that was not written (bounded replay, truncated windows).
class WindowRing {
 public:
  WindowRing() = default;
  WindowRing(int window, int64_t head_dim);

  int window() const { return window_; }
  int64_t head_dim() const { return head_dim_; }
  static int64_t row_bytes(int64_t head_dim) { return head_dim + head_dim / 32; }

  // Stores the row of `position`: codes [head_dim] e4m3, scales [head_dim/32] ue8m0 (act_quant_block32 output).
  void write(int64_t position, const uint8_t* codes, const uint8_t* scales);
  // The position held by `slot`, or -1.
  int64_t slot_position(int slot) const { return positions_[static_cast<size_t>(slot)]; }
  bool holds(int64_t position) const;
  // Dequantised row of a slot: out [head_dim] fp32 (bf16-representable values). The slot must be filled.
  void read_slot(int slot, float* out) const;
  const uint8_t* slot_codes(int slot) const { return codes_.data() + static_cast<size_t>(slot) * head_dim_; }
  const uint8_t* slot_scales(int slot) const { return scales_.data() + static_cast<size_t>(slot) * (head_dim_ / 32); }
  void clear();
  size_t bytes() const { return codes_.size() + scales_.size(); }

 private:
  int window_ = 0;
  int64_t head_dim_ = 0;
  std::vector<uint8_t> codes_;      // [window, head_dim] e4m3
  std::vector<uint8_t> scales_;     // [window, head_dim/32] ue8m0
  std::vector<int64_t> positions_;  // [window] absolute position per slot, -1 = empty
};

// The global (compressed) KV of one KV source: entry j stands for the group of tokens
// [j*ratio, (j+1)*ratio) and holds the main KV row (after RoPE at position j*ratio, FP4 e2m1 with an e4m3
// scale per 16) and the indexer key (after RoPE, MXFP4: e2m1 with a ue8m0 scale per 32).
class CompressedKv {
 public:
  CompressedKv() = default;
  CompressedKv(int ratio, int64_t head_dim, int64_t index_head_dim);

  int ratio() const { return ratio_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t index_head_dim() const { return index_head_dim_; }
  int64_t num_entries() const { return num_entries_; }
  static int64_t kv_bytes(int64_t head_dim) { return head_dim / 2 + head_dim / 16; }
  static int64_t index_key_bytes(int64_t index_head_dim) { return index_head_dim / 2 + index_head_dim / 32; }

  // Appends entry num_entries(): kv_packed [head_dim/2], kv_scales [head_dim/16] e4m3,
  // key_packed [index_head_dim/2], key_scales [index_head_dim/32] ue8m0. With pages attached and full, the pages
  // are grown through their manager; when its budget refuses, nothing is stored and the error is returned
  // (num_entries() stays, so the layer's own entry-count checks fail the forward call too).
  Status append(const uint8_t* kv_packed, const uint8_t* kv_scales, const uint8_t* key_packed,
                const uint8_t* key_scales);
  // Keeps the entries in a sequence's global-KV pages (kv::SequencePages; `source` = this KV source's index in
  // the pages' layout) instead of owned vectors. Entries held so far are copied over. Error (nothing changed) when
  // the layout's entry sizes or ratio differ, or the pages cannot hold the entries.
  Status attach_pages(kv::SequencePages* pages, int source);
  bool paged() const { return pages_ != nullptr; }
  // With pages attached: grows them (through their manager) to hold `num_positions` positions; error, nothing
  // changed, when the budget refuses. Without pages: nothing to do.
  Status reserve_positions(int64_t num_positions);
  // Dequantised rows (exact): out [head_dim] / [index_head_dim] fp32.
  void read_kv(int64_t entry, float* out) const;
  void read_index_key(int64_t entry, float* out) const;
  // Drops entries >= num_entries (prefix cache restore / tests). num_entries <= this->num_entries().
  void truncate(int64_t num_entries);
  void clear() { truncate(0); }
  // Bytes of the entries held (num_entries * (kv_bytes + index_key_bytes)); pages round up to whole blocks.
  size_t bytes() const {
    return static_cast<size_t>(num_entries_ * (kv_bytes(head_dim_) + index_key_bytes(index_head_dim_)));
  }

 private:
  const uint8_t* kv_row(int64_t entry) const;
  const uint8_t* index_key_row(int64_t entry) const;

  kv::SequencePages* pages_ = nullptr;  // not owned; nullptr = owned vectors
  int source_ = -1;
  int ratio_ = 1;
  int64_t head_dim_ = 0;
  int64_t index_head_dim_ = 0;
  int64_t num_entries_ = 0;
  std::vector<uint8_t> kv_;       // [entries, kv_bytes]: packed e2m1 then e4m3 scales
  std::vector<uint8_t> index_k_;  // [entries, index_key_bytes]: packed e2m1 then ue8m0 scales
};

// The pending part of a ratio > 1 group (model.py Compressor kv_state / score_state): slot = position % ratio.
// Slots keep their last values after a group is emitted (as the reference's buffers do).
struct CompressorTail {
  int ratio = 0;
  int64_t head_dim = 0;
  std::vector<float> kv;     // [ratio, head_dim] fp32, initially 0
  std::vector<float> score;  // [ratio, head_dim] fp32, initially -inf
  void reset();
};

// All per-sequence attention state of one sequence. Layers index it by layer id (backbone then DSpark stages).
class AttentionState {
 public:
  // Window rings for every layer (backbone + DSpark), compressed KV for every KV source, tails for ratio > 1
  // sources. Checks the config's shapes (head_dim % 32, index_head_dim % 32, window > 0).
  static Result<AttentionState> create(const ModelConfig& config);

  int num_layers() const { return static_cast<int>(windows_.size()); }
  WindowRing& window(int layer) { return windows_.at(static_cast<size_t>(layer)); }
  const WindowRing& window(int layer) const { return windows_.at(static_cast<size_t>(layer)); }
  // nullptr unless `layer` is a KV source.
  CompressedKv* compressed(int layer);
  const CompressedKv* compressed(int layer) const;
  // nullptr unless `layer` is a KV source with ratio > 1.
  CompressorTail* tail(int layer);
  const CompressorTail* tail(int layer) const;

  // Forget everything (a new sequence). Attached pages stay attached (and keep their blocks).
  void clear();
  // Every KV source keeps its entries in `pages` (kv::KvLayout sources = config.kv_source_layers, in order).
  Status attach_pages(kv::SequencePages* pages);
  // Makes room for `num_positions` positions in the attached pages before a forward call, so that a full cache
  // is reported before any state changes. No-op without pages.
  Status reserve_positions(int64_t num_positions);
  // Bytes held: window rings + compressed entries + tails.
  size_t bytes() const;
  // Bytes of the global KV only (compressed main KV + indexer keys; what a prefix cache persists).
  size_t global_kv_bytes() const;

 private:
  std::vector<WindowRing> windows_;
  std::vector<int> compressed_slot_;  // per layer: index into compressed_ / tails_, or -1
  std::vector<CompressedKv> compressed_;
  std::vector<CompressorTail> tails_;  // same index as compressed_ (ratio 1 sources: empty tail)
};

// CSA2 sharing inside one forward call (spec §4.5 table; model.py SharedAttentionRuntime). Layers run in
// order; index sources publish their top-k here and the candidate source publishes its pool, Reuse and
// Reindex layers read them. Compressed KV and indexer keys are read from AttentionState at the layer's
// role.kv_source_layer: each KV source keeps its own indexer keys ("Decisions for dsflash"), so nothing about
// them needs to be shared here.
class Csa2Shared {
 public:
  // Call at the start of every forward call over positions [start_pos, start_pos + num_tokens).
  // window_floor: see the field.
  void reset(int64_t start_pos, int64_t num_tokens, int64_t window_floor = 0);

  int64_t start_pos = 0;
  int64_t num_tokens = 0;

  // Window truncation (bounded replay, DESIGN.md prefill plan): queries see window rows only at positions
  // >= window_floor; rows below it are treated as absent (-1). 0 = off (the official behaviour). May be
  // changed between layers of one call (e.g. the CED decoder truncated at the replay start, the encoder not).
  int64_t window_floor = 0;

  // End position of the whole prompt when this call is one chunk of a longer prefill (0: this call's end).
  // model.py's one-shot prefill lists min(prompt length, window) window entries per query; a chunk that knows
  // the prompt's end lists the same, so chunked prefill equals one prefill bit for bit even for chunks that end
  // before the window is full. A one-token call with prefill_end set is a prefill chunk too (prefill layout);
  // without it, a one-token call after position 0 is a decode step (model.py's ring layout).
  int64_t prefill_end = 0;

  // Published by the most recent index source (-1: none yet in this call): [num_tokens, topk_width]
  // compressed positions ascending, -1 = none (model.py topk_idxs without the window offset).
  int topk_layer = -1;
  int64_t topk_width = 0;
  std::vector<int32_t> topk;

  // Published by the candidate source: [num_tokens, candidate_width] pool mask (1 = in pool),
  // candidate_width = compressed positions visible to the call's last query.
  int candidate_layer = -1;
  int64_t candidate_width = 0;
  std::vector<uint8_t> candidates;
};

// Optional recorder of one layer's attention intermediates (the goldens' per-layer tensors). Filled by
// AttentionLayer::forward when given; fields that do not apply to the layer stay empty.
struct AttentionTrace {
  // KV sources: latents emitted in this call (normalised, before RoPE and FP4), [num_emitted, head_dim]
  // bf16 values, and the group index of each.
  std::vector<float> compressor_latent;
  std::vector<int64_t> compressor_groups;
  // Index sources: the scores handed to top-k, [num_tokens, index_width] bf16 values (-inf where not visible,
  // and on Reindex layers outside the candidate pool); index_width = (start_pos + num_tokens) / ratio.
  int64_t index_width = 0;
  std::vector<float> index_scores;
  // Index sources: [num_tokens, topk_width] selected positions ascending, -1 = none.
  int64_t topk_width = 0;
  std::vector<int32_t> index_topk;
  // Candidate source: block maxima with the newest block pinned at +inf, [num_tokens, candidate_blocks],
  // and the pool mask [num_tokens, index_width].
  int64_t candidate_blocks = 0;
  std::vector<float> candidate_block_scores;
  std::vector<uint8_t> candidates;

  void clear();
};

}  // namespace dsflash
