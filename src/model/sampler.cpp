#include "model/sampler.h"

#include <algorithm>
#include <cmath>

#include "model/model_runner.h"

namespace dsflash {

Result<Sampler> Sampler::create(const SamplingParams& params) {
  if (!(params.temperature >= 0.0f) || !std::isfinite(params.temperature)) {
    return Status::Error("temperature must be a finite number >= 0, got " + std::to_string(params.temperature));
  }
  if (params.top_k < 0) return Status::Error("top-k must be >= 0, got " + std::to_string(params.top_k));
  if (!(params.top_p > 0.0f && params.top_p <= 1.0f)) {
    return Status::Error("top-p must be in (0, 1], got " + std::to_string(params.top_p));
  }
  return Sampler(params);
}

int32_t Sampler::sample(const float* logits, int64_t vocab) {
  if (params_.temperature == 0.0f || params_.top_k == 1) return argmax(logits, vocab);
  order_.resize(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) order_[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  // Most likely first; equal logits by ascending id so the draw is reproducible.
  auto more_likely = [logits](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  int64_t keep = vocab;
  if (params_.top_k > 0 && params_.top_k < vocab) {
    keep = params_.top_k;
    std::partial_sort(order_.begin(), order_.begin() + keep, order_.end(), more_likely);
  } else {
    std::sort(order_.begin(), order_.end(), more_likely);
  }
  probs_.resize(static_cast<size_t>(keep));
  const double max_logit = logits[order_[0]];
  double total = 0.0;
  for (int64_t i = 0; i < keep; ++i) {
    const double p = std::exp((logits[order_[static_cast<size_t>(i)]] - max_logit) / params_.temperature);
    probs_[static_cast<size_t>(i)] = p;
    total += p;
  }
  if (params_.top_p < 1.0f) {
    double mass = 0.0;
    int64_t cut = keep;
    for (int64_t i = 0; i < keep; ++i) {
      mass += probs_[static_cast<size_t>(i)] / total;
      if (mass >= params_.top_p) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
    total = 0.0;
    for (int64_t i = 0; i < keep; ++i) total += probs_[static_cast<size_t>(i)];
  }
  const double u = std::uniform_real_distribution<double>(0.0, total)(rng_);
  double acc = 0.0;
  for (int64_t i = 0; i < keep; ++i) {
    acc += probs_[static_cast<size_t>(i)];
    if (u < acc) return order_[static_cast<size_t>(i)];
  }
  return order_[static_cast<size_t>(keep - 1)];
}

}  // namespace dsflash
