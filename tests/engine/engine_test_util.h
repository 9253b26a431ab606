// Test helpers for the engine tests: open a golden checkpoint once per process, the plans as batch builders + the one forward.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/batch_builder.h"
#include "engine/model_runner.h"
#include "engine/sampler.h"
#include "model/golden_tensors.h"

namespace dsflash::testing {

// One runner per golden model, kept for the whole test binary (opening maps and binds the checkpoint).
inline const ModelRunner* golden_runner(const std::string& model) {
  static std::map<std::string, std::unique_ptr<ModelRunner>> runners;
  auto it = runners.find(model);
  if (it != runners.end()) return it->second.get();
  RunnerOptions options;
  options.num_threads = 2;
  auto runner = ModelRunner::open(golden_checkpoint_dir(model), options);
  if (!runner.ok()) {
    ADD_FAILURE() << runner.status().message();
    return nullptr;
  }
  return (runners[model] = std::move(*runner)).get();
}

inline std::vector<int32_t> golden_prompt(const std::string& model, const std::string& scenario) {
  auto file = SafetensorsFile::open(golden_output_path(model, scenario));
  if (!file.ok()) {
    ADD_FAILURE() << file.status().message();
    return {};
  }
  std::vector<int32_t> ids;
  for (int64_t v : to_i64(file->find("prompt_ids"))) ids.push_back(static_cast<int32_t>(v));
  return ids;
}

using engine::PrefillMode;
using engine::PrefillOptions;
using engine::prefill_mode_name;
using engine::replay_start;

// One prefill chunk of one sequence: the batch builder, then reserve + the one forward.
inline Status prefill_chunk(const ModelRunner& runner, const int32_t* tokens, int64_t num_tokens, int64_t prompt_length,
                            SequenceState& seq, const PrefillOptions& options, LogitsRows rows, ForwardOutput* out,
                            const ComputeContext* ctx = nullptr) {
  ForwardBatch batch;
  Status s = engine::add_prefill_chunk(batch, runner.config(), seq, tokens, num_tokens, prompt_length, options, rows);
  if (!s.ok()) return s;
  return engine::run_batch(runner.weights(), batch, ctx ? *ctx : runner.context(), out);
}

// One decode step of several sequences in one batch (floors: per sequence, may be empty = 0). logits [batch, vocab].
inline Status decode_step(const ModelRunner& runner, const std::vector<int32_t>& tokens,
                          const std::vector<SequenceState*>& seqs, const std::vector<int64_t>& floors,
                          std::vector<float>* logits, const ComputeContext* ctx = nullptr) {
  ForwardBatch batch;
  for (size_t b = 0; b < seqs.size(); ++b) engine::add_decode_rows(batch, *seqs[b], &tokens[b], 1, floors.empty() ? 0 : floors[b]);
  ForwardOutput out;
  Status s = engine::run_batch(runner.weights(), batch, ctx ? *ctx : runner.context(), &out);
  if (s.ok()) *logits = std::move(out.logits);
  return s;
}

// Greedy run: prefill in chunks of `chunk` tokens (0 = one chunk), then `steps` decode steps of batch 1.
// logits: the last prompt row then one row per step. states (keep_states): a copy of the sequence before every
// decode step (states[j] has processed the prompt and the first j generated ids).
struct PlanRun {
  std::vector<int32_t> generated;
  std::vector<float> logits;
  std::vector<kv::SequenceLease> states;
};

inline PlanRun plan_greedy(const ModelRunner& runner, const std::vector<int32_t>& prompt, const PrefillOptions& options,
                           int64_t steps, int64_t chunk = 0, bool keep_states = false) {
  PlanRun run;
  auto seq = runner.new_sequence();
  EXPECT_TRUE(seq.ok());
  const int64_t n = static_cast<int64_t>(prompt.size());
  const int64_t vocab = runner.config().vocab_size;
  ForwardOutput out;
  for (int64_t done = 0; done < n;) {
    const int64_t c = chunk > 0 ? std::min(chunk, n - done) : n;
    Status s = prefill_chunk(runner, prompt.data() + done, c, n, *seq, options, LogitsRows::kLast, &out);
    EXPECT_TRUE(s.ok()) << s.message();
    if (!s.ok()) return run;
    done += c;
  }
  run.logits = out.logits;
  run.generated.push_back(argmax(out.logits.data(), vocab));
  const int64_t floor = replay_start(runner.config(), options, n);
  for (int64_t i = 0; i < steps; ++i) {
    if (keep_states) {
      auto copy = runner.fork(**seq);
      EXPECT_TRUE(copy.ok());
      if (copy.ok()) run.states.push_back(std::move(*copy));
    }
    std::vector<float> logits;
    Status s = decode_step(runner, {run.generated.back()}, {seq->get()}, {floor}, &logits);
    EXPECT_TRUE(s.ok()) << s.message();
    if (!s.ok()) return run;
    run.generated.push_back(argmax(logits.data(), vocab));
    run.logits.insert(run.logits.end(), logits.begin(), logits.end());
  }
  return run;
}

// Byte-for-byte comparison of everything a sequence's later forwards read or a plain run holds (the first
// num_layers window layers; -1 = all, the DSpark stages' rings included).
inline void expect_same_state(const SequenceState& a, const SequenceState& b, const std::string& where,
                              int num_layers = -1) {
  ASSERT_EQ(a.num_positions(), b.num_positions()) << where;
  ASSERT_EQ(a.num_layers(), b.num_layers()) << where;
  const int64_t d = a.layout().head_dim;
  for (int l = 0; l < (num_layers < 0 ? a.num_layers() : num_layers); ++l) {
    const kv::WindowRing& ra = a.window(l);
    const kv::WindowRing& rb = b.window(l);
    for (int s = 0; s < ra.window(); ++s) {
      ASSERT_EQ(ra.slot_position(s), rb.slot_position(s)) << where << " layer " << l << " slot " << s;
      if (ra.slot_position(s) < 0) continue;
      EXPECT_EQ(0, std::memcmp(ra.slot_codes(s), rb.slot_codes(s), static_cast<size_t>(d))) << where << " layer " << l;
      EXPECT_EQ(0, std::memcmp(ra.slot_scales(s), rb.slot_scales(s), static_cast<size_t>(d / 32))) << where;
    }
    const kv::CompressedKv* ca = a.compressed(l);
    const kv::CompressedKv* cb = b.compressed(l);
    ASSERT_EQ(ca == nullptr, cb == nullptr);
    if (ca != nullptr) {
      ASSERT_EQ(ca->num_entries(), cb->num_entries()) << where << " layer " << l;
      for (int64_t e = 0; e < ca->num_entries(); ++e) {
        EXPECT_EQ(0, std::memcmp(ca->kv_row(e), cb->kv_row(e), static_cast<size_t>(kv::CompressedKv::kv_bytes(d))));
        EXPECT_EQ(0, std::memcmp(ca->index_key_row(e), cb->index_key_row(e),
                                 static_cast<size_t>(kv::CompressedKv::index_key_bytes(ca->index_head_dim()))));
      }
    }
    const kv::CompressorTail* ta = a.tail(l);
    const kv::CompressorTail* tb = b.tail(l);
    ASSERT_EQ(ta == nullptr, tb == nullptr);
    if (ta != nullptr) {
      EXPECT_EQ(0, std::memcmp(ta->kv.data(), tb->kv.data(), ta->kv.size_bytes())) << where << " tail kv " << l;
      EXPECT_EQ(0, std::memcmp(ta->score.data(), tb->score.data(), ta->score.size_bytes())) << where << " tail " << l;
    }
  }
  ASSERT_EQ(a.engram() == nullptr, b.engram() == nullptr);
  if (a.engram() != nullptr) {
    EXPECT_EQ(a.engram()->num_positions(), b.engram()->num_positions()) << where;
    const auto ea = a.engram()->recent();
    const auto eb = b.engram()->recent();
    EXPECT_TRUE(std::equal(ea.begin(), ea.end(), eb.begin(), eb.end())) << where << " engram history";
  }
}

}  // namespace dsflash::testing
