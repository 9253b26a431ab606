#include "model/csa2.h"

namespace dsflash {

void Csa2Shared::reset(int64_t start, int64_t tokens, int64_t floor) {
  start_pos = start;
  num_tokens = tokens;
  window_floor = floor;
  prefill_end = 0;
  topk_layer = -1;
  topk_width = 0;
  topk.clear();
  candidate_layer = -1;
  candidate_width = 0;
  candidates.clear();
}

void AttentionTrace::clear() { *this = AttentionTrace(); }

}  // namespace dsflash
