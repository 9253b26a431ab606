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

 private:
  bool has_penalties() const;
  int32_t draw(const float* logits, int64_t vocab);

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::unordered_map<int32_t, int64_t> prompt_seen_;     // id -> 1 (repetition penalty)
  std::unordered_map<int32_t, int64_t> generated_count_; // id -> times generated
  std::vector<float> penalised_;   // [vocab] scratch
  std::vector<int32_t> order_;     // [vocab] scratch
  std::vector<double> probs_;      // [kept] scratch
};

}  // namespace dsflash
