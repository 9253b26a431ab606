// Next-token sampling from one logits row, with the per-request state the penalties need (counts of the ids
// seen). The policy is include/dsflash/sampling.h's (penalties, greedy, temperature, top-k, top-p, min-p, seeded
// draw); top-N logprobs are the log-softmax of the unmodified row. Deterministic: the same params, seed and rows
// give the same ids. Not thread-safe (one sampler per request).
#pragma once

#include <cstdint>
#include <random>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "dsflash/engine.h"
#include "dsflash/sampling.h"

namespace dsflash {

// Index of the largest value; ties to the lowest index (torch argmax), NaN never chosen over a number.
int32_t argmax(const float* values, int64_t n);

// A draw of an index with probability weights[i] / sum (weights >= 0, some > 0).
int32_t draw_weighted(const double* weights, int64_t n, std::mt19937_64& rng);

// Speculative sampling of one verified row (standard rejection rule): the draft id x was drawn from q [vocab];
// accept it with probability min(1, p(x) / q(x)), else draw from the residual (p - q)+ normalised (from p when the
// residual is empty). The emitted id then follows p whatever q is. Sets *out; returns whether x was accepted.
bool speculative_accept(const double* p, const double* q, int32_t x, int64_t vocab, std::mt19937_64& rng,
                        int32_t* out);

// Errors name the bad field: temperature < 0 or not finite, top_k < 0, top_p outside (0, 1], min_p outside
// [0, 1], repetition_penalty <= 0 or not finite, presence/frequency not finite, top_logprobs outside [0, 20].
Status validate_sampling(const SamplingParams& params);

struct SampledToken {
  int32_t id = -1;
  float logprob = 0.0f;                  // of id under log-softmax(row); set when top_logprobs > 0
  std::vector<TokenLogprob> top;         // top_logprobs most likely ids of the unmodified row, ties by lower id
};

class Sampler {
 public:
  Sampler() = default;  // greedy, no penalties
  // params must pass validate_sampling.
  explicit Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

  // The prompt ids (the repetition penalty covers them).
  void observe_prompt(const std::vector<int32_t>& prompt);
  // Chooses the next id from `row` [vocab] and counts it as generated.
  SampledToken sample(const float* row, int64_t vocab);

  // Speculative decoding (engine/speculative.h). greedy(): drafts are the drafter's argmax and verification is by
  // equality with the penalised argmax, so the ids are those of sample(); otherwise the drafter draws from
  // draft_distribution() and verify() applies speculative_accept() with p = this row's sampling distribution.
  bool greedy() const { return params_.temperature == 0.0f || params_.top_k == 1; }
  // q [vocab] = the request's temperature / top-k / top-p / min-p on a draft logits row (no penalties); returns a
  // draw from it (uses this sampler's generator).
  int32_t draw_draft(const float* draft_logits, int64_t vocab, double* q);
  // The id emitted at a verified row that carried `draft` (drawn from q [vocab]; null when greedy()); counts it as
  // generated. *accepted: the id is the draft.
  SampledToken verify(const float* row, int64_t vocab, int32_t draft, const double* q, bool* accepted);

 private:
  bool has_penalties() const;
  // The row after penalties (row itself without any).
  const float* penalised(const float* row, int64_t vocab);
  // Candidates of a sampling draw from `logits`: order_[0, keep) most likely first with unnormalised probs_.
  int64_t candidates(const float* logits, int64_t vocab);
  int32_t draw(const float* logits, int64_t vocab);
  // Dense normalised sampling distribution of `logits` [vocab] into probs [vocab].
  void distribution(const float* logits, int64_t vocab, double* probs);
  // Counts `id` as generated and fills its logprobs from the unmodified row.
  SampledToken emitted(int32_t id, const float* row, int64_t vocab);

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::unordered_map<int32_t, int64_t> prompt_seen_;     // id -> 1 (repetition penalty)
  std::unordered_map<int32_t, int64_t> generated_count_; // id -> times generated
  std::vector<float> penalised_;   // [vocab] scratch
  std::vector<int32_t> order_;     // [vocab] scratch
  std::vector<double> probs_;      // [kept] scratch
  std::vector<double> target_;     // [vocab] scratch: p of a verified row
};

}  // namespace dsflash
