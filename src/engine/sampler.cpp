#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

namespace dsflash {

int32_t argmax(const float* values, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (std::isnan(values[best]) || values[i] > values[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

Status validate_sampling(const SamplingParams& p) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature)) {
    return Status::Error("temperature must be a finite number >= 0, got " + std::to_string(p.temperature));
  }
  if (p.top_k < 0) return Status::Error("top-k must be >= 0, got " + std::to_string(p.top_k));
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) return Status::Error("top-p must be in (0, 1], got " + std::to_string(p.top_p));
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) return Status::Error("min-p must be in [0, 1], got " + std::to_string(p.min_p));
  if (!(p.repetition_penalty > 0.0f) || !std::isfinite(p.repetition_penalty)) {
    return Status::Error("repetition penalty must be a finite number > 0, got " + std::to_string(p.repetition_penalty));
  }
  if (!std::isfinite(p.presence_penalty)) return Status::Error("presence penalty must be finite");
  if (!std::isfinite(p.frequency_penalty)) return Status::Error("frequency penalty must be finite");
  if (p.top_logprobs < 0 || p.top_logprobs > kMaxTopLogprobs) {
    return Status::Error("top logprobs must be in [0, " + std::to_string(kMaxTopLogprobs) + "], got " +
                         std::to_string(p.top_logprobs));
  }
  return Status::Ok();
}

void Sampler::observe_prompt(const std::vector<int32_t>& prompt) {
  for (int32_t id : prompt) prompt_seen_[id] = 1;
}

bool Sampler::has_penalties() const {
  return params_.repetition_penalty != 1.0f || params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f;
}

const float* Sampler::penalised(const float* row, int64_t vocab) {
  if (!has_penalties()) return row;
  penalised_.assign(row, row + vocab);
  auto apply_repetition = [&](int32_t id) {
    if (id < 0 || id >= vocab) return;
    float& v = penalised_[static_cast<size_t>(id)];
    v = v > 0.0f ? v / params_.repetition_penalty : v * params_.repetition_penalty;
  };
  if (params_.repetition_penalty != 1.0f) {
    for (const auto& [id, _] : prompt_seen_) apply_repetition(id);
    for (const auto& [id, _] : generated_count_) {
      if (prompt_seen_.count(id) == 0) apply_repetition(id);
    }
  }
  for (const auto& [id, count] : generated_count_) {
    if (id < 0 || id >= vocab) continue;
    penalised_[static_cast<size_t>(id)] -= params_.frequency_penalty * static_cast<float>(count) + params_.presence_penalty;
  }
  return penalised_.data();
}

SampledToken Sampler::sample(const float* row, int64_t vocab) {
  const float* logits = penalised(row, vocab);
  return emitted(greedy() ? argmax(logits, vocab) : draw(logits, vocab), row, vocab);
}

SampledToken Sampler::emitted(int32_t id, const float* row, int64_t vocab) {
  SampledToken out;
  out.id = id;
  ++generated_count_[out.id];
  if (params_.top_logprobs > 0) {
    // log-softmax of the unmodified row, in double: logprob = x - max - log(sum exp(x - max)).
    double max_logit = -INFINITY;
    for (int64_t i = 0; i < vocab; ++i) max_logit = std::max(max_logit, static_cast<double>(row[i]));
    double total = 0.0;
    for (int64_t i = 0; i < vocab; ++i) total += std::exp(static_cast<double>(row[i]) - max_logit);
    const double log_total = std::log(total) + max_logit;
    out.logprob = static_cast<float>(static_cast<double>(row[out.id]) - log_total);
    const int64_t n = std::min<int64_t>(params_.top_logprobs, vocab);
    order_.resize(static_cast<size_t>(vocab));
    for (int64_t i = 0; i < vocab; ++i) order_[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    std::partial_sort(order_.begin(), order_.begin() + n, order_.end(),
                      [row](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
    for (int64_t i = 0; i < n; ++i) {
      const int32_t top = order_[static_cast<size_t>(i)];
      out.top.push_back(TokenLogprob{top, static_cast<float>(static_cast<double>(row[top]) - log_total)});
    }
  }
  return out;
}

int64_t Sampler::candidates(const float* logits, int64_t vocab) {
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
    for (int64_t i = 0; i < keep; ++i) {
      mass += probs_[static_cast<size_t>(i)] / total;
      if (mass >= params_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (params_.min_p > 0.0f) {
    // probs_ is sorted descending; probs_[0] is the max (unnormalised: the ratio is what matters).
    const double floor = static_cast<double>(params_.min_p) * probs_[0];
    int64_t cut = 1;
    while (cut < keep && probs_[static_cast<size_t>(cut)] >= floor) ++cut;
    keep = cut;
  }
  return keep;
}

int32_t Sampler::draw(const float* logits, int64_t vocab) {
  const int64_t keep = candidates(logits, vocab);
  double total = 0.0;
  for (int64_t i = 0; i < keep; ++i) total += probs_[static_cast<size_t>(i)];
  const double u = std::uniform_real_distribution<double>(0.0, total)(rng_);
  double acc = 0.0;
  for (int64_t i = 0; i < keep; ++i) {
    acc += probs_[static_cast<size_t>(i)];
    if (u < acc) return order_[static_cast<size_t>(i)];
  }
  return order_[static_cast<size_t>(keep - 1)];
}

void Sampler::distribution(const float* logits, int64_t vocab, double* probs) {
  const int64_t keep = candidates(logits, vocab);
  double total = 0.0;
  for (int64_t i = 0; i < keep; ++i) total += probs_[static_cast<size_t>(i)];
  std::fill(probs, probs + vocab, 0.0);
  for (int64_t i = 0; i < keep; ++i) probs[order_[static_cast<size_t>(i)]] = probs_[static_cast<size_t>(i)] / total;
}

int32_t Sampler::draw_draft(const float* draft_logits, int64_t vocab, double* q) {
  if (greedy()) return argmax(draft_logits, vocab);
  distribution(draft_logits, vocab, q);
  return draw_weighted(q, vocab, rng_);
}

SampledToken Sampler::verify(const float* row, int64_t vocab, int32_t draft, const double* q, bool* accepted) {
  const float* logits = penalised(row, vocab);
  int32_t id = -1;
  if (greedy()) {
    id = argmax(logits, vocab);
    *accepted = id == draft;
  } else {
    target_.resize(static_cast<size_t>(vocab));
    distribution(logits, vocab, target_.data());
    *accepted = speculative_accept(target_.data(), q, draft, vocab, rng_, &id);
  }
  return emitted(id, row, vocab);
}

int32_t draw_weighted(const double* weights, int64_t n, std::mt19937_64& rng) {
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) total += weights[i];
  const double u = std::uniform_real_distribution<double>(0.0, total)(rng);
  double acc = 0.0;
  int32_t last = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (weights[i] <= 0.0) continue;
    acc += weights[i];
    last = static_cast<int32_t>(i);
    if (u < acc) return last;
  }
  return last;
}

bool speculative_accept(const double* p, const double* q, int32_t x, int64_t vocab, std::mt19937_64& rng,
                        int32_t* out) {
  const double ratio = q[x] > 0.0 ? p[x] / q[x] : 0.0;
  if (std::uniform_real_distribution<double>(0.0, 1.0)(rng) < std::min(1.0, ratio)) {
    *out = x;
    return true;
  }
  double mass = 0.0;
  for (int64_t v = 0; v < vocab; ++v) mass += std::max(0.0, p[v] - q[v]);
  if (mass <= 0.0) {  // p == q (x would have been accepted): only rounding gets here
    *out = draw_weighted(p, vocab, rng);
    return *out == x;
  }
  // Draw from (p - q)+ without a second [vocab] buffer: the cumulative sum over the clipped differences.
  const double u = std::uniform_real_distribution<double>(0.0, mass)(rng);
  double acc = 0.0;
  int32_t last = 0;
  for (int64_t v = 0; v < vocab; ++v) {
    const double r = std::max(0.0, p[v] - q[v]);
    if (r <= 0.0) continue;
    acc += r;
    last = static_cast<int32_t>(v);
    if (u < acc) break;
  }
  *out = last;
  return false;
}

}  // namespace dsflash
