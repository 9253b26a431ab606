#include "engine/greedy_run.h"

#include <string>

#include "engine/batch_builder.h"

namespace dsflash::engine {

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
  const ModelConfig& config = runner.config();
  const int64_t n = static_cast<int64_t>(prompt.size());
  PrefillOptions plan;  // bounded replay, tail = the window
  if (exact) plan.mode = PrefillMode::kExact;
  const int64_t floor = replay_start(config, plan, n);
  ForwardBatch batch;
  Status s = add_prefill_chunk(batch, config, *seq, prompt.data(), n, n, plan, exact ? LogitsRows::kAll : LogitsRows::kLast);
  if (!s.ok()) return s;
  ForwardOutput out;
  s = run_batch(runner.weights(), batch, runner.context(), &out);
  if (!s.ok()) return s;
  if (out.rows.empty()) return Status::Error("the prefill produced no logits row");
  GreedyRun run;
  for (const ForwardOutput::Row& row : out.rows) run.positions.push_back(row.position);
  run.logits = std::move(out.logits);
  run.generated.push_back(argmax(run.logits.data() + (static_cast<int64_t>(run.positions.size()) - 1) * vocab, vocab));
  for (int64_t step = 0; step < decode_steps; ++step) {
    const int32_t input = follow.empty() ? run.generated.back() : follow[static_cast<size_t>(step)];
    batch.clear();
    add_decode_row(batch, *seq, input, floor);
    s = run_batch(runner.weights(), batch, runner.context(), &out);
    if (!s.ok()) return s.with_context("decode step " + std::to_string(step));
    run.positions.push_back(out.rows[0].position);
    run.generated.push_back(argmax(out.logits.data(), vocab));
    run.logits.insert(run.logits.end(), out.logits.begin(), out.logits.end());
  }
  return run;
}

}  // namespace dsflash::engine
