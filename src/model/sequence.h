// Per-sequence state carried between forward calls (storage only): the attention state of every layer
// (window rings, compressed KV, compressor tails), the Engram n-gram history, and the number of positions
// processed. A prefill of many tokens, later chunks, and token-by-token decode all continue from it.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "io/model_config.h"
#include "model/attention_state.h"
#include "model/engram_hash.h"

namespace dsflash {

class SequenceState {
 public:
  static Result<SequenceState> create(const ModelConfig& config);

  int64_t num_positions() const { return num_positions_; }
  AttentionState& attention() { return attention_; }
  const AttentionState& attention() const { return attention_; }
  EngramHistory& engram() { return engram_; }
  const EngramHistory& engram() const { return engram_; }

  // Called by the transformer after a forward over `num_tokens` new positions.
  void advance(int64_t num_tokens) { num_positions_ += num_tokens; }
  // A new, empty sequence.
  void clear();
  // Bytes of state held (attention state + Engram history).
  size_t bytes() const;

 private:
  explicit SequenceState(AttentionState attention) : attention_(std::move(attention)) {}

  AttentionState attention_;
  EngramHistory engram_;
  int64_t num_positions_ = 0;
};

}  // namespace dsflash
