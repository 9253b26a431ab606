// Batch builders: every plan of the model is a way of filling one ForwardBatch (model/forward.h) for the one
// forward (spec/MODEL.md §5, §7; DESIGN.md "The data path").
//
//   kExact          the official full forward: every layer on every prompt token. Option: the CED decoder's
//                   window truncated at the replay start (the like-for-like reference of bounded replay; off =
//                   the official behaviour).
//   kBoundedReplay  CED prefill (Decoder SWA Bounded Replay): the encoder (layers < d = ced_decoder_start())
//                   and layer d's global-KV path on every prompt token; the decoder (layers >= d) only on the
//                   last `replay` prompt tokens (default: the window), its window floored at their start
//                   R = N - replay. The top-k of the tail queries still scans the whole global KV. Approximate by
//                   design (the report's production prefill).
//
// A prompt of N tokens may be fed in chunks of any size; each chunk must know N (the replay start depends on
// it). Decode rows of many sequences and prefill chunks of others may share one batch (a mixed step).
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "io/model_config.h"
#include "model/forward.h"

namespace dsflash::engine {

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
// kExact without truncation, meaning "no floor"). It is also the decoder window floor of the decode steps.
int64_t replay_start(const ModelConfig& config, const PrefillOptions& options, int64_t prompt_length);

// The prefill chunk [seq.num_positions(), + num_tokens) of a prompt of `prompt_length` tokens. rows: kLast = the
// last prompt position when this chunk holds it; kAll = every row the decoder computes (all of them in kExact,
// the tail in kBoundedReplay); kNone = none. dspark_hidden: the decoder rows' DSpark hidden states (speculative
// decoding feeds them to the drafter). Error (batch unchanged) when the chunk runs past the prompt or the options
// are invalid.
Status add_prefill_chunk(ForwardBatch& batch, const ModelConfig& config, SequenceState& seq, const int32_t* tokens,
                         int64_t num_tokens, int64_t prompt_length, const PrefillOptions& options, LogitsRows rows,
                         bool dspark_hidden = false);

// Decode rows: `num_tokens` tokens at seq.num_positions() + [0, num_tokens) (1: a plain decode step; 1 + k: the
// next input and k drafted ids of a speculative verification), their decoder window floored at `window_floor`
// (the replay start of its prompt; 0 = none), logits for every row; dspark_hidden as above.
void add_decode_rows(ForwardBatch& batch, SequenceState& seq, const int32_t* tokens, int64_t num_tokens,
                     int64_t window_floor, bool dspark_hidden = false);

// The official forward over `num_tokens` tokens continuing `seq` (every layer on every row; a single token after
// position 0 is a decode step in model.py's ring layout).
void add_exact(ForwardBatch& batch, SequenceState& seq, const int32_t* tokens, int64_t num_tokens, LogitsRows rows);

// Makes room in every segment's KV pages for its rows, before the forward (which never allocates). Error (and
// the sequences that could not grow unchanged) when the KV budget refuses.
Status reserve_kv(const ForwardBatch& batch);

// Reserves, then runs the forward.
Status run_batch(const ModelWeights& weights, const ForwardBatch& batch, const ComputeContext& ctx,
                 ForwardOutput* out);

}  // namespace dsflash::engine
