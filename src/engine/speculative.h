// Speculative decoding with the model's own DSpark draft stages (spec/MODEL.md §4.10; model/dspark.h "intended
// use"): per step, the sequence's next input and k drafted ids are verified by ONE forward of the main model over
// 1 + k rows (logits for every row); the accepted prefix is kept and the rest rolled back exactly
// (kv/sequence_snapshot.h); the DSpark rings receive only accepted rows.
//
//   accept_greedy       lossless for greedy decoding: drafts are accepted while they equal the target argmax.
//   accept_sampled      standard speculative sampling: accept draft x with probability min(1, p(x)/q(x)), else
//                       resample from the residual (p - q)+; the emitted ids follow the target distribution p.
//   DraftPolicy         per sequence: the draft length follows the measured acceptance and the confidence head;
//                       when drafts rarely match it turns speculation off, with a periodic re-probe.
//   SpeculativeDecoder  the loop for one sequence on the one forward (tests, `logits`/`bench` style runs).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "core/status.h"
#include "kv/sequence_snapshot.h"
#include "model/dspark.h"
#include "model/forward.h"

namespace dsflash::engine {

// Greedy verification. target_logits [k + 1, vocab] fp32: row i predicts the id after the i-th verified row.
// drafts [k]. Returns the number a of accepted drafts and sets *next to the target's id after them (the argmax of
// row a; the bonus token when a = k).
int64_t accept_greedy(const float* target_logits, const int32_t* drafts, int64_t k, int64_t vocab, int32_t* next);

// Speculative sampling. target [k + 1, vocab] and draft [k, vocab] probabilities (each row sums to 1; draft row i
// is the distribution drafts[i] was drawn from). Returns a and sets *next: drawn from the residual of row a when a
// draft was rejected, from target row k when all were accepted.
int64_t accept_sampled(const double* target, const double* draft, const int32_t* drafts, int64_t k, int64_t vocab,
                       std::mt19937_64& rng, int32_t* next);

// Softmax of logits / temperature [vocab] into probs [vocab] (double); temperature 0: one-hot argmax.
void softmax_probs(const float* logits, int64_t vocab, float temperature, double* probs);

struct DraftPolicyOptions {
  int max_draft = 0;              // --speculative N: most drafted tokens per step (also capped by the block size)
  float min_confidence = -4.0f;   // confidence-head logit below which drafting stops (sigmoid ~ 0.018)
  int probe_steps = 8;            // verifications measured before deciding whether speculation pays
  double min_accept_rate = 0.25;  // accepted / drafted below which it turns off
  int off_steps = 64;             // plain decode steps before a re-probe
};

// Per-sequence draft-length controller.
class DraftPolicy {
 public:
  explicit DraftPolicy(const DraftPolicyOptions& options);
  // How many of the block's drafts to verify this step (0 = plain decode). confidence [block] fp32 logits.
  int draft_length(const float* confidence, int block);
  // After a step that verified `drafted` drafts of which `accepted` were kept (drafted 0: a plain step).
  void record(int drafted, int accepted);
  bool active() const { return off_left_ == 0; }

 private:
  DraftPolicyOptions options_;
  int current_ = 0;        // draft length now
  int measured_ = 0;       // verifications in the probe window
  int64_t drafted_ = 0, accepted_ = 0;
  int off_left_ = 0;       // plain steps left before a re-probe
};

struct SpeculativeStats {
  int64_t steps = 0;            // decode steps (verifications and plain steps)
  int64_t draft_tokens = 0;     // drafts verified
  int64_t accepted_tokens = 0;  // drafts accepted
  int64_t emitted_tokens = 0;   // tokens emitted by decode steps
  double mean_accept_len() const { return steps == 0 ? 0.0 : static_cast<double>(emitted_tokens) / steps; }
};

// The speculative loop of one sequence over the official (exact) forward: prefill, then steps of draft + verify.
// Greedy (temperature 0) or plain temperature sampling with a seed.
class SpeculativeDecoder {
 public:
  SpeculativeDecoder(const ModelWeights& weights, const DSpark& dspark, const ComputeContext& ctx,
                     const DraftPolicyOptions& policy, float temperature = 0.0f, uint64_t seed = 0);
  // Prefills `prompt` into seq (empty, reserved by the caller's manager as rows go) and generates `max_new` ids.
  Result<std::vector<int32_t>> generate(SequenceState& seq, const std::vector<int32_t>& prompt, int64_t max_new);
  const SpeculativeStats& stats() const { return stats_; }

 private:
  // One forward of `tokens` continuing seq with every row's logits and DSpark hidden rows.
  Status run(SequenceState& seq, const std::vector<int32_t>& tokens, LogitsRows rows);
  // DSpark: append hidden rows [0, context) of the last forward and draft a block after `next`.
  Status draft(SequenceState& seq, int64_t context, int32_t next);
  int32_t pick(const float* logits, double* probs);

  const ModelWeights& weights_;
  const DSpark& dspark_;
  const ComputeContext& ctx_;
  DraftPolicy policy_;
  float temperature_;
  std::mt19937_64 rng_;
  ForwardOutput out_;
  DSparkOutput drafted_;
  kv::SequenceSnapshot snapshot_;
  SpeculativeStats stats_;
};

}  // namespace dsflash::engine
