#include "model/csa2.h"

namespace dsflash {

void Csa2Shared::reset(int64_t start, int64_t tokens, int64_t floor) {
  start_pos = start;
  num_tokens = tokens;
  window_floor = floor;
  prefill_end = 0;
  topk_layer = -1;
  topk_width = 0;
  topk = {};
  candidate_layer = -1;
  candidate_width = 0;
  candidates = {};
}

std::span<int32_t> Csa2Shared::new_topk(size_t n) {
  if (publish_arena != nullptr) return publish_arena->take<int32_t>(n);
  topk_storage.resize(n);
  return topk_storage;
}

std::span<uint8_t> Csa2Shared::new_candidates(size_t n) {
  if (publish_arena != nullptr) return publish_arena->take<uint8_t>(n);
  candidates_storage.resize(n);
  return candidates_storage;
}

void AttentionTrace::clear() { *this = AttentionTrace(); }

}  // namespace dsflash
