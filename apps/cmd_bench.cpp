// `dsflash bench -m DIR`: end-to-end speed and memory figures in the style of llama-bench
// (| model | size | params | test | t/s |, mean ± sd over repetitions), measured side by side in one run:
//   ppN default / exact   prefill tokens/s of an N-token prompt with the CED bounded-replay plan and the official
//                         full forward, and their cost ratio (default time / exact time, same prompt);
//   tgN bB @ dD           decode tokens/s of B sequences decoding together at context depth D (B * N / time);
//   global KV             bytes per token actually allocated (kv pages) for the longest prompt, and what reserving
//                         a --reserve-context context allocates;
//   decode step @ D       one batch-1 decode step at depth D split into the context-free part (matmuls, MoE, norms,
//                         head: the step at the window depth) and the context-dependent part (the rest), and by
//                         phase as timed inside the step (StepProfile, model/compute_context.h): indexer scoring +
//                         top-k (+ candidate pool), sparse attention (row gathers + kernel), linear layers (every
//                         matmul, with its activation quantisation), other (norms, mHC, rope, routing, Engram,
//                         compressor arithmetic);
//   peak RSS              getrusage maximum resident set.
// Prefill fairness: both plans get the same prompt in the same chunks and compute logits only for the last prompt
// position (LogitsRows::kLast: what generation needs), so the ratio compares the layer work alone.
// --json prints the same figures as one JSON object. Timing is wall clock; a benchmark is not a test.
#include <CLI/CLI.hpp>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "io/model_stats.h"
#include "kv/kv_cache.h"
#include "engine/batch_builder.h"
#include "model/model_runner.h"

namespace dsflash::cli {
namespace {

struct BenchOptions {
  std::string model_dir;
  std::vector<int64_t> prompt_lengths{512, 4096};
  int64_t decode_tokens = 16;
  std::vector<int64_t> batches{1, 4, 16};
  std::vector<int64_t> depths;  // default: the smallest prompt length
  std::vector<int64_t> breakdown_depths{1024, 8192, 32768};
  int64_t chunk = 2048;
  int repetitions = 3;
  int threads = 0;
  int64_t reserve_context = 1048576;
  bool json = false;
};

struct Sample {
  double mean = 0, sd = 0;
};

Sample summarize(const std::vector<double>& v) {
  Sample s;
  if (v.empty()) return s;
  for (double x : v) s.mean += x;
  s.mean /= static_cast<double>(v.size());
  if (v.size() > 1) {
    double acc = 0;
    for (double x : v) acc += (x - s.mean) * (x - s.mean);
    s.sd = std::sqrt(acc / static_cast<double>(v.size() - 1));
  }
  return s;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int64_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux: kilobytes
}

std::vector<int32_t> random_prompt(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(3, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& t : ids) t = id(rng);
  return ids;
}

class Bench {
 public:
  Bench(const ModelRunner& runner, const BenchOptions& options, kv::KvCacheManager& kv)
      : runner_(runner), options_(options), kv_(kv) {}

  // A fresh sequence whose global KV lives in pages of the manager (reserving `positions`).
  Result<std::pair<SequenceState, kv::SequencePages*>> sequence(int64_t positions) {
    auto seq = runner_.new_sequence();
    if (!seq.ok()) return seq.status();
    auto pages = kv_.open(positions);
    if (!pages.ok()) return pages.status();
    Status s = seq->attention().attach_pages(*pages);
    if (!s.ok()) return s;
    return std::make_pair(std::move(*seq), *pages);
  }

  // Prefill time of `prompt` in `mode`; the global KV bytes the sequence ended up holding.
  Result<double> prefill(const std::vector<int32_t>& prompt, engine::PrefillMode mode, int64_t* global_bytes) {
    const int64_t n = static_cast<int64_t>(prompt.size());
    auto made = sequence(0);  // pages grow as the prompt is processed: the allocation is what the prompt needs
    if (!made.ok()) return made.status();
    auto& [seq, pages] = *made;
    engine::PrefillOptions po;
    po.mode = mode;
    ForwardOutput out;
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t done = 0; done < n;) {
      const int64_t c = std::min(options_.chunk, n - done);
      Status s = prefill_chunk(prompt.data() + done, c, n, seq, po, &out);
      if (!s.ok()) return s;
      done += c;
    }
    const double t = seconds_since(t0);
    if (global_bytes != nullptr) *global_bytes = pages->global_bytes();
    Status s = kv_.release(pages);
    if (!s.ok()) return s;
    return t;
  }

  // A prefilled (default plan) state at `depth` positions, kept to clone decode batches from.
  Status prepare_depth(int64_t depth) {
    if (depth < 1) return Status::Error("decode depth " + std::to_string(depth) + " must be >= 1");
    base_ = std::nullopt;
    auto seq = runner_.new_sequence();
    if (!seq.ok()) return seq.status();
    const std::vector<int32_t> prompt = random_prompt(depth, runner_.config().vocab_size, 7);
    ForwardOutput out;
    for (int64_t done = 0; done < depth;) {
      const int64_t c = std::min(options_.chunk, depth - done);
      Status s = prefill_chunk(prompt.data() + done, c, depth, *seq, engine::PrefillOptions(), &out);
      if (!s.ok()) return s;
      done += c;
    }
    base_token_ = argmax(out.logits.data(), runner_.config().vocab_size);
    base_floor_ = engine::replay_start(runner_.config(), engine::PrefillOptions(), depth);
    base_ = std::move(*seq);
    return Status::Ok();
  }

  // Seconds for `steps` decode steps of `batch` copies of the prepared state (each copy in its own pages).
  // profile: when not null, the steps' time by phase is added to it.
  Result<double> decode(int64_t batch, int64_t steps, StepProfile* profile = nullptr) {
    std::vector<SequenceState> states;
    std::vector<kv::SequencePages*> pages;
    for (int64_t b = 0; b < batch; ++b) {
      states.push_back(*base_);
      auto p = kv_.open(base_->num_positions() + steps);
      if (!p.ok()) return p.status();
      pages.push_back(*p);
      Status s = states.back().attention().attach_pages(*p);
      if (!s.ok()) return s;
    }
    std::vector<SequenceState*> seqs;
    for (auto& s : states) seqs.push_back(&s);
    std::vector<int32_t> tokens(static_cast<size_t>(batch), base_token_);
    const std::vector<int64_t> floors(static_cast<size_t>(batch), base_floor_);
    const int64_t vocab = runner_.config().vocab_size;
    ComputeContext ctx = runner_.context();
    ForwardBatch step;
    ForwardOutput out;
    StepProfile step_profile;
    ctx.profile = profile != nullptr ? &step_profile : nullptr;
    const auto t0 = std::chrono::steady_clock::now();
    step_profile.reset();
    for (int64_t i = 0; i < steps; ++i) {
      step.clear();
      for (int64_t b = 0; b < batch; ++b) {
        engine::add_decode_row(step, *seqs[static_cast<size_t>(b)], tokens[static_cast<size_t>(b)], floors[static_cast<size_t>(b)]);
      }
      Status s = engine::run_batch(runner_.weights(), step, ctx, &out);
      if (!s.ok()) return s;
      for (int64_t b = 0; b < batch; ++b) tokens[static_cast<size_t>(b)] = argmax(out.logits.data() + b * vocab, vocab);
    }
    const double t = seconds_since(t0);
    if (profile != nullptr) {
      step_profile.flush();
      for (int p = 0; p < kNumProfilePhases; ++p) profile->ns[p] += step_profile.ns[p];
    }
    for (auto* p : pages) {
      Status s = kv_.release(p);
      if (!s.ok()) return s;
    }
    return t;
  }

 private:
  // One prefill chunk (logits of the prompt's last row when this chunk holds it).
  Status prefill_chunk(const int32_t* tokens, int64_t num_tokens, int64_t prompt_length, SequenceState& seq,
                       const engine::PrefillOptions& options, ForwardOutput* out) {
    ForwardBatch batch;
    Status s = engine::add_prefill_chunk(batch, runner_.config(), seq, tokens, num_tokens, prompt_length, options,
                                         LogitsRows::kLast);
    if (!s.ok()) return s;
    return engine::run_batch(runner_.weights(), batch, runner_.context(), out);
  }

  const ModelRunner& runner_;
  const BenchOptions& options_;
  kv::KvCacheManager& kv_;
  std::optional<SequenceState> base_;
  int32_t base_token_ = 0;
  int64_t base_floor_ = 0;
};

std::string fmt(const Sample& s, int precision = 2) {
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%.*f ± %.*f", precision, s.mean, precision, s.sd);
  return buf;
}

int run_bench(const BenchOptions& o) {
  RunnerOptions ro;
  ro.num_threads = o.threads;
  auto runner = ModelRunner::open(o.model_dir, ro);
  if (!runner.ok()) {
    std::cerr << "dsflash bench: " << runner.status().message() << "\n";
    return 1;
  }
  const ModelConfig& config = (*runner)->config();
  auto layout = kv::KvLayout::from_config(config, 64);
  if (!layout.ok()) {
    std::cerr << "dsflash bench: " << layout.status().message() << "\n";
    return 1;
  }
  // The cache budget: generous (pages are only backed when written).
  auto manager = kv::KvCacheManager::create(*layout, int64_t{64} << 30);
  if (!manager.ok()) {
    std::cerr << "dsflash bench: " << manager.status().message() << "\n";
    return 1;
  }
  int64_t size_bytes = 0;
  for (const auto& entry : std::filesystem::directory_iterator(o.model_dir)) {
    if (entry.path().extension() == ".safetensors") size_bytes += static_cast<int64_t>(entry.file_size());
  }
  const ParameterCounts params = count_parameters(config);
  const std::string model_name = std::filesystem::path(o.model_dir).filename().string().empty()
                                     ? std::filesystem::path(o.model_dir).parent_path().filename().string()
                                     : std::filesystem::path(o.model_dir).filename().string();
  char size_text[32], params_text[32];
  std::snprintf(size_text, sizeof(size_text), "%.2f GiB", static_cast<double>(size_bytes) / (1 << 30));
  std::snprintf(params_text, sizeof(params_text), "%.2f B", static_cast<double>(params.total) / 1e9);

  Bench bench(**runner, o, **manager);
  nlohmann::json j;
  j["model"] = model_name;
  j["size_bytes"] = size_bytes;
  j["params"] = params.total;
  j["repetitions"] = o.repetitions;
  j["threads"] = o.threads;
  std::vector<std::array<std::string, 2>> rows;  // test, t/s
  auto fail = [](const Status& s) {
    std::cerr << "dsflash bench: " << s.message() << "\n";
    return 1;
  };

  // Prefill, default and exact, side by side per repetition (same prompt).
  int64_t kv_bytes_longest = 0, kv_positions_longest = 0;
  for (int64_t n : o.prompt_lengths) {
    const std::vector<int32_t> prompt = random_prompt(n, config.vocab_size, static_cast<uint32_t>(n));
    std::vector<double> tps_default, tps_exact, ratio;
    for (int r = 0; r < o.repetitions; ++r) {
      int64_t global_bytes = 0;
      auto td = bench.prefill(prompt, engine::PrefillMode::kBoundedReplay, &global_bytes);
      if (!td.ok()) return fail(td.status());
      auto te = bench.prefill(prompt, engine::PrefillMode::kExact, nullptr);
      if (!te.ok()) return fail(te.status());
      tps_default.push_back(static_cast<double>(n) / *td);
      tps_exact.push_back(static_cast<double>(n) / *te);
      ratio.push_back(*td / *te);
      if (n >= kv_positions_longest) {
        kv_positions_longest = n;
        kv_bytes_longest = global_bytes;
      }
    }
    const Sample d = summarize(tps_default), e = summarize(tps_exact), q = summarize(ratio);
    rows.push_back({"pp" + std::to_string(n) + " default", fmt(d)});
    rows.push_back({"pp" + std::to_string(n) + " exact", fmt(e)});
    rows.push_back({"pp" + std::to_string(n) + " cost default/exact", fmt(q, 3)});
    j["prefill"][std::to_string(n)] = {{"tps_default", d.mean}, {"tps_default_sd", d.sd}, {"tps_exact", e.mean},
                                       {"tps_exact_sd", e.sd}, {"cost_ratio", q.mean}, {"cost_ratio_sd", q.sd}};
    // The top-level keys describe the longest prompt.
    j["prefill_tokens"] = n;
    j["prefill_tps_default"] = d.mean;
    j["prefill_tps_exact"] = e.mean;
    j["prefill_cost_ratio"] = q.mean;
  }

  // Decode at each depth and batch.
  std::vector<int64_t> depths = o.depths;
  if (depths.empty() && !o.prompt_lengths.empty()) {
    depths.push_back(*std::min_element(o.prompt_lengths.begin(), o.prompt_lengths.end()));
  }
  for (int64_t depth : depths) {
    Status s = bench.prepare_depth(depth);
    if (!s.ok()) return fail(s);
    for (int64_t batch : o.batches) {
      std::vector<double> tps;
      for (int r = 0; r < o.repetitions; ++r) {
        auto t = bench.decode(batch, o.decode_tokens);
        if (!t.ok()) return fail(t.status());
        tps.push_back(static_cast<double>(batch * o.decode_tokens) / *t);
      }
      const Sample d = summarize(tps);
      rows.push_back({"tg" + std::to_string(o.decode_tokens) + " b" + std::to_string(batch) + " @ d" +
                          std::to_string(depth),
                      fmt(d)});
      j["decode"][std::to_string(depth)][std::to_string(batch)] = {{"tps", d.mean}, {"tps_sd", d.sd}};
      if (depth == depths.front()) j["decode_tps_batch" + std::to_string(batch)] = d.mean;
    }
  }
  if (!depths.empty()) j["decode_depth"] = depths.front();

  // One batch-1 decode step at each breakdown depth; the smallest depth is the context-free reference.
  std::vector<int64_t> bd;
  for (int64_t depth : o.breakdown_depths) {
    if (depth > 0) bd.push_back(depth);  // 0: none
  }
  std::sort(bd.begin(), bd.end());
  double base_step = 0;
  const int64_t reference_depth = std::max<int64_t>(1, config.window_size);
  if (!bd.empty()) {
    Status s = bench.prepare_depth(reference_depth);
    if (!s.ok()) return fail(s);
    std::vector<double> steps;
    for (int r = 0; r < std::max(3, o.repetitions); ++r) {
      auto t = bench.decode(1, 1);
      if (!t.ok()) return fail(t.status());
      steps.push_back(*t);
    }
    base_step = summarize(steps).mean;
    j["decode_step_breakdown"]["reference_depth"] = reference_depth;
    j["decode_step_breakdown"]["reference_step_ms"] = base_step * 1e3;
  }
  for (int64_t depth : bd) {
    Status s = bench.prepare_depth(depth);
    if (!s.ok()) return fail(s);
    std::vector<double> steps;
    StepProfile profile;
    const int reps = std::max(3, o.repetitions);
    for (int r = 0; r < reps; ++r) {
      auto t = bench.decode(1, 1, &profile);
      if (!t.ok()) return fail(t.status());
      steps.push_back(*t);
    }
    const Sample step = summarize(steps);
    const double context = std::max(0.0, step.mean - base_step);
    // Mean ms per step of each phase.
    auto phase_ms = [&](ProfilePhase p) { return static_cast<double>(profile.ns[static_cast<int>(p)]) * 1e-6 / reps; };
    const double indexer = phase_ms(ProfilePhase::kIndexer), attention = phase_ms(ProfilePhase::kAttention),
                 linear = phase_ms(ProfilePhase::kLinear), other = phase_ms(ProfilePhase::kOther);
    char text[320];
    std::snprintf(text, sizeof(text),
                  "%.2f ms = %.2f context-free + %.2f context; by phase: indexer %.2f, attention %.2f, linear %.2f, "
                  "other %.2f",
                  step.mean * 1e3, std::min(base_step, step.mean) * 1e3, context * 1e3, indexer, attention, linear,
                  other);
    rows.push_back({"decode step @ d" + std::to_string(depth), text});
    j["decode_step_breakdown"][std::to_string(depth)] = {
        {"step_ms", step.mean * 1e3},  {"step_ms_sd", step.sd * 1e3},
        {"context_free_ms", std::min(base_step, step.mean) * 1e3}, {"context_ms", context * 1e3},
        {"indexer_ms", indexer},       {"attention_ms", attention},
        {"linear_ms", linear},         {"other_ms", other}};
  }

  // Global KV actually allocated, and what reserving a long context allocates (pages are not touched).
  const double kv_per_token =
      kv_positions_longest > 0 ? static_cast<double>(kv_bytes_longest) / static_cast<double>(kv_positions_longest) : 0;
  j["global_kv_bytes_per_token_allocated"] = kv_per_token;
  j["global_kv_bytes_per_token_formula"] = layout->global_bytes_per_token();
  j["kv_block_tokens"] = layout->block_tokens;
  {
    auto reserve = kv::KvCacheManager::create(*layout, int64_t{64} << 30);
    if (!reserve.ok()) return fail(reserve.status());
    auto pages = (*reserve)->open(o.reserve_context);
    if (!pages.ok()) return fail(pages.status());
    j["reserve_context"] = o.reserve_context;
    j["reserve_global_kv_bytes"] = (*pages)->global_bytes();
    char text[96];
    std::snprintf(text, sizeof(text), "%.4f GB (%lld B)", static_cast<double>((*pages)->global_bytes()) / 1e9,
                  static_cast<long long>((*pages)->global_bytes()));
    rows.push_back({"global KV reserved @ " + std::to_string(o.reserve_context), text});
    (void)(*reserve)->release(*pages);
  }
  {
    char text[96];
    std::snprintf(text, sizeof(text), "%.1f B/token (formula %.1f; %lld positions, %lld-token blocks)", kv_per_token,
                  layout->global_bytes_per_token(), static_cast<long long>(kv_positions_longest),
                  static_cast<long long>(layout->block_tokens));
    rows.push_back({"global KV allocated", text});
  }
  const int64_t rss = peak_rss_bytes();
  j["peak_rss_bytes"] = rss;
  rows.push_back({"peak RSS", std::to_string(rss / (1 << 20)) + " MiB"});

  if (o.json) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("| model | size | params | test | t/s |\n| --- | ---: | ---: | --- | ---: |\n");
  for (const auto& [test, value] : rows) {
    std::printf("| %s | %s | %s | %s | %s |\n", model_name.c_str(), size_text, params_text, test.c_str(),
                value.c_str());
  }
  return 0;
}

}  // namespace

void add_bench_command(CLI::App& app, int* exit_code) {
  auto options = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand("bench", "prefill (default CED plan vs --exact) and batched decode speed, KV bytes, RSS");
  cmd->add_option("-m,--model", options->model_dir, "checkpoint directory")->required();
  cmd->add_option("-p,--prompt", options->prompt_lengths, "prompt lengths (tokens), comma separated")
      ->delimiter(',');
  cmd->add_option("-n,--decode", options->decode_tokens, "decode steps per measurement");
  cmd->add_option("--batch", options->batches, "decode batch sizes, comma separated")->delimiter(',');
  cmd->add_option("--depth", options->depths, "decode context depths (default: the smallest prompt)")->delimiter(',');
  cmd->add_option("--breakdown", options->breakdown_depths, "decode-step breakdown depths (0: none)")
      ->delimiter(',');
  cmd->add_option("--chunk", options->chunk, "prefill chunk (tokens)");
  cmd->add_option("-r,--repetitions", options->repetitions, "repetitions per figure");
  cmd->add_option("-t,--threads", options->threads, "worker threads (0: one per hardware thread)");
  cmd->add_option("--reserve-context", options->reserve_context, "context whose global-KV reservation is reported");
  cmd->add_flag("--json", options->json, "one JSON object instead of the table");
  cmd->callback([options, exit_code]() {
    if (options->repetitions < 1 || options->decode_tokens < 1 || options->chunk < 1) {
      std::cerr << "dsflash bench: -r, -n and --chunk must be >= 1\n";
      *exit_code = 2;
      return;
    }
    for (int64_t v : options->prompt_lengths) {
      if (v < 1) {
        std::cerr << "dsflash bench: prompt lengths must be >= 1\n";
        *exit_code = 2;
        return;
      }
    }
    for (int64_t v : options->batches) {
      if (v < 1) {
        std::cerr << "dsflash bench: batch sizes must be >= 1\n";
        *exit_code = 2;
        return;
      }
    }
    *exit_code = run_bench(*options);
  });
}

}  // namespace dsflash::cli
