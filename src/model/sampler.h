// Next-token sampling from one logits row (policy only; no model state). temperature 0 = greedy (argmax, ties
// to the lowest id). Otherwise: logits / temperature, keep the top_k most likely (0 = all), keep the smallest
// prefix of the sorted distribution whose mass reaches top_p (1 = all), renormalise, draw with a seeded
// generator (same seed and logits -> same ids).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "core/status.h"

namespace dsflash {

struct SamplingParams {
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
};

class Sampler {
 public:
  // Errors: temperature < 0 or not finite, top_k < 0, top_p outside (0, 1].
  static Result<Sampler> create(const SamplingParams& params);

  int32_t sample(const float* logits, int64_t vocab);

 private:
  explicit Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<int32_t> order_;
  std::vector<double> probs_;
};

}  // namespace dsflash
