#include "model/model_runner.h"

#include <cmath>

#include "model/forward_plan.h"

namespace dsflash {

Result<std::unique_ptr<ModelRunner>> ModelRunner::open(const std::string& checkpoint_dir,
                                                       const RunnerOptions& options) {
  auto checkpoint = Checkpoint::open(checkpoint_dir);
  if (!checkpoint.ok()) return checkpoint.status();
  std::unique_ptr<ModelRunner> runner(new ModelRunner(std::move(*checkpoint)));
  auto weights = ModelWeights::bind(runner->checkpoint_);
  if (!weights.ok()) return weights.status().with_context("binding " + checkpoint_dir);
  runner->weights_ = std::move(*weights);
  runner->transformer_ = std::make_unique<Transformer>(*runner->weights_);
  if (options.reference) {
    runner->ctx_ = ComputeContext::for_backend(reference_backend());
  } else {
    runner->pool_ = std::make_unique<ThreadPool>(options.num_threads);
    runner->ctx_ = ComputeContext::for_backend(best_backend(), runner->pool_.get());
  }
  return runner;
}

int32_t argmax(const float* values, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (std::isnan(values[best]) || values[i] > values[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

Result<GreedyRun> run_greedy(const ModelRunner& runner, const std::vector<int32_t>& prompt, int64_t decode_steps,
                             const std::vector<int32_t>& follow, bool exact) {
  if (prompt.empty()) return Status::Error("the prompt is empty: give at least one token id");
  if (decode_steps < 0) return Status::Error("decode steps must be >= 0");
  if (!follow.empty() && static_cast<int64_t>(follow.size()) < decode_steps) {
    return Status::Error("--follow gives " + std::to_string(follow.size()) + " ids but " +
                         std::to_string(decode_steps) + " decode steps need one each");
  }
  const int64_t vocab = runner.config().vocab_size;
  const int64_t total = static_cast<int64_t>(prompt.size()) + decode_steps;
  if (total > runner.config().max_position_embeddings) {
    return Status::Error("prompt (" + std::to_string(prompt.size()) + ") + decode steps (" +
                         std::to_string(decode_steps) + ") exceed max_position_embeddings " +
                         std::to_string(runner.config().max_position_embeddings));
  }
  for (int32_t id : follow) {
    if (id < 0 || id >= vocab) {
      return Status::Error("--follow id " + std::to_string(id) + " is outside the vocabulary [0, " +
                           std::to_string(vocab) + ")");
    }
  }
  auto seq = runner.new_sequence();
  if (!seq.ok()) return seq.status();
  GreedyRun run;
  std::vector<float> rows;
  const ForwardPlan plan(runner.weights());
  const PrefillOptions plan_options;  // bounded replay, tail = the window
  const int64_t floor = exact ? 0 : replay_start(runner.config(), plan_options, static_cast<int64_t>(prompt.size()));
  if (exact) {
    Status s = runner.forward(prompt, *seq, LogitsRows::kAll, &rows);
    if (!s.ok()) return s;
    for (size_t r = 0; r < prompt.size(); ++r) run.positions.push_back(static_cast<int64_t>(r));
    run.logits = std::move(rows);
  } else {
    ChunkLogits chunk;
    Status s = plan.prefill(prompt.data(), static_cast<int64_t>(prompt.size()), static_cast<int64_t>(prompt.size()),
                            *seq, runner.context(), plan_options, LogitsRows::kLast, &chunk);
    if (!s.ok()) return s;
    run.positions = chunk.positions;
    run.logits = std::move(chunk.logits);
  }
  if (run.positions.empty()) return Status::Error("the prefill produced no logits row");
  run.generated.push_back(argmax(run.logits.data() + (static_cast<int64_t>(run.positions.size()) - 1) * vocab, vocab));
  for (int64_t step = 0; step < decode_steps; ++step) {
    const int32_t input = follow.empty() ? run.generated.back() : follow[static_cast<size_t>(step)];
    Status s = exact ? runner.forward({input}, *seq, LogitsRows::kLast, &rows)
                     : plan.decode({input}, {&*seq}, {floor}, runner.context(), &rows);
    if (!s.ok()) return s.with_context("decode step " + std::to_string(step));
    run.positions.push_back(static_cast<int64_t>(prompt.size()) + step);
    run.generated.push_back(argmax(rows.data(), vocab));
    run.logits.insert(run.logits.end(), rows.begin(), rows.end());
  }
  return run;
}

}  // namespace dsflash
