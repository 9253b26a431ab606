#include "engine/speculative.h"

#include <algorithm>

namespace dsflash::engine {

DraftPolicy::DraftPolicy(const DraftPolicyOptions& options) : options_(options), current_(options.max_draft) {}

int DraftPolicy::draft_length(const float* confidence, int block) {
  if (off_left_ > 0) {
    --off_left_;
    return 0;
  }
  int n = std::min(current_, block);
  if (!options_.adaptive || n <= 0) return std::max(n, 0);
  for (int i = 0; i < n; ++i) {
    if (confidence != nullptr && confidence[i] < options_.min_confidence) {
      n = i;
      break;
    }
  }
  // A block the confidence head cuts to nothing was drafted for nothing: it counts as a miss, or a drafter that
  // is never confident would draft every step without ever being switched off.
  if (n == 0 && ++misses_ >= options_.max_misses) switch_off();
  return n;
}

void DraftPolicy::switch_off() {
  // Speculation does not pay here: plain steps, then a re-probe at k = 1; each failed re-probe doubles the gap.
  off_gap_ = off_gap_ == 0 ? options_.off_steps : std::min(2 * off_gap_, options_.max_off_steps);
  off_left_ = off_gap_;
  current_ = 1;
  measured_ = 0;
  misses_ = 0;
  drafted_ = accepted_ = 0;
}

void DraftPolicy::record(int drafted, int accepted) {
  if (drafted == 0 || options_.max_draft == 0 || !options_.adaptive) return;
  current_ = accepted == drafted ? std::min(current_ + 1, options_.max_draft) : std::max(1, accepted + 1);
  drafted_ += drafted;
  accepted_ += accepted;
  misses_ = accepted == 0 ? misses_ + 1 : 0;
  const bool missing = misses_ >= options_.max_misses;
  if (++measured_ < options_.probe_steps && !missing) return;
  if (missing || static_cast<double>(accepted_) < options_.min_accept_rate * static_cast<double>(drafted_)) {
    switch_off();
    return;
  }
  off_gap_ = 0;
  measured_ = 0;
  misses_ = 0;
  drafted_ = accepted_ = 0;
}

void Speculation::take_drafts(const int32_t* ids, const float* confidence_logits, int block) {
  drafts.assign(ids, ids + block);
  confidence.assign(confidence_logits, confidence_logits + block);
}

int Speculation::plan(int64_t tokens_left, int64_t max_rows) {
  const int block = static_cast<int>(drafts.size());
  int k = policy.draft_length(block > 0 ? confidence.data() : nullptr, block);
  k = static_cast<int>(std::min<int64_t>({k, tokens_left - 1, max_rows - 1}));
  return std::max(k, 0);
}

}  // namespace dsflash::engine
