// Greedy run of the `dsflash logits` contract over the batch builders.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "model/model_runner.h"

namespace dsflash::engine {

// Prefill on `prompt`, then `decode_steps` single-token steps whose inputs are `follow[i]` when given (teacher
// forcing) or the previous greedy id. logits: rows [rows, vocab] (exact: every prompt position, else the last one;
// then one per decode step), positions: their absolute positions, generated: the greedy id after the prompt and
// after every decode step (decode_steps + 1 ids). exact = the official full forward; otherwise the default plan,
// CED prefill with Decoder SWA Bounded Replay, and decode steps with the decoder window floored at the replay
// start.
struct GreedyRun {
  std::vector<float> logits;
  std::vector<int64_t> positions;
  std::vector<int32_t> generated;
};
Result<GreedyRun> run_greedy(const ModelRunner& runner, const std::vector<int32_t>& prompt, int64_t decode_steps,
                             const std::vector<int32_t>& follow, bool exact);

}  // namespace dsflash::engine
