// The backbone forward pass (spec/MODEL.md §4.1, §4.2; model.py Transformer.forward and Block.forward):
// embed -> hc streams -> per layer [Engram] + Block (Single-Pass mHC: the attention collapses with the
// previous site's pre, the FFN with the attention site's pre) -> collapse with the last FFN's pre ->
// final RMSNorm -> head in fp32. State between calls lives in SequenceState.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "model/attention_state.h"
#include "model/compute_context.h"
#include "model/model_weights.h"
#include "model/moe.h"
#include "model/sequence.h"

namespace dsflash {

// Which positions of a call get logits rows.
enum class LogitsRows {
  kNone,  // only advance the state
  kLast,  // the last position of the call (generation)
  kAll,   // every position of the call (--exact, golden comparisons)
};

// Optional record of a call's intermediates, named as the goldens name them (prefill.layers.L.*).
// All float arrays hold bf16 values except pre_mix (fp32).
struct ForwardTrace {
  struct Layer {
    std::vector<float> attn_in, attn_out, ffn_in, ffn_out;  // [tokens, dim]
    std::vector<float> out;                                  // [tokens, hc, dim]
    std::vector<float> pre_mix;                              // [tokens, hc]
    MoeRouting routing;
    AttentionTrace attention;
  };
  std::vector<Layer> layers;
  std::vector<float> final_hc, final_norm;  // [tokens, dim]
};

class Transformer {
 public:
  explicit Transformer(const ModelWeights& weights) : weights_(weights) {}

  // tokens [num_tokens] at positions seq.num_positions() ... Errors (state unchanged): empty call, an id
  // outside [0, vocab), or a context beyond max_position_embeddings. logits: [rows, vocab] fp32 where rows is
  // 0, 1 or num_tokens by `rows`.
  Status forward(const int32_t* tokens, int64_t num_tokens, SequenceState& seq, const ComputeContext& ctx,
                 LogitsRows rows, std::vector<float>* logits, ForwardTrace* trace = nullptr) const;

  const ModelWeights& weights() const { return weights_; }

 private:
  const ModelWeights& weights_;
};

}  // namespace dsflash
