// Attention of one layer (spec/MODEL.md §4.3-§4.6): q path, the single latent K=V into the FP8 window ring,
// the compressor (KV sources), the indexer (index sources) with CSA2 sharing, sparse attention with the sink,
// inverse RoPE, grouped wo_a then wo_b. The layer loop (model/forward.h) calls it once per layer for a batch of
// ragged rows.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/function_ref.h"
#include "core/status.h"
#include "io/checkpoint.h"
#include "kernels/linear.h"
#include "model/compute_context.h"
#include "model/csa2.h"
#include "model/rope.h"

namespace dsflash {

// SequenceState (kv::SequenceKv): per-sequence state of all layers: window rings (FP8 e4m3 + ue8m0, 528 B/row
// at head_dim 512), compressed main KV (FP4 e2m1 + e4m3 scales per 16) and indexer keys (MXFP4) of each KV
// source, compressor tails (fp32 pending half-group). Csa2Shared: cross-layer CSA2 sharing inside one forward
// call (latest published top-k indices, the candidate pool). AttentionTrace: optional recorder of intermediates
// for layer tests. All in model/csa2.h.

// Consecutive rows of one sequence inside a batched attention call.
struct AttentionSegment {
  SequenceState* state = nullptr;
  Csa2Shared* shared = nullptr;    // reset for [start_pos, start_pos + num_tokens)
  int64_t start_pos = 0;           // absolute position of the segment's first row
  int64_t num_tokens = 0;          // rows
  AttentionTrace* trace = nullptr; // optional recorder of this segment's intermediates
};

// Consecutive rows of one sequence in a DSpark stage's attention call (model/dspark.h): rows at absolute
// positions first_position .. first_position + num_rows - 1.
struct DSparkAttentionSegment {
  SequenceState* state = nullptr;
  int64_t first_position = 0;
  int64_t num_rows = 0;
};

class AttentionLayer {
 public:
  // Finds a tensor by its checkpoint name (nullptr: missing); lets tests bind from a bare SafetensorsFile.
  using TensorLookup = std::function<const TensorView*(const std::string&)>;

  static Result<std::unique_ptr<AttentionLayer>> bind(const Checkpoint& checkpoint, int layer);
  // Every FP8 linear the layer's kernels read, for a load-time rewrite of its bytes (ModelWeights::to_tile_major).
  void for_each_fp8_linear(FunctionRef<void(Fp8Weight&)> fn) {
    for (Fp8Weight* w : {&wq_a_, &wq_b_, &wkv_, &wo_a_, &wo_b_, &index_wq_b_})
      if (w->codes != nullptr) fn(*w);
  }
  // Binds layers.{layer}.attn.* (and for DSpark stages mtp.{layer - n_layers}.attn.*). Errors name the tensor,
  // the expected and found dtype/shape, and `origin`. wo_a stays FP8: the reference's convert.py dequantises it
  // to bf16 (exact), and the backend's fp8_as_bf16_gemm computes that bf16 linear from the codes.
  static Result<std::unique_ptr<AttentionLayer>> bind(const TensorLookup& find, const std::string& origin,
                                                      const ModelConfig& config, int layer);
  ~AttentionLayer();

  // One batched call over the rows of several sequences (spec §4.3-§4.6): x [rows, dim] (bf16 values in fp32)
  // holds the segments' rows back to back, segment i's rows at absolute positions start_pos..start_pos+n-1 of its
  // own sequence. out [rows, dim] (bf16 values). The projections (wq_a, wq_b, wkv, wo_a, wo_b) run once over all
  // rows, so every weight is read once per call; the window ring, the compressor, the indexer and the sparse
  // attention run per segment on its own state. Row r of out equals a call on its segment alone. Updates each
  // segment's state (this layer's window ring; on KV sources the compressed caches and compressor tail) and its
  // Csa2Shared, which must have been reset for the segment (same start_pos and num_tokens).
  // The CED decoder KV source's compressor reads the same x; rows that only feed the global KV (prompt rows before
  // the decoder's tail) go through forward_global_kv() instead.
  //
  // Window layout (it decides the 64-entry blocks of the attention kernel, so it follows model.py exactly):
  //   decode step (start_pos > 0, one token, shared.prefill_end 0): the ring, oldest slot first (model.py decode);
  //   prefill or a chunk of one: query s lists positions (s - W + 1).clamp(0) + [0, min(E, W)), entries > s
  //     are -1, E = max(end_pos, shared.prefill_end) (model.py prefill). A chunk gives what one prefill gives:
  //     for every row when prefill_end is the prompt's end, else for rows s >= W - 1.
  // Rows below shared.window_floor, or not held by the ring, are -1.
  Status forward(const float* x, const AttentionSegment* segments, int64_t num_segments, const ComputeContext& ctx,
                 float* out);
  // One segment (layer tests): forward() over the rows [start_pos, start_pos + num_tokens) of one sequence.
  Status forward(const float* x, int64_t num_tokens, int64_t start_pos, SequenceState& state, Csa2Shared& shared,
                 const ComputeContext& ctx, float* out, AttentionTrace* trace = nullptr) {
    const AttentionSegment segment{&state, &shared, start_pos, num_tokens, trace};
    return forward(x, &segment, 1, ctx, out);
  }

  // CED global-KV path (spec/MODEL.md §5): on a KV source, only the compressor, the indexer keys and the
  // compressed-KV store for positions [start_pos, start_pos + num_tokens) -- no query, no window ring write, no
  // attention. For prompt rows whose output is not needed (the decoder runs on the tail only); a later forward()
  // from start_pos + num_tokens continues the same caches. Error on layers that are not KV sources.
  Status forward_global_kv(const float* x, int64_t num_tokens, int64_t start_pos, SequenceState& state,
                           const ComputeContext& ctx, AttentionTrace* trace = nullptr);

  // DSpark stages (layers >= n_layers, compress ratio 0; spec §4.10, model.py DSparkAttention), in
  // attention_dspark.cpp. Context: main_x [rows, dim] (bf16 values; the stages' projection of the main model's
  // hidden states) -> FP8(rope(kv_norm(wkv(main_x)))) written into this layer's window ring of each segment at the
  // segment's positions. Only these rows ever enter a DSpark ring.
  Status dspark_write_context(const float* main_x, const DSparkAttentionSegment* segments, int64_t num_segments,
                              const ComputeContext& ctx) const;
  // Draft block: x [rows, dim] (bf16 values), each segment's rows the block at positions e .. e + n - 1
  // (e = first_position). Every query of a block attends, non-causally, to the ring rows of positions
  // [e - window, e - 1] listed in slot order 0 .. min(window, e) - 1 (a slot holding another position is -1),
  // then the block's own rows (FP8 like the ring, never stored). out [rows, dim] bf16 values. Reads the rings only.
  Status dspark_attend_block(const float* x, const DSparkAttentionSegment* segments, int64_t num_segments,
                             const ComputeContext& ctx, float* out) const;

  int layer() const { return layer_; }
  bool kv_source() const { return kv_source_; }

 private:
  AttentionLayer() = default;
  // A segment's rows of the projections forward() runs once over all rows of the call (every weight read once per
  // call, whatever the number of sequences).
  struct SegmentRows {
    const float* q = nullptr;            // [rows, heads, head_dim]
    const float* kv = nullptr;           // [rows, head_dim] dequantised window rows
    const uint8_t* kv_codes = nullptr;   // [rows, head_dim] e4m3
    const uint8_t* kv_scales = nullptr;  // [rows, head_dim / 32] ue8m0
    // KV sources: the compressor projections (project_compressor) of the segment's last `compressor_rows` rows; the
    // rows before them already have their entries (a replayed cached prefix).
    const float* compressor_kv = nullptr;
    const float* compressor_score = nullptr;
    int64_t compressor_rows = 0;
    // Index sources: the indexer's queries and head weights (project_index_queries).
    const float* index_q = nullptr;
    const float* index_weights = nullptr;
  };
  // KV sources: how many of the rows [start_pos, start_pos + num_tokens) already have their compressed entries
  // (a cached prefix being replayed for its windows, spec §7: never compressed again). Error when the state holds
  // fewer entries than start_pos covers.
  Result<int64_t> stored_rows(const SequenceState& state, int64_t start_pos, int64_t num_tokens) const;
  // The compressor's projections of x [rows, dim] (spec §4.4): kv = wkv(x) [rows, head_dim] (bf16-rounded at
  // ratio 1, fp32 above it), score = wgate(x) [rows, head_dim] fp32 (ratio > 1 only).
  void project_compressor(const float* x, int64_t rows, const ComputeContext& ctx, float* kv, float* score) const;
  // The compressor and entry store of a KV source for rows [start_pos, + num_tokens), from their projections.
  Status compress_rows(const float* kv, const float* score, int64_t num_tokens, int64_t start_pos,
                       SequenceState& state, const ComputeContext& ctx, AttentionTrace* trace);
  Status run_compressor(const float* kv, const float* score, int64_t num_tokens, int64_t start_pos,
                        SequenceState& state, const ComputeContext& ctx, std::span<float>* latents,
                        std::span<int64_t>* groups);
  Status store_entries(std::span<const float> latents, std::span<const int64_t> groups, SequenceState& state,
                       const ComputeContext& ctx);
  // Index sources (spec §4.5): q_I = MXFP4(rope(wq_b(qr))) [rows, index_heads, index_head_dim] at the rows' RoPE
  // angles (cos/sin [rows, rope_dim / 2]) and w = bf16(bf16(weights_proj(x)) * id^-0.5 * ih^-0.5) [rows, index_heads].
  void project_index_queries(const float* x, const float* qr, int64_t rows, const float* cos, const float* sin,
                             const ComputeContext& ctx, float* index_q, float* index_weights) const;
  // The compressed branch of one segment (spec §4.4-§4.5): compressor and entry store on KV sources, the
  // indexer's top-k on index sources (published in the segment's Csa2Shared), else the published top-k.
  struct CompressedBranch {
    const CompressedKv* kv = nullptr;  // the KV source's entries (null: a window-only layer)
    int64_t topk_width = 0;            // entries listed per query from the top-k
  };
  Status compressed_branch(const AttentionSegment& segment, const SegmentRows& rows, const ComputeContext& ctx,
                           CompressedBranch* out);
  // Then its window rows (the ring written with the segment's rows) and sparse attention over
  // [window entries ; top-k entries] -> o [rows, heads, dim]; buffers from `frame`.
  void attend_segment(const AttentionSegment& segment, const SegmentRows& rows, const CompressedBranch& branch,
                      Arena& frame, const ComputeContext& ctx, float* o);
  // The output of heads o [rows, heads, head_dim] (rotated at the query positions: cos/sin [rows, rope_dim/2])
  // -> out [rows, dim]: inverse RoPE, grouped wo_a (bf16), wo_b (FP8). o is rotated back in place.
  void project_output(float* o, int64_t rows, const float* cos, const float* sin, const ComputeContext& ctx,
                      float* out) const;
  // The indexer's scores and top-k of a segment's rows from their queries and head weights.
  Status run_indexer(const float* index_q, const float* index_weights, int64_t num_tokens, int64_t start_pos,
                     const SequenceState& state, Csa2Shared& shared, const ComputeContext& ctx,
                     AttentionTrace* trace);

  static constexpr int64_t kQueryTile = 32;  // queries per tile (bounds the per-call buffers on long prefills)

  int layer_ = 0;
  // shape
  int64_t dim_ = 0, head_dim_ = 0, rope_dim_ = 0, q_lora_ = 0, o_lora_ = 0;
  int heads_ = 0, groups_ = 0, window_ = 0, ratio_ = 0;
  int index_heads_ = 0, index_topk_ = 0, candidate_blocks_ = 0, candidate_block_size_ = 0;
  int64_t index_head_dim_ = 0;
  float eps_ = 1e-20f;
  // CSA2 role (spec §4.5 table): model.py's "latest source in layer order".
  bool kv_source_ = false, index_source_ = false, candidate_source_ = false, candidate_restricted_ = false;
  int kv_source_layer_ = -1, index_source_layer_ = -1;
  Rope rope_;
  // weights (views into the checkpoint, except the copied sink)
  Fp8Weight wq_a_, wq_b_, wkv_, wo_b_;
  Fp8Weight wo_a_;  // [groups * o_lora, heads * head_dim / groups] FP8, run as bf16 (fp8_as_bf16_gemm)
  const uint16_t* q_norm_ = nullptr;   // [q_lora] bf16
  const uint16_t* kv_norm_ = nullptr;  // [head_dim] bf16
  std::vector<float> sink_;            // [heads] fp32
  // compressor (KV sources): wkv [head_dim, dim] bf16 (used in fp32 at ratio > 1), wgate (ratio > 1), norm
  Bf16Weight compressor_wkv_, compressor_wgate_;
  const uint16_t* compressor_norm_ = nullptr;
  // indexer: queries on index sources, keys on KV sources
  Fp8Weight index_wq_b_;               // [index_heads * index_head_dim, q_lora]
  Bf16Weight index_weights_proj_;      // [index_heads, dim]
  Bf16Weight index_wk_;                // [index_head_dim, head_dim] (KV sources)
  const uint16_t* index_k_norm_ = nullptr;
};

}  // namespace dsflash
