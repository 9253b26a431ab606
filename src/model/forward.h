// The model's one forward (spec/MODEL.md §4.1, §4.2, §5; model.py Transformer.forward and Block.forward) over a
// batch of ragged rows: embed -> hc streams -> per layer [Engram] + Block (Single-Pass mHC: the attention
// collapses with the previous site's pre, the FFN with the attention site's pre) -> collapse with the last FFN's
// pre -> final RMSNorm -> head in fp32, for the rows that ask for logits.
//
// A batch is a list of segments, each a run of consecutive rows of one sequence continuing it at
// seq.num_positions(). Per segment:
//   global_only  leading rows that need only the CED global-KV path (the encoder, then layer d =
//                ced_decoder_start()'s hc_pre, attn_norm, compressor and indexer keys; spec §5): they are dropped
//                from the streams at layer d, so the decoder runs only on the remaining rows;
//   window_floor the decoder layers' window floor (Decoder SWA Bounded Replay: queries see window rows only at
//                positions >= floor; 0 = the official behaviour); the encoder layers never floor;
//   logits       which of the rows the decoder computed get a logits row (none, the last, all).
// Every plan (the official full forward, CED prefill with bounded replay, chunked prefill, batched decode, mixed
// prefill + decode steps) is a way of filling a ForwardBatch (engine/batch_builder.h); nothing else runs layers.
// Attention batches its projections over all rows and runs window, compressor, indexer and sparse attention per
// segment (AttentionLayer::forward). The caller reserves each sequence's KV capacity before the call
// (kv::KvCacheManager::reserve); bad inputs are rejected before any state changes, and an error from a
// layer leaves the batch's sequences unusable.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "model/compute_context.h"
#include "model/csa2.h"
#include "model/model_weights.h"
#include "model/moe.h"

namespace dsflash {

// Which of a segment's decoder rows get logits rows.
enum class LogitsRows {
  kNone,  // only advance the state
  kLast,  // the segment's last row (generation)
  kAll,   // every row the decoder computed (--exact, golden comparisons)
};

struct RowOptions {
  int64_t global_only = 0;   // leading rows on the CED global-KV path only, in [0, num_tokens]
  int64_t window_floor = 0;  // decoder window floor (0 = none)
  LogitsRows logits = LogitsRows::kNone;
  // DSpark (spec §4.10, model/dspark.h): hand out the hidden states at the DSpark target layers of the segment's
  // rows past global_only (ForwardOutput::dspark_hidden). Error when the model has no DSpark targets.
  bool dspark_hidden = false;
};

struct ForwardSegment {
  SequenceState* seq = nullptr;
  int64_t first_row = 0;   // index of its first row in ForwardBatch::tokens()
  int64_t num_tokens = 0;  // rows, at positions seq->num_positions() + [0, num_tokens)
  RowOptions options;
};

class ForwardBatch {
 public:
  // Appends `num_tokens` rows of `seq` continuing it; one segment per sequence and call.
  void add(SequenceState& seq, const int32_t* tokens, int64_t num_tokens, const RowOptions& options);
  void clear();

  const std::vector<int32_t>& tokens() const { return tokens_; }
  const std::vector<ForwardSegment>& segments() const { return segments_; }
  int64_t num_rows() const { return static_cast<int64_t>(tokens_.size()); }
  bool empty() const { return segments_.empty(); }

 private:
  std::vector<int32_t> tokens_;  // [rows] token ids, segment after segment
  std::vector<ForwardSegment> segments_;
};

// Logits of a call: [rows, vocab] fp32 and, per row, its segment and absolute position (segment order).
struct ForwardOutput {
  struct Row {
    int64_t segment = 0;
    int64_t position = 0;
  };
  std::vector<float> logits;
  std::vector<Row> rows;
  // Only for segments with RowOptions::dspark_hidden, their rows past global_only in segment order:
  // [dspark_rows, n_targets * dim] bf16 values, per target layer (ascending layer order) the mean over the hc
  // streams of that layer's input (after its Engram; model.py main_hidden), and each row's segment and position.
  std::vector<float> dspark_hidden;
  std::vector<Row> dspark_rows;
};

// Optional record of a call's intermediates, named as the goldens name them (prefill.layers.L.*); only for a
// batch of one segment without global-only rows. All float arrays hold bf16 values except pre_mix (fp32).
struct ForwardTrace {
  struct Layer {
    std::vector<float> attn_in, attn_out, ffn_in, ffn_out;  // [tokens, dim]
    std::vector<float> out;                                  // [tokens, hc, dim]
    std::vector<float> pre_mix;                              // [tokens, hc]
    MoeRouting routing;
    AttentionTrace attention;
  };
  std::vector<Layer> layers;
  std::vector<float> final_hc, final_norm;  // [logits rows, dim]
};

// The layer loop. Errors before any change: an empty batch or segment, an id outside [0, vocab), a context beyond
// max_position_embeddings, a sequence twice, a bad global_only, a trace with a batch it cannot record.
Status forward(const ModelWeights& weights, const ForwardBatch& batch, const ComputeContext& ctx, ForwardOutput* out,
               ForwardTrace* trace = nullptr);

}  // namespace dsflash
