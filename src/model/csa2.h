// The CSA2 sharing of one forward call and the optional recorder of attention intermediates (spec/MODEL.md
// §4.3-§4.5). The per-sequence state the layers read and write (window rings, compressed KV, compressor tails,
// Engram history) is kv::SequenceKv (kv/sequence_kv.h), owned by the KV cache manager.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/workspace.h"

#include "kv/sequence_kv.h"

namespace dsflash {

// One sequence's KV state as the model sees it: the kv/ storage, with the layers' names for its parts.
using SequenceState = kv::SequenceKv;
using kv::CompressedKv;
using kv::CompressorTail;
using kv::WindowRing;

// CSA2 sharing inside one forward call (spec §4.5 table; model.py SharedAttentionRuntime). Layers run in
// order; index sources publish their top-k here and the candidate source publishes its pool, Reuse and
// Reindex layers read them. Compressed KV and indexer keys are read from SequenceState at the layer's
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
  std::span<int32_t> topk;

  // Published by the candidate source: [num_tokens, candidate_width] pool mask (1 = in pool),
  // candidate_width = compressed positions visible to the call's last query.
  int candidate_layer = -1;
  int64_t candidate_width = 0;
  std::span<uint8_t> candidates;

  // Where topk / candidates live: an arena that outlives the forward call (the step arena of the caller's
  // workspace; forward() sets it), or nullptr: the storage vectors below (layer tests). Not changed by reset().
  Arena* publish_arena = nullptr;
  std::vector<int32_t> topk_storage;
  std::vector<uint8_t> candidates_storage;
  // Memory for the next published top-k [n] / pool [n]; the previous publication stays readable until then.
  std::span<int32_t> new_topk(size_t n);
  std::span<uint8_t> new_candidates(size_t n);
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
