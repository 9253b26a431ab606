#include "engine/batch_builder.h"

#include <algorithm>
#include <string>

namespace dsflash::engine {

const char* prefill_mode_name(PrefillMode mode) {
  return mode == PrefillMode::kExact ? "exact" : "bounded-replay";
}

int64_t replay_start(const ModelConfig& config, const PrefillOptions& options, int64_t prompt_length) {
  if (options.mode == PrefillMode::kExact && !options.truncate_decoder_window) return 0;
  const int64_t replay = options.replay_tokens > 0 ? options.replay_tokens : config.window_size;
  return std::max<int64_t>(0, prompt_length - replay);
}

Status add_prefill_chunk(ForwardBatch& batch, const ModelConfig& config, SequenceState& seq, const int32_t* tokens,
                         int64_t num_tokens, int64_t prompt_length, const PrefillOptions& options, LogitsRows rows,
                         bool dspark_hidden) {
  const int64_t start = seq.num_positions();
  if (num_tokens <= 0) return Status::Error("prefill: no tokens to process");
  if (start + num_tokens > prompt_length) {
    return Status::Error("prefill: chunk [" + std::to_string(start) + ", " + std::to_string(start + num_tokens) +
                         ") runs past the prompt length " + std::to_string(prompt_length));
  }
  if (options.replay_tokens < 0) return Status::Error("prefill: replay_tokens must be >= 0");
  const int64_t floor = replay_start(config, options, prompt_length);
  const bool replay = options.mode == PrefillMode::kBoundedReplay && config.ced_decoder_start() < config.n_layers;
  RowOptions row;
  // Rows before the replay start only feed layer d's global-KV path.
  row.global_only = replay ? std::clamp<int64_t>(floor - start, 0, num_tokens) : 0;
  row.window_floor = floor;
  const bool holds_last = start + num_tokens == prompt_length;
  row.logits = rows == LogitsRows::kLast && !holds_last ? LogitsRows::kNone : rows;
  row.dspark_hidden = dspark_hidden;
  batch.add(seq, tokens, num_tokens, row);
  return Status::Ok();
}

void add_decode_rows(ForwardBatch& batch, SequenceState& seq, const int32_t* tokens, int64_t num_tokens,
                     int64_t window_floor, bool dspark_hidden) {
  RowOptions row;
  row.window_floor = window_floor;
  row.logits = LogitsRows::kAll;
  row.dspark_hidden = dspark_hidden;
  batch.add(seq, tokens, num_tokens, row);
}

void add_exact(ForwardBatch& batch, SequenceState& seq, const int32_t* tokens, int64_t num_tokens, LogitsRows rows) {
  RowOptions row;
  row.logits = rows;
  batch.add(seq, tokens, num_tokens, row);
}

Status reserve_kv(const ForwardBatch& batch) {
  for (const ForwardSegment& seg : batch.segments()) {
    Status s = seg.seq->pages().reserve_positions(seg.seq->num_positions() + seg.num_tokens);
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

Status run_batch(const ModelWeights& weights, const ForwardBatch& batch, const ComputeContext& ctx,
                 ForwardOutput* out) {
  Status s = reserve_kv(batch);
  if (!s.ok()) return s;
  return forward(weights, batch, ctx, out);
}

}  // namespace dsflash::engine
