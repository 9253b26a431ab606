// Test helper: runs a golden scenario through ModelRunner the way the official run was made (prefill of the
// first `prefill_tokens` prompt ids, then one id at a time for the rest of the prompt and for the decode steps)
// and measures the logits against the golden rows. Shared by the end-to-end tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/golden_tensors.h"
#include "engine/model_runner.h"
#include "engine/sampler.h"

namespace dsflash::testing {

struct GoldenScenario {
  std::string model, name;
  bool index_k_fix = false;         // decode rows follow dsflash's decision (own indexer keys per source)
  int64_t prefill_tokens = 0;       // first forward call
  std::vector<int32_t> prompt;      // [S]
  std::vector<int32_t> generated;   // [T+1]
  std::vector<float> logits;        // [S+T, V]
  int64_t vocab = 0;
  int64_t rows() const { return static_cast<int64_t>(logits.size()) / vocab; }
  int64_t decode_steps() const { return static_cast<int64_t>(generated.size()) - 1; }
  // Rows that must match: all of them for index_k_fix; the prefill call's rows for the official variant
  // (its single-token steps read a stale KV source's indexer keys, which dsflash deliberately does not).
  int64_t comparable_rows() const { return index_k_fix ? rows() : prefill_tokens; }
};

inline std::vector<std::string> golden_scenarios(const std::string& model) {
  std::ifstream in(goldens_dir() + "/" + model + "/manifest.json");
  const auto manifest = nlohmann::json::parse(in);
  std::vector<std::string> names;
  for (const auto& [name, _] : manifest["scenarios"].items()) names.push_back(name);
  return names;
}

inline GoldenScenario load_scenario(const std::string& model, const std::string& name) {
  GoldenScenario s;
  s.model = model;
  s.name = name;
  std::ifstream in(goldens_dir() + "/" + model + "/manifest.json");
  const auto manifest = nlohmann::json::parse(in);
  const auto& info = manifest["scenarios"][name];
  s.index_k_fix = info["variant"] == "index_k_fix";
  s.prefill_tokens = info["prefill_tokens"];
  auto file = SafetensorsFile::open(golden_output_path(model, name));
  if (!file.ok()) return s;
  for (int64_t id : to_i64(file->find("prompt_ids"))) s.prompt.push_back(static_cast<int32_t>(id));
  for (int64_t id : to_i64(file->find("generated_ids"))) s.generated.push_back(static_cast<int32_t>(id));
  s.logits = to_f32(file->find("logits"));
  s.vocab = file->find("logits")->dim(1);
  return s;
}

struct ScenarioRun {
  std::vector<float> logits;       // [S+T, V]
  std::vector<int32_t> generated;  // [T+1] argmax after the last prompt row and after every decode step
};

// follow: feed the golden ids at the decode steps (teacher forcing); otherwise our own greedy ids.
inline Result<ScenarioRun> run_scenario(const ModelRunner& runner, const GoldenScenario& s, bool follow) {
  auto seq = runner.new_sequence();
  if (!seq.ok()) return seq.status();
  ScenarioRun run;
  std::vector<float> rows;
  std::vector<int32_t> first(s.prompt.begin(), s.prompt.begin() + s.prefill_tokens);
  Status st = runner.forward(first, *seq, LogitsRows::kAll, &rows);
  if (!st.ok()) return st;
  run.logits = rows;
  for (size_t i = static_cast<size_t>(s.prefill_tokens); i < s.prompt.size(); ++i) {
    st = runner.forward({s.prompt[i]}, *seq, LogitsRows::kLast, &rows);
    if (!st.ok()) return st;
    run.logits.insert(run.logits.end(), rows.begin(), rows.end());
  }
  run.generated.push_back(argmax(run.logits.data() + (static_cast<int64_t>(s.prompt.size()) - 1) * s.vocab, s.vocab));
  for (int64_t t = 0; t < s.decode_steps(); ++t) {
    const int32_t input = follow ? s.generated[static_cast<size_t>(t)] : run.generated.back();
    st = runner.forward({input}, *seq, LogitsRows::kLast, &rows);
    if (!st.ok()) return st;
    run.logits.insert(run.logits.end(), rows.begin(), rows.end());
    run.generated.push_back(argmax(rows.data(), s.vocab));
  }
  return run;
}

struct RowStats {
  int64_t rows = 0, bit_exact_rows = 0, top1_agree = 0;
  float max_abs = 0.0f, max_rel = 0.0f;  // rel: |d| / (max - min) of the golden row
  float min_margin_at_flip = INFINITY;   // golden top1-top2 gap at rows whose argmax differs
};

inline float top2_margin(const float* row, int64_t n) {
  float a = -INFINITY, b = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    if (row[i] > a) {
      b = a;
      a = row[i];
    } else if (row[i] > b) {
      b = row[i];
    }
  }
  return a - b;
}

inline RowStats compare_rows(const GoldenScenario& s, const std::vector<float>& mine, int64_t num_rows) {
  RowStats st;
  for (int64_t r = 0; r < num_rows; ++r) {
    const float* g = s.logits.data() + r * s.vocab;
    const float* m = mine.data() + r * s.vocab;
    float lo = INFINITY, hi = -INFINITY, worst = 0.0f;
    bool exact = true;
    for (int64_t i = 0; i < s.vocab; ++i) {
      lo = std::min(lo, g[i]);
      hi = std::max(hi, g[i]);
      worst = std::max(worst, std::fabs(g[i] - m[i]));
      exact = exact && g[i] == m[i];
    }
    ++st.rows;
    st.bit_exact_rows += exact;
    st.max_abs = std::max(st.max_abs, worst);
    st.max_rel = std::max(st.max_rel, worst / (hi - lo));
    if (argmax(g, s.vocab) == argmax(m, s.vocab)) {
      ++st.top1_agree;
    } else {
      st.min_margin_at_flip = std::min(st.min_margin_at_flip, top2_margin(g, s.vocab));
    }
  }
  return st;
}

}  // namespace dsflash::testing
