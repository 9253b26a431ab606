// Forward plans over the backbone (spec/MODEL.md §5, §7; DESIGN.md "The data path"), owned by the engine
// engineer; the layer computations are the model's (Transformer, AttentionLayer, MoeLayer, Engram).
//
//   kExact          the official full forward: every layer on every prompt token (Transformer::forward).
//                   Option: the CED decoder's window truncated at the replay start (the like-for-like reference
//                   of bounded replay; off = the official behaviour).
//   kBoundedReplay  CED prefill (Decoder SWA Bounded Replay): the encoder (layers < d = ced_decoder_start())
//                   and layer d's global-KV path (hc_pre, attn_norm, compressor + indexer keys) on every prompt
//                   token; the decoder (layers >= d) only on the last `replay` prompt tokens (default: the window),
//                   its window truncated at their start R = N - replay. The top-k of the tail queries still scans
//                   the whole global KV. Approximate by design (the report's production prefill).
//
// A prompt of N tokens may be fed in chunks of any size; each chunk must know N (the replay start depends on
// it). Chunked gives what one chunk gives. Decode steps of several sequences run as one batch: every layer's
// mHC, norms, MoE and head take rows = batch; attention runs per sequence on its own state.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "model/compute_context.h"
#include "model/model_weights.h"
#include "model/sequence.h"
#include "model/transformer.h"

namespace dsflash {

enum class PrefillMode {
  kExact,
  kBoundedReplay,
};

const char* prefill_mode_name(PrefillMode mode);  // "exact", "bounded-replay"

struct PrefillOptions {
  PrefillMode mode = PrefillMode::kBoundedReplay;
  // Decoder tail length (bounded replay) and truncation length (exact + truncate). 0 = the config's window.
  int64_t replay_tokens = 0;
  // kExact only: floor the CED decoder's window at R = N - replay_tokens (bounded replay's truncation).
  bool truncate_decoder_window = false;
};

// The replay start R of a prompt of `prompt_length` tokens (0 when the prompt fits in the tail; also 0 for
// kExact without truncation, meaning "no floor").
int64_t replay_start(const ModelConfig& config, const PrefillOptions& options, int64_t prompt_length);

// Logits rows a prefill chunk produced: [rows, vocab] and the absolute position of each row.
struct ChunkLogits {
  std::vector<float> logits;
  std::vector<int64_t> positions;
};

class ForwardPlan {
 public:
  explicit ForwardPlan(const ModelWeights& weights) : weights_(weights) {}

  // Prefill tokens [seq.num_positions(), + num_tokens) of a prompt of `prompt_length` tokens. rows: kLast = the
  // last prompt position when this chunk holds it; kAll = every position of the chunk the decoder computed (all
  // of them in kExact, the tail in kBoundedReplay); kNone = none. Errors leave `seq` unusable only when the
  // model's layers fail mid-call (bad inputs are rejected before any change).
  Status prefill(const int32_t* tokens, int64_t num_tokens, int64_t prompt_length, SequenceState& seq,
                 const ComputeContext& ctx, const PrefillOptions& options, LogitsRows rows,
                 ChunkLogits* logits) const;

  // One decode step for each of `seqs.size()` sequences (each prefilled: position > 0): tokens[b] at position
  // seqs[b]->num_positions(). Every weight is read once for the whole batch (AttentionLayer::forward_decode_batch).
  // window_floors[b]: the window floor of sequence b (its replay start; 0 = none), may be empty (all 0).
  // logits: [batch, vocab].
  Status decode(const std::vector<int32_t>& tokens, const std::vector<SequenceState*>& seqs,
                const std::vector<int64_t>& window_floors, const ComputeContext& ctx,
                std::vector<float>* logits) const;

  const ModelWeights& weights() const { return weights_; }

 private:
  const ModelWeights& weights_;
};

}  // namespace dsflash
