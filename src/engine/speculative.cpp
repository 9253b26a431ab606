#include "engine/speculative.h"

#include <algorithm>
#include <cmath>

#include "engine/batch_builder.h"
#include "engine/sampler.h"

namespace dsflash::engine {

int64_t accept_greedy(const float* target_logits, const int32_t* drafts, int64_t k, int64_t vocab, int32_t* next) {
  int64_t a = 0;
  while (a < k && argmax(target_logits + a * vocab, vocab) == drafts[a]) ++a;
  *next = argmax(target_logits + a * vocab, vocab);
  return a;
}

namespace {
int32_t draw_from(const double* weights, int64_t n, std::mt19937_64& rng) {
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
}  // namespace

int64_t accept_sampled(const double* target, const double* draft, const int32_t* drafts, int64_t k, int64_t vocab,
                       std::mt19937_64& rng, int32_t* next) {
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (int64_t i = 0; i < k; ++i) {
    const double* p = target + i * vocab;
    const double* q = draft + i * vocab;
    const int32_t x = drafts[i];
    const double ratio = q[x] > 0.0 ? p[x] / q[x] : 0.0;
    if (uniform(rng) < std::min(1.0, ratio)) continue;
    std::vector<double> residual(static_cast<size_t>(vocab));
    double mass = 0.0;
    for (int64_t v = 0; v < vocab; ++v) mass += residual[static_cast<size_t>(v)] = std::max(0.0, p[v] - q[v]);
    // mass 0 only when p == q (then x would have been accepted): fall back to p.
    *next = mass > 0.0 ? draw_from(residual.data(), vocab, rng) : draw_from(p, vocab, rng);
    return i;
  }
  *next = draw_from(target + k * vocab, vocab, rng);
  return k;
}

void softmax_probs(const float* logits, int64_t vocab, float temperature, double* probs) {
  if (temperature == 0.0f) {
    std::fill(probs, probs + vocab, 0.0);
    probs[argmax(logits, vocab)] = 1.0;
    return;
  }
  double max_logit = -INFINITY;
  for (int64_t v = 0; v < vocab; ++v) max_logit = std::max(max_logit, static_cast<double>(logits[v]));
  double total = 0.0;
  for (int64_t v = 0; v < vocab; ++v) total += probs[v] = std::exp((logits[v] - max_logit) / temperature);
  for (int64_t v = 0; v < vocab; ++v) probs[v] /= total;
}

DraftPolicy::DraftPolicy(const DraftPolicyOptions& options) : options_(options), current_(options.max_draft) {}

int DraftPolicy::draft_length(const float* confidence, int block) {
  if (off_left_ > 0) {
    --off_left_;
    return 0;
  }
  int n = std::min(current_, block);
  for (int i = 0; i < n; ++i) {
    if (confidence != nullptr && confidence[i] < options_.min_confidence) {
      n = i;
      break;
    }
  }
  return std::max(n, 0);
}

void DraftPolicy::record(int drafted, int accepted) {
  if (drafted == 0 || options_.max_draft == 0) return;
  current_ = accepted == drafted ? std::min(current_ + 1, options_.max_draft) : std::max(1, accepted + 1);
  drafted_ += drafted;
  accepted_ += accepted;
  if (++measured_ < options_.probe_steps) return;
  if (static_cast<double>(accepted_) < options_.min_accept_rate * static_cast<double>(drafted_)) {
    off_left_ = options_.off_steps;  // speculation does not pay here: plain steps, then a re-probe at k = 1
    current_ = 1;
  }
  measured_ = 0;
  drafted_ = accepted_ = 0;
}

SpeculativeDecoder::SpeculativeDecoder(const ModelWeights& weights, const DSpark& dspark, const ComputeContext& ctx,
                                       const DraftPolicyOptions& policy, float temperature, uint64_t seed)
    : weights_(weights), dspark_(dspark), ctx_(ctx), policy_(policy), temperature_(temperature), rng_(seed) {}

Status SpeculativeDecoder::run(SequenceState& seq, const std::vector<int32_t>& tokens, LogitsRows rows) {
  ForwardBatch batch;
  RowOptions options;
  options.logits = rows;
  options.dspark_hidden = true;
  batch.add(seq, tokens.data(), static_cast<int64_t>(tokens.size()), options);
  return run_batch(weights_, batch, ctx_, &out_);
}

Status SpeculativeDecoder::draft(SequenceState& seq, int64_t context, int32_t next) {
  DSparkSegment segment;
  segment.state = &seq;
  segment.main_hidden = out_.dspark_hidden.data();
  segment.first_position = out_.dspark_rows.empty() ? seq.num_positions() : out_.dspark_rows[0].position;
  segment.num_context = context;
  segment.draft = policy_.active();
  segment.next_token = next;
  const int64_t vocab = weights_.config().vocab_size;
  std::vector<double> probs(static_cast<size_t>(vocab));
  DraftSampler sampler;
  if (temperature_ > 0.0f) {
    sampler = [this, &probs](const float* logits, int64_t n, int64_t, int) {
      softmax_probs(logits, n, temperature_, probs.data());
      return draw_from(probs.data(), n, rng_);
    };
  }
  drafted_ = DSparkOutput();
  return dspark_.forward(&segment, 1, ctx_, &drafted_, sampler);
}

int32_t SpeculativeDecoder::pick(const float* logits, double* probs) {
  const int64_t vocab = weights_.config().vocab_size;
  if (temperature_ == 0.0f) return argmax(logits, vocab);
  softmax_probs(logits, vocab, temperature_, probs);
  return draw_from(probs, vocab, rng_);
}

Result<std::vector<int32_t>> SpeculativeDecoder::generate(SequenceState& seq, const std::vector<int32_t>& prompt,
                                                          int64_t max_new) {
  const int64_t vocab = weights_.config().vocab_size;
  std::vector<int32_t> generated;
  std::vector<double> target, draft_probs;
  Status s = run(seq, prompt, LogitsRows::kLast);
  if (!s.ok()) return s;
  target.resize(static_cast<size_t>(vocab));
  int32_t next = pick(out_.logits.data() + (static_cast<int64_t>(out_.rows.size()) - 1) * vocab, target.data());
  generated.push_back(next);
  s = draft(seq, static_cast<int64_t>(out_.dspark_rows.size()), next);
  if (!s.ok()) return s;
  const int64_t max_rows = kv::SequenceSnapshot::max_rows(seq.layout());
  while (static_cast<int64_t>(generated.size()) < max_new) {
    const int block = drafted_.drafts.empty() ? 0 : drafted_.block;
    int k = policy_.draft_length(block > 0 ? drafted_.confidence.data() : nullptr, block);
    k = static_cast<int>(std::min<int64_t>({k, max_new - static_cast<int64_t>(generated.size()) - 1, max_rows - 1}));
    std::vector<int32_t> rows = {next};
    for (int i = 0; i < k; ++i) rows.push_back(drafted_.output_ids[static_cast<size_t>(1 + i)]);
    if (k > 0) {
      s = snapshot_.capture(seq, 1 + k);
      if (!s.ok()) return s;
    }
    s = run(seq, rows, LogitsRows::kAll);
    if (!s.ok()) {
      if (k > 0) snapshot_.disarm(seq);
      return s;
    }
    int64_t accepted = 0;
    if (temperature_ == 0.0f) {
      accepted = accept_greedy(out_.logits.data(), rows.data() + 1, k, vocab, &next);
    } else {
      target.resize(static_cast<size_t>((k + 1) * vocab));
      draft_probs.resize(static_cast<size_t>(k * vocab));
      for (int i = 0; i <= k; ++i) softmax_probs(out_.logits.data() + i * vocab, vocab, temperature_, &target[i * vocab]);
      for (int i = 0; i < k; ++i) {
        softmax_probs(drafted_.logits.data() + i * vocab, vocab, temperature_, &draft_probs[i * vocab]);
      }
      accepted = accept_sampled(target.data(), draft_probs.data(), rows.data() + 1, k, vocab, rng_, &next);
    }
    if (k > 0) {
      s = snapshot_.keep(seq, 1 + accepted);
      if (!s.ok()) return s;
    }
    for (int64_t i = 0; i < accepted; ++i) generated.push_back(rows[static_cast<size_t>(1 + i)]);
    generated.push_back(next);
    ++stats_.steps;
    stats_.draft_tokens += k;
    stats_.accepted_tokens += accepted;
    stats_.emitted_tokens += 1 + accepted;
    policy_.record(k, static_cast<int>(accepted));
    s = draft(seq, 1 + accepted, next);
    if (!s.ok()) return s;
  }
  generated.resize(static_cast<size_t>(max_new));
  return generated;
}

}  // namespace dsflash::engine
