// DSpark draft stages (spec/MODEL.md §4.10; model.py DSparkBlock, DSparkAttention, DSparkMarkovHead,
// DSparkConfidenceHead and Transformer.forward_spec), computed as the official code computes them.
//
// Inputs, per sequence: the main model's hidden states at the DSpark target layers (spec §4.1: the mean over the hc
// streams of the input of each target layer, concatenated in layer order; ForwardOutput::dspark_hidden of the
// forward with RowOptions::dspark_hidden), one row per position the main model has processed.
//
//   main_x   = main_norm(main_proj(main_hidden))                 [rows, dim] bf16; main_proj FP8 (mtp.0)
//   context  : every stage s writes FP8(rope(kv_norm(wkv_s(main_x)))) of each row into its own window ring
//              (SequenceState::window(n_layers + s)); nothing else ever enters these rings.
//   block    : ids [next_token, noise x (B-1)] at positions e .. e+B-1 (e = one past the last context row,
//              B = dspark_block_size, noise = dspark_noise_token_id), embedded and expanded to hc streams (one-hot
//              pre), then the stages run as Blocks (mHC, attention, MoE with the DSpark expert counts); the
//              attention of a stage sees its ring rows [e - W, e - 1] plus the whole block, non-causally.
//   head     : x = hc_pre(streams, last stage's pre) (bf16); logits = head(norm(x)) in fp32 (the main head,
//              mtp.{last}.norm); for i = 0..B-1: bias_i = markov_head(embed_m[ids_i]) (rank-r embedding, fp32 head)
//              added to logits_i, ids_{i+1} = sample(logits_i) (greedy unless a sampler is given);
//              confidence_i = proj · [x_i ; embed_m[ids_i]] in fp32.
//
// Intended use by the speculative loop (later): after a forward that processed positions [p, p + n) of a sequence
// with RowOptions::dspark_hidden (a prefill, a decode step, or a verification forward of 1 + k tokens of which a
// were accepted), call DSpark::forward with a DSparkSegment of the hidden rows that are now part of the sequence
// (for a verification: the first 1 + a rows) and draft = true with next_token = the token sampled after them. The
// drafted ids output_ids[1..k] (k <= B, e.g. cut where the confidence drops) are the tokens of the next
// verification forward: [next_token, drafts...] at positions e .. e + k. Only accepted rows are ever appended, so
// the DSpark rings need no rollback; the main model's own rollback of rejected rows is the loop's business.
// model.py's decode step (forward(token at p) then forward_spec(sampled, main_hidden, p)) is the case n = 1; its
// prefill call (forward_spec at start_pos 0, which only seeds the rings) is a segment with draft = false.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/status.h"
#include "io/checkpoint.h"
#include "kernels/linear.h"
#include "model/csa2.h"
#include "model/compute_context.h"
#include "model/model_weights.h"

namespace dsflash {

// One sequence's part of a DSpark call.
struct DSparkSegment {
  SequenceState* state = nullptr;    // the sequence (kv::SequenceKv): its DSpark window rings are written
  const float* main_hidden = nullptr;  // [num_context, n_targets * dim] bf16 values (ForwardOutput::dspark_hidden)
  int64_t first_position = 0;        // absolute position of main_hidden's first row
  int64_t num_context = 0;           // rows appended to the rings, >= 0
  bool draft = false;                // draft a block after appending
  int32_t next_token = 0;            // draft: the token at position first_position + num_context
};

// Drafts of one call, in the order of the segments that asked for one.
struct DSparkOutput {
  struct Draft {
    int64_t segment = 0;         // index in the call's segments
    int64_t first_position = 0;  // position of output_ids[0] (= next_token); draft i is at first_position + 1 + i
  };
  int block = 0;                    // B
  std::vector<Draft> drafts;
  std::vector<int32_t> output_ids;  // [drafts, B + 1]: next_token, then the B drafted ids
  std::vector<float> logits;        // [drafts, B, vocab] fp32, Markov bias added (row i predicts output_ids[i+1])
  std::vector<float> confidence;    // [drafts, B] fp32
};

// Picks draft i+1 from the biased logits [vocab] of block position i of draft `draft` (index in
// DSparkOutput::drafts). Absent: argmax, the lowest index among equal maxima (model.py sample at temperature 0).
using DraftSampler = std::function<int32_t(const float* logits, int64_t vocab, int64_t draft, int position)>;

class DSpark {
 public:
  // Binds mtp.0 .. mtp.{n-1} (blocks as layers n_layers + s, main_proj / main_norm on stage 0, norm, markov head and
  // confidence head on the last). `main` provides the shared embedding and head and must outlive this object.
  // Error when the config has no DSpark (dspark_block_size 0) or a tensor is missing or malformed.
  static Result<std::unique_ptr<DSpark>> bind(const Checkpoint& checkpoint, const ModelWeights& main);

  // Appends each segment's context rows to its rings, then drafts a block for the segments that ask. The
  // projections run once over all rows of the call (context rows, then block rows). Errors in the segments (bad
  // arguments, a token outside the vocabulary, a draft at position 0, a state without DSpark rings, a sequence
  // twice) are reported before any state changes; a sampler returning an id outside the vocabulary fails the call
  // after the context rows were appended.
  Status forward(const DSparkSegment* segments, int64_t num_segments, const ComputeContext& ctx, DSparkOutput* out,
                 const DraftSampler& sampler = {}) const;

  // The pieces, for tests and tools.
  // main_x [rows, dim] = main_norm(main_proj(main_hidden [rows, n_targets * dim])), bf16 values.
  void project_main_hidden(const float* main_hidden, int64_t rows, const ComputeContext& ctx, float* main_x) const;
  // Markov head of `rows` tokens: embed [rows, rank] (bf16 values) and bias [rows, vocab] = embed · headᵀ (fp32).
  void markov_bias(const int32_t* tokens, int64_t rows, const ComputeContext& ctx, float* embed, float* bias) const;
  // Confidence head: out [rows] = proj · [hidden ; markov_embed] in fp32; hidden [rows, dim] (the pre-norm
  // collapse x), markov_embed [rows, rank], bf16 values.
  void confidence(const float* hidden, const float* markov_embed, int64_t rows, const ComputeContext& ctx,
                  float* out) const;

  // The stages' FP8 / MXFP4 linears and main_proj copied into tile-major order (copy_to_tile_major), for kernel
  // tables that prefer it, as ModelWeights::to_tile_major does for the main layers. Returns how many.
  Result<int64_t> to_tile_major(const Checkpoint& checkpoint, TileMajorFormats formats, ThreadPool* pool);
  const HugePageBuffer& tile_major_weights() const { return tile_major_weights_; }

  int block_size() const { return block_; }
  int num_stages() const { return static_cast<int>(stages_.size()); }
  int first_layer() const { return first_layer_; }       // layer index of stage 0 (= n_layers)
  int64_t hidden_width() const { return hidden_width_; }  // n_targets * dim
  int64_t markov_rank() const { return rank_; }

 private:
  DSpark() = default;
  Status check(const DSparkSegment* segments, int64_t num_segments) const;

  const ModelWeights* main_ = nullptr;
  int first_layer_ = 0;
  int block_ = 0;
  int32_t noise_token_ = 0;
  int64_t dim_ = 0, vocab_ = 0, rank_ = 0, hidden_width_ = 0;
  std::vector<BlockWeights> stages_;
  Fp8Weight main_proj_;                      // [dim, n_targets * dim] (mtp.0)
  const uint16_t* main_norm_ = nullptr;      // [dim] bf16 (mtp.0)
  const uint16_t* norm_ = nullptr;           // [dim] bf16 (last stage)
  Bf16Weight markov_embed_{};                // [vocab, rank] bf16
  Bf16Weight markov_head_{};                 // [vocab, rank] bf16 used in fp32
  Bf16Weight confidence_proj_{};             // [1, dim + rank] bf16 used in fp32
  HugePageBuffer tile_major_weights_;        // the stages' tile-major copies (empty when none)
};

}  // namespace dsflash
