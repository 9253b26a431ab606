// How the next token is chosen from one logits row (src/engine/sampler.h implements it). Order of operations:
//   1. penalties on the raw row: repetition (prompt + generated ids; CTRL rule: logit > 0 ? logit / p : logit * p),
//      then frequency (- f * count in the generated ids) and presence (- p once a generated id appeared);
//   2. temperature 0: greedy = argmax of the penalised row, lowest id on ties; stop here;
//   3. logits / temperature, softmax; keep the top_k most likely (0 = all); keep the smallest most-likely-first
//      prefix whose mass reaches top_p (1 = all); drop tokens with p < min_p * p_max (0 = none); renormalise;
//   4. draw with a generator seeded by `seed` (same seed, same logits, same ids).
// Logprobs (top_logprobs > 0) are the log-softmax of the unmodified row (before penalties and temperature).
#pragma once

#include <cstdint>

namespace dsflash {

struct SamplingParams {
  float temperature = 0.0f;        // >= 0; 0 = greedy
  int top_k = 0;                   // >= 0; 0 = all
  float top_p = 1.0f;              // (0, 1]
  float min_p = 0.0f;              // [0, 1]
  uint64_t seed = 0;
  float repetition_penalty = 1.0f; // > 0; 1 = none
  float presence_penalty = 0.0f;   // finite; 0 = none
  float frequency_penalty = 0.0f;  // finite; 0 = none
  int top_logprobs = 0;            // [0, 20]: how many most likely ids (with logprobs) each token event carries
};

inline constexpr int kMaxTopLogprobs = 20;

}  // namespace dsflash
