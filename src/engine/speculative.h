// Speculative decoding with the model's own DSpark draft stages (spec/MODEL.md §4.10; model/dspark.h "intended
// use"), as the scheduler runs it (engine/scheduler.h): per step, a speculating sequence's next input and its k
// drafted ids are k + 1 rows of the step's one mixed forward (logits for every row, DSpark hidden rows); each row
// is verified in order by the request's sampler (Sampler::verify: lossless for greedy, standard speculative
// sampling otherwise) until one is not the draft; the accepted prefix is kept and the rest rolled back exactly
// (kv/sequence_snapshot.h); the DSpark rings receive only accepted rows; then one DSpark call drafts the next
// blocks of every speculating sequence.
//
//   DraftPolicy   per sequence: the draft length follows the measured acceptance and the confidence head; when
//                 drafts rarely match it turns speculation off, with periodic re-probes spaced further apart
//                 each time one fails (so a model whose drafts never match pays a vanishing share of steps).
//   Speculation   one sequence's drafts, their draft distributions, the rollback snapshot and the counts.
#pragma once

#include <cstdint>
#include <vector>

#include "kv/sequence_snapshot.h"

namespace dsflash::engine {

struct DraftPolicyOptions {
  int max_draft = 0;              // most drafted tokens per step (--speculative N; also capped by the block size)
  bool adaptive = true;           // false: always verify max_draft drafts (no confidence cut, never off)
  float min_confidence = -4.0f;   // confidence-head logit below which drafting stops (sigmoid ~ 0.018)
  int probe_steps = 8;            // verifications measured before deciding whether speculation pays
  double min_accept_rate = 0.25;  // accepted / drafted below which it turns off
  int max_misses = 3;             // verifications in a row without an accepted draft (or blocks the confidence
                                  // head cuts to nothing) that turn it off at once
  int off_steps = 64;             // plain decode steps after the first failed probe
  int max_off_steps = 4096;       // the gap doubles after every further failed probe, up to this
};

// Per-sequence draft-length controller.
class DraftPolicy {
 public:
  explicit DraftPolicy(const DraftPolicyOptions& options);
  // How many of the block's drafts to verify this step (0 = plain decode). confidence [block] fp32 logits (null:
  // none). Counts a plain step while off.
  int draft_length(const float* confidence, int block);
  // After a step that verified `drafted` drafts of which `accepted` were kept (drafted 0: a plain step).
  void record(int drafted, int accepted);
  // Whether the next step may verify drafts (so the drafter should draft after this step).
  bool active() const { return off_left_ == 0; }
  // Whether the drafter needs this step's hidden rows: always while active; while off only in the last `window`
  // plain steps before the re-probe (its rings hold one window, so earlier rows would be overwritten unused).
  bool needs_context(int64_t window) const { return off_left_ <= window; }

 private:
  void switch_off();

  DraftPolicyOptions options_;
  int current_ = 0;        // draft length now
  int measured_ = 0;       // verifications in the probe window
  int64_t drafted_ = 0, accepted_ = 0;
  int off_left_ = 0;       // plain steps left before a re-probe
  int misses_ = 0;         // verifications in a row without an accepted draft
  int off_gap_ = 0;        // the gap of the last turn-off (0: speculation has paid so far)
};

struct SpeculativeStats {
  int64_t decode_steps = 0;     // steps after the prefill that emitted tokens (verifications and plain steps)
  int64_t draft_tokens = 0;     // drafts verified
  int64_t accepted_tokens = 0;  // drafts accepted
};

// One speculating sequence.
struct Speculation {
  explicit Speculation(const DraftPolicyOptions& options) : policy(options) {}

  // Takes draft `index` of a DSpark call: ids [block] after the next input, confidence [block].
  void take_drafts(const int32_t* ids, const float* confidence_logits, int block);
  void drop_drafts() { drafts.clear(); }
  // Drafts to verify at the next step: the policy's length, at most tokens_left - 1 (the step also emits the token
  // after them) and max_rows - 1 (the snapshot's bound).
  int plan(int64_t tokens_left, int64_t max_rows);

  DraftPolicy policy;
  std::vector<int32_t> drafts;      // [block] drafted ids after the token fed next; empty: none
  std::vector<float> confidence;    // [block] confidence-head logits of the drafts
  std::vector<double> draft_probs;  // [block, vocab] q each draft was drawn from (sampled requests only)
  kv::SequenceSnapshot snapshot;    // armed while a verification is in flight
  int verifying = 0;                // drafts in this step's rows (> 0: the snapshot is armed for them)
  SpeculativeStats stats;
};

}  // namespace dsflash::engine
