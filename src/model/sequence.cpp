#include "model/sequence.h"

namespace dsflash {

Result<SequenceState> SequenceState::create(const ModelConfig& config) {
  auto attention = AttentionState::create(config);
  if (!attention.ok()) return attention.status();
  return SequenceState(std::move(*attention));
}

void SequenceState::clear() {
  attention_.clear();
  engram_.reset();
  num_positions_ = 0;
}

size_t SequenceState::bytes() const { return attention_.bytes() + engram_.recent.size() * sizeof(int64_t); }

}  // namespace dsflash
