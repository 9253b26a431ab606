// `dsflash bench -m DIR`: end-to-end speed and memory figures in the style of llama-bench
// (| model | size | params | kernels | test | t/s |, mean ± sd over repetitions), measured side by side in one run:
//   ppN default / exact   prefill tokens/s of an N-token prompt with the CED bounded-replay plan and the official
//                         full forward, and their cost ratio (default time / exact time, same prompt); with
//                         --no-exact the default plan's only (a 4K-token exact prefill takes minutes);
//   tgN bB @ dD           decode tokens/s of B sequences decoding together at context depth D (B * N / time), D the
//                         smallest --depth;
//   tg bB / roofline      those steps against their roofline, max(weight bytes touched / read bandwidth, matmul
//                         FLOPs / dot peak), both limits measured in this run (decode_roofline_fraction_batchB),
//                         and the steps by phase (as for "decode step @ D" below); where the kernel table
//                         multiplies with another instruction than the bf16 dot (fp32 FMAs, AMX), also against the
//                         roofline with the bf16-dot peak (decode_bf16_dot_roofline_fraction_batchB); where the
//                         table runs MXFP4 GEMMs of that many rows on AMX tiles (ModelInfo::fp4_amx_min_rows), their
//                         FLOPs count at the tile unit's peak, measured too (compute_bound; so for ppN);
//   global KV             bytes per token the engine reserved (kv pages, whole blocks) for the longest prompt
//                         (prompt + the one generated id), and what reserving a --reserve-context context allocates;
//   decode step @ D       one batch-1 decode step at each --depth D (decode_step_ms_by_depth in --json), its ratio
//                         to the step at the smallest depth, split into the context-free part (matmuls, MoE, norms,
//                         head: the step at the window depth) and the context-dependent part (the rest), and by
//                         phase as timed inside the step (StepRecord::phase_ns, include/dsflash/engine.h): indexer scoring +
//                         top-k (+ candidate pool), sparse attention (row gathers + kernel), linear layers (every
//                         matmul, with its activation quantisation), other (norms, mHC, rope, routing, Engram,
//                         compressor arithmetic);
//   peak RSS              getrusage maximum resident set, and the tile-major weight copies in it
//                         (ModelInfo::tile_major_bytes; the DSpark stages' only with --speculative); bench wall time:
//                         the whole run, load included, split into the sections that ran (wall_split_s: load,
//                         prefill, decode, depths, ...), which add up to it.
// Every decode figure runs over a synthetic context (GenerationRequest::bench_synthetic_context: the KV of the first
// depth - n - 3 positions is valid random state written at admission, kv/synthetic_context.h), so a million-token
// depth costs a fill of its KV, not its prefill; one prompt token is prefilled and the first decode step is a
// warm-up, not counted. The defaults (one pp512, tg8 x 2 repetitions, depths 1K/128K/1M) aim at under two minutes on
// the wide tiny preset.
// --speculative K measures only speculative decoding (DSpark drafts, include/dsflash/engine.h), batch 1 after a
// prompt of one window (the drafter needs real hidden states, so no synthetic context), each run over the same
// prompt: plain decode steps; steps that always verify K drafts (speculative_adaptive off): their cost relative to
// a plain step, and the speed-up that cost allows at the acceptance length reported for V4.1 (about 2.8 tokens per
// step on GSM8K: min(2.8, K + 1) / cost); and the adaptive policy's decode tokens/s against plain over
// --spec-tokens tokens (on a model whose drafts rarely match, e.g. random weights, the policy should switch itself
// off and stay within 10% of plain).
// --prefix-cache measures only time to first token per -p length N, cold vs a prefix-cache hit: cold = a fresh
// N-token prompt; hit = an N-token prompt whose first N - 64 tokens were stored by an earlier request (so the
// cache restores them and Encoder SWA Bounded Replay replays one window), both from submit to the first token
// on a loaded engine. Every other figure runs with the prefix cache off (repeated prompts must not hit it).
// Everything runs through the Engine (include/dsflash/engine.h): each figure is one or more requests, timed by the
// engine's step records (StepRecord: the wall time of each step and what it computed), so decode figures count
// only pure decode steps (no prefill in them). The step profile is on for the whole run (a clock read per phase
// change, negligible next to the matmuls).
// Prefill fairness: both plans get the same prompt in the same chunks (--chunk = prefill tokens per step) and
// compute logits only for the last prompt position (what generation needs), so the ratio compares the layer work
// (no untimed warm-up prefill: see the prefill section below); "ppN default / dot peak" also
// says which share of the default plan's time each phase took, and (another table instruction) the fraction of
// the bf16-dot peak (prefill_bf16_dot_peak_fraction).
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
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cli_checks.h"
#include "commands.h"
#include "dsflash/engine.h"

namespace dsflash::cli {
namespace {

struct BenchOptions {
  std::string model_dir;
  std::vector<int64_t> prompt_lengths{512};
  int64_t decode_tokens = 8;
  std::vector<int64_t> batches{1, 4, 16};
  std::vector<int64_t> depths{1024, 131072, 1048576};  // synthetic contexts; the smallest also runs the tg rows
  int64_t chunk = 2048;
  int repetitions = 2;
  int threads = 0;
  std::string backend;
  bool mlock = false;
  bool pin_threads = false;
  int64_t reserve_context = 1048576;
  bool json = false;
  bool prefix_cache = false;  // only the prefix-cache TTFT figures
  bool exact = true;          // the exact plan's prefill rows too (--no-exact: the default plan's only)
  int speculative = 0;        // > 0: only the speculative-decoding figures, with this many drafts
  int64_t spec_tokens = 96;   // decode tokens per speculative run
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

// Runs measurement requests on the engine and reads back its step records. One caller thread: every step the
// engine runs between two take_step_records() calls belongs to the requests submitted here.
EngineError bench_error(const std::string& message) { return EngineError{ErrorCode::kInternal, message}; }

class Bench {
 public:
  explicit Bench(Engine& engine) : engine_(engine) {}

  // Seconds from submit to the first token of `prompt` (default plan), and the prompt tokens the cache restored.
  Expected<double> time_to_first_token(const std::vector<int32_t>& prompt, int64_t max_tokens, int64_t* cached) {
    GenerationRequest request;
    request.prompt_ids = prompt;
    request.max_tokens = max_tokens;
    request.stop_at_eos = false;
    request.detokenize = false;
    auto done = engine_.generate(std::move(request));
    if (!done.ok()) return done.error();
    if (cached != nullptr) *cached = done->usage.cached_tokens;
    return done->first_token_s;
  }

  // Prefill seconds of `prompt` in `plan` (the sum of the request's steps); the global KV bytes it held, and the
  // seconds by phase (StepRecord::phase_ns order) added to `phase_s` when given.
  Expected<double> prefill(const std::vector<int32_t>& prompt, Plan plan, int64_t* global_bytes,
                           double* phase_s = nullptr) {
    (void)engine_.take_step_records();
    GenerationRequest request;
    request.prompt_ids = prompt;
    request.max_tokens = 1;
    request.stop_at_eos = false;
    request.detokenize = false;
    request.plan = plan;
    auto done = engine_.generate(std::move(request));
    if (!done.ok()) return done.error();
    if (global_bytes != nullptr) *global_bytes = done->global_kv_bytes;
    double t = 0;
    for (const StepRecord& step : engine_.take_step_records()) {
      t += step.seconds;
      for (int p = 0; p < 4 && phase_s != nullptr; ++p) phase_s[p] += static_cast<double>(step.phase_ns[p]) * 1e-9;
    }
    return t;
  }

  // The pure decode steps (no prefill in the step) of `batch` requests at context depth `depth`, after one warm-up
  // step: each request's first depth - steps - 3 positions are a synthetic context
  // (GenerationRequest::bench_synthetic_context: valid random KV, nothing prefilled), then one prompt token is
  // prefilled and `steps` + 1 tokens decoded, so the measured steps attend to depth - steps .. depth - 1 positions.
  // Returns the steps whose decode batch is the whole batch, oldest first, the warm-up dropped.
  Expected<std::vector<StepRecord>> decode_steps(int64_t depth, int64_t batch, int64_t steps) {
    if (depth < 1) return bench_error("decode depth " + std::to_string(depth) + " must be >= 1");
    (void)engine_.take_step_records();
    std::vector<GenerationRequest> requests(static_cast<size_t>(batch));
    for (size_t b = 0; b < requests.size(); ++b) {
      GenerationRequest& request = requests[b];
      request.prompt_ids = random_prompt(1, engine_.info().vocab_size, static_cast<uint32_t>(7 + b));
      request.bench_synthetic_context = std::max<int64_t>(0, depth - steps - 3);
      request.max_tokens = steps + 2;
      request.stop_at_eos = false;
      request.detokenize = false;
    }
    // Queued at once, so every step after the shared prefill decodes the whole batch (submitted one by one, the
    // loop could start the first requests' decode before the last arrived, leaving no step of the full batch).
    auto handles = engine_.submit_together(std::move(requests));
    if (!handles.ok()) return handles.error();
    for (RequestHandle& handle : *handles) {
      while (auto event = handle.next()) {
        if (event->kind == EventKind::kFinished && event->error) return *event->error;
      }
    }
    std::vector<StepRecord> decode;
    for (const StepRecord& step : engine_.take_step_records()) {
      if (step.prefill_tokens == 0 && step.decode_batch == batch) decode.push_back(step);
    }
    if (!decode.empty()) decode.erase(decode.begin());  // warm-up
    if (static_cast<int64_t>(decode.size()) < steps) {
      return bench_error("only " + std::to_string(decode.size()) + " of " + std::to_string(steps) +
                         " measured decode steps ran the whole batch of " + std::to_string(batch) +
                         " (the KV budget did not hold the batch at depth " + std::to_string(depth) + "?)");
    }
    return decode;
  }

  // Batch-1 decode of `tokens` tokens after `prompt` with speculation k (0 = plain): the pure decode steps after
  // the first (a warm-up), and the tokens they emitted.
  Expected<std::vector<StepRecord>> speculative_steps(const std::vector<int32_t>& prompt, int64_t tokens, int k,
                                                      bool adaptive) {
    (void)engine_.take_step_records();
    GenerationRequest request;
    request.prompt_ids = prompt;
    request.max_tokens = tokens + 2;
    request.stop_at_eos = false;
    request.detokenize = false;
    request.speculative = k;
    request.speculative_adaptive = adaptive;
    auto done = engine_.generate(std::move(request));
    if (!done.ok()) return done.error();
    std::vector<StepRecord> decode;
    for (const StepRecord& step : engine_.take_step_records()) {
      if (step.prefill_tokens == 0 && step.decode_batch == 1) decode.push_back(step);
    }
    if (!decode.empty()) decode.erase(decode.begin());
    return decode;
  }

 private:
  Engine& engine_;
};

double total_seconds(const std::vector<StepRecord>& steps, size_t from, size_t count) {
  double t = 0;
  for (size_t i = from; i < from + count && i < steps.size(); ++i) t += steps[i].seconds;
  return t;
}

// A machine limit is probed right before and right after each measured run; the higher of the two counts, so the
// fraction against it errs low (on shared VMs the read bandwidth drifted by tens of percent within a minute).
const ComputePeak& higher(const ComputePeak& a, const ComputePeak& b) { return a.gflops >= b.gflops ? a : b; }
const ReadBandwidth& higher(const ReadBandwidth& a, const ReadBandwidth& b) { return a.gbps >= b.gbps ? a : b; }
std::optional<ComputePeak> higher(const std::optional<ComputePeak>& a, const std::optional<ComputePeak>& b) {
  if (!a || !b) return a ? a : b;
  return higher(*a, *b);
}

// The compute side of a limit: `flops` of matmuls at the table's GEMM peak, except `fp4_flops` of them (MXFP4) at
// the AMX tile unit's peak where the table runs them there (`tiles`: measured when the run's rows reach
// ModelInfo::fp4_amx_min_rows; counting every MXFP4 FLOP there errs low on the time, as a bound should).
struct ComputeBound {
  double seconds = 0.0;
  std::string text;  // "F GFLOP / P GFLOP/s" [" + M GFLOP (MXFP4) / T GFLOP/s on tiles"]
};
ComputeBound compute_bound(double flops, double fp4_flops, const ComputePeak& peak,
                           const std::optional<ComputePeak>& tiles) {
  char text[160];
  if (!tiles) {
    std::snprintf(text, sizeof(text), "%.1f GFLOP / %.1f GFLOP/s", flops * 1e-9, peak.gflops);
    return {flops / (peak.gflops * 1e9), text};
  }
  std::snprintf(text, sizeof(text), "%.1f GFLOP / %.1f GFLOP/s + %.1f GFLOP (MXFP4) / %.1f GFLOP/s on tiles",
                (flops - fp4_flops) * 1e-9, peak.gflops, fp4_flops * 1e-9, tiles->gflops);
  return {(flops - fp4_flops) / (peak.gflops * 1e9) + fp4_flops / (tiles->gflops * 1e9), text};
}

std::string fmt(const Sample& s, int precision = 2) {
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%.*f ± %.*f", precision, s.mean, precision, s.sd);
  return buf;
}

int run_bench(const BenchOptions& o) {
  const auto run_start = std::chrono::steady_clock::now();
  LoadOptions lo;
  lo.num_threads = o.threads;
  lo.backend = o.backend;
  lo.pin_threads = o.pin_threads;
  lo.lock_weights = o.mlock;
  lo.kv_budget_bytes = int64_t{64} << 30;  // generous (pages are only backed when written)
  lo.prefill_tokens_per_step = o.chunk;
  lo.max_running = static_cast<int>(std::max<int64_t>(1, *std::max_element(o.batches.begin(), o.batches.end())));
  lo.profile_steps = true;
  lo.prefix_cache = o.prefix_cache;
  lo.dspark = o.speculative > 0;
  auto engine = Engine::load(o.model_dir, lo);
  if (!engine.ok()) {
    std::cerr << "dsflash bench: " << engine.error().message << "\n";
    return 1;
  }
  const ModelInfo& info = (*engine)->info();
  // Where the run's wall time went (the "bench wall time" row, wall_split_s in --json): each lap() books the time
  // since the previous one to a section, so the sections add up to the wall time.
  std::vector<std::pair<std::string, double>> wall_split;
  auto lap_start = run_start;
  auto lap = [&](const char* section) {
    const auto now = std::chrono::steady_clock::now();
    wall_split.emplace_back(section, std::chrono::duration<double>(now - lap_start).count());
    lap_start = now;
  };
  lap("load");
  // The bf16-dot peak measured now, where the table's GEMMs multiply with another instruction (the figures'
  // second limit), else nothing (and nothing timed).
  auto bf16_dot_peak = [&](const ComputePeak& table) -> std::optional<ComputePeak> {
    if ((*engine)->compute_peak_kernel(ComputeUnit::kBf16Dot) == table.kernel) return std::nullopt;
    return (*engine)->measure_compute_peak(0.25, ComputeUnit::kBf16Dot);
  };
  const int64_t size_bytes = info.checkpoint_bytes;
  const std::string model_name = std::filesystem::path(o.model_dir).filename().string().empty()
                                     ? std::filesystem::path(o.model_dir).parent_path().filename().string()
                                     : std::filesystem::path(o.model_dir).filename().string();
  char size_text[32], params_text[32];
  std::snprintf(size_text, sizeof(size_text), "%.2f GiB", static_cast<double>(size_bytes) / (1 << 30));
  std::snprintf(params_text, sizeof(params_text), "%.2f B", static_cast<double>(info.parameters) / 1e9);

  Bench bench(**engine);
  nlohmann::json j;
  j["model"] = model_name;
  j["size_bytes"] = size_bytes;
  j["params"] = info.parameters;
  j["repetitions"] = o.repetitions;
  j["threads"] = o.threads;
  j["kernels"] = info.kernels;
  j["fp4_amx_min_rows"] = info.fp4_amx_min_rows;
  // The kernels column: the table, and whether it puts MXFP4 GEMMs of many rows on AMX tiles.
  const std::string kernels_text =
      info.fp4_amx_min_rows > 0 ? info.kernels + " (MXFP4 " + std::to_string(info.fp4_amx_min_rows) + "+ rows: amx)"
                                : info.kernels;
  std::vector<std::array<std::string, 2>> rows;  // test, t/s
  auto fail = [](const EngineError& e) {
    std::cerr << "dsflash bench: " << e.message << "\n";
    return 1;
  };

  // Speculative decoding: cost of verifying k drafts, the projection at V4.1's acceptance, adaptive vs plain.
  if (o.speculative > 0) {
    if (info.dspark_block_size == 0) return fail(bench_error("--speculative: the model has no DSpark stages"));
    const int k = std::min(o.speculative, info.dspark_block_size);
    const std::vector<int32_t> prompt =
        random_prompt(std::max<int64_t>(info.window_size, 16), info.vocab_size, 4242);
    std::vector<double> plain_ms, fixed_ms, cost, plain_tps, adaptive_tps, speed;
    int64_t drafted = 0, accepted = 0, adaptive_drafted = 0;
    auto tokens_per_s = [](const std::vector<StepRecord>& steps) {
      double t = 0, emitted = 0;
      for (const StepRecord& step : steps) {
        t += step.seconds;
        emitted += 1.0 + static_cast<double>(step.accepted_tokens);
      }
      return t > 0 ? emitted / t : 0.0;
    };
    // Mean step ms of the steps that verified `drafts` drafts, and its split by phase (phase_ns order).
    double phase_ms[2][4] = {};
    int64_t phase_steps[2] = {};
    auto mean_ms = [&](const std::vector<StepRecord>& steps, int64_t drafts) {
      std::vector<double> ms;
      const int which = drafts > 0 ? 1 : 0;
      for (const StepRecord& step : steps) {
        if (step.draft_tokens != drafts) continue;
        ms.push_back(step.seconds * 1e3);
        for (int p = 0; p < 4; ++p) phase_ms[which][p] += static_cast<double>(step.phase_ns[p]) * 1e-6;
        ++phase_steps[which];
      }
      return summarize(ms).mean;
    };
    auto phases = [&](int which) {
      char text[160];
      const double n = static_cast<double>(std::max<int64_t>(1, phase_steps[which]));
      std::snprintf(text, sizeof(text), " (linear %.1f, indexer %.1f, attention %.1f, other %.1f)",
                    phase_ms[which][1] / n, phase_ms[which][2] / n, phase_ms[which][3] / n, phase_ms[which][0] / n);
      return std::string(text);
    };
    for (int r = 0; r < o.repetitions; ++r) {
      auto plain = bench.speculative_steps(prompt, o.decode_tokens, 0, true);
      if (!plain.ok()) return fail(plain.error());
      auto fixed = bench.speculative_steps(prompt, o.decode_tokens, k, false);
      if (!fixed.ok()) return fail(fixed.error());
      plain_ms.push_back(mean_ms(*plain, 0));
      fixed_ms.push_back(mean_ms(*fixed, k));
      cost.push_back(fixed_ms.back() / plain_ms.back());
      for (const StepRecord& step : *fixed) {
        drafted += step.draft_tokens;
        accepted += step.accepted_tokens;
      }
      auto long_plain = bench.speculative_steps(prompt, o.spec_tokens, 0, true);
      if (!long_plain.ok()) return fail(long_plain.error());
      auto adaptive = bench.speculative_steps(prompt, o.spec_tokens, k, true);
      if (!adaptive.ok()) return fail(adaptive.error());
      plain_tps.push_back(tokens_per_s(*long_plain));
      adaptive_tps.push_back(tokens_per_s(*adaptive));
      speed.push_back(adaptive_tps.back() / plain_tps.back());
      for (const StepRecord& step : *adaptive) adaptive_drafted += step.draft_tokens;
    }
    const double accept_len = 2.8;  // V4.1's reported mean tokens per step with DSpark (GSM8K)
    const Sample pm = summarize(plain_ms), fm = summarize(fixed_ms), c = summarize(cost);
    const Sample pt = summarize(plain_tps), at = summarize(adaptive_tps), q = summarize(speed);
    const double projected = std::min(accept_len, static_cast<double>(k + 1)) / c.mean;
    const std::string kk = std::to_string(k);
    rows.push_back({"decode step plain (ms)", fmt(pm) + phases(0)});
    rows.push_back({"decode step verifying " + kk + " drafts (ms)", fmt(fm) + phases(1)});
    rows.push_back({"verify " + std::to_string(k + 1) + " rows / plain step", fmt(c, 3)});
    char text[160];
    std::snprintf(text, sizeof(text), "x%.2f (min(%.1f, %d) / %.3f)", projected, accept_len, k + 1, c.mean);
    rows.push_back({"projected speed-up at 2.8 tokens/step", text});
    std::snprintf(text, sizeof(text), "%lld of %lld drafts (%.1f%%)", static_cast<long long>(accepted),
                  static_cast<long long>(drafted), drafted > 0 ? 100.0 * accepted / drafted : 0.0);
    rows.push_back({"accepted here (fixed k)", text});
    rows.push_back({"tg" + std::to_string(o.spec_tokens) + " plain", fmt(pt)});
    rows.push_back({"tg" + std::to_string(o.spec_tokens) + " speculative " + kk + " adaptive", fmt(at)});
    rows.push_back({"adaptive / plain speed", fmt(q, 3)});
    j["speculative"] = {{"k", k},
                        {"plain_step_ms", pm.mean},
                        {"verify_step_ms", fm.mean},
                        {"verify_cost_ratio", c.mean},
                        {"verify_cost_ratio_sd", c.sd},
                        {"projected_speedup_at_2_8", projected},
                        {"fixed_drafted", drafted},
                        {"fixed_accepted", accepted},
                        {"plain_tps", pt.mean},
                        {"adaptive_tps", at.mean},
                        {"adaptive_over_plain", q.mean},
                        {"adaptive_over_plain_sd", q.sd},
                        {"adaptive_drafted", adaptive_drafted}};
  }
  const bool only_speculative = o.speculative > 0;
  if (only_speculative) lap("speculative");

  // Prefix cache: time to first token cold vs hit.
  for (int64_t n : o.prefix_cache ? o.prompt_lengths : std::vector<int64_t>{}) {
    std::vector<double> cold, hit, ratio;
    int64_t cached = 0;
    for (int r = 0; r < o.repetitions; ++r) {
      const uint32_t seed = static_cast<uint32_t>(1000 * n + 2 * r);
      auto t_cold = bench.time_to_first_token(random_prompt(n, info.vocab_size, seed), 1, nullptr);
      if (!t_cold.ok()) return fail(t_cold.error());
      // An earlier request writes the first n - 64 tokens (+1, so their blocks are whole), then the hit.
      std::vector<int32_t> prompt = random_prompt(n, info.vocab_size, seed + 1);
      const int64_t stored = std::max<int64_t>(0, n - 64);
      auto t_store = bench.time_to_first_token(std::vector<int32_t>(prompt.begin(), prompt.begin() + stored + 1), 1,
                                               nullptr);
      if (!t_store.ok()) return fail(t_store.error());
      auto t_hit = bench.time_to_first_token(prompt, 1, &cached);
      if (!t_hit.ok()) return fail(t_hit.error());
      cold.push_back(*t_cold);
      hit.push_back(*t_hit);
      ratio.push_back(*t_hit / *t_cold);
    }
    const Sample c = summarize(cold), h = summarize(hit), q = summarize(ratio);
    rows.push_back({"ttft pp" + std::to_string(n) + " cold (s)", fmt(c, 3)});
    rows.push_back({"ttft pp" + std::to_string(n) + " hit of " + std::to_string(cached) + " (s)", fmt(h, 3)});
    rows.push_back({"ttft pp" + std::to_string(n) + " hit/cold", fmt(q, 4)});
    j["prefix_cache"][std::to_string(n)] = {{"ttft_cold_s", c.mean}, {"ttft_cold_sd", c.sd},
                                            {"ttft_hit_s", h.mean},   {"ttft_hit_sd", h.sd},
                                            {"hit_over_cold", q.mean}, {"cached_tokens", cached}};
  }
  if (o.prefix_cache) lap("prefix cache");

  // Prefill, default and exact, side by side per repetition (same prompt). No untimed warm-up prefill runs first:
  // its only effect was growing the engine's scratch arenas (later steps of a shape reuse the first one's pages,
  // core/workspace.h), and that one-time cost is small next to a prefill step and its noise. On a 2-core Zen 3,
  // -p 512 -r 3 without a warm-up: the first default run faulted in 79152 pages in 0.28 s of system time and took
  // 17.43 s against 17.59 / 18.97 for the next two (137-138 faults each), and the exact plan's first run 685 faults
  // (26.67 s against 27.34 / 26.70), while a 512-token warm-up took 17.7 s of a 116 s `-p 512 --batch 1 -n 1 -r 2`.
  const std::vector<int64_t> prefill_lengths =
      o.prefix_cache || only_speculative ? std::vector<int64_t>{} : o.prompt_lengths;
  int64_t kv_bytes_longest = 0, kv_positions_longest = 0;
  for (int64_t n : prefill_lengths) {
    const std::vector<int32_t> prompt = random_prompt(n, info.vocab_size, static_cast<uint32_t>(n));
    std::vector<double> tps_default, tps_exact, ratio;
    double phase_s[4] = {};  // default plan, summed over repetitions: other, linear, indexer, attention
    // The dot-product peak right before and right after this prompt's runs (higher), and the tile unit's where the
    // table runs this prompt's MXFP4 GEMMs there.
    auto tiles_peak = [&]() -> std::optional<ComputePeak> {
      if (info.fp4_amx_min_rows == 0 || n < info.fp4_amx_min_rows) return std::nullopt;
      return (*engine)->measure_compute_peak(0.25, ComputeUnit::kAmxTiles);
    };
    const ComputePeak peak_before = (*engine)->measure_compute_peak();
    const std::optional<ComputePeak> tiles_before = tiles_peak();
    double default_s = 0;
    for (int r = 0; r < o.repetitions; ++r) {
      int64_t global_bytes = 0;
      auto td = bench.prefill(prompt, Plan::kBoundedReplay, &global_bytes, phase_s);
      if (!td.ok()) return fail(td.error());
      default_s += *td;
      tps_default.push_back(static_cast<double>(n) / *td);
      if (o.exact) {
        auto te = bench.prefill(prompt, Plan::kExact, nullptr);
        if (!te.ok()) return fail(te.error());
        tps_exact.push_back(static_cast<double>(n) / *te);
        ratio.push_back(*td / *te);
      }
      if (n >= kv_positions_longest) {
        kv_positions_longest = n;
        kv_bytes_longest = global_bytes;
      }
    }
    const Sample d = summarize(tps_default), e = summarize(tps_exact), q = summarize(ratio);
    rows.push_back({"pp" + std::to_string(n) + " default", fmt(d)});
    j["prefill"][std::to_string(n)] = {{"tps_default", d.mean}, {"tps_default_sd", d.sd}};
    if (o.exact) {
      rows.push_back({"pp" + std::to_string(n) + " exact", fmt(e)});
      rows.push_back({"pp" + std::to_string(n) + " cost default/exact", fmt(q, 3)});
      j["prefill"][std::to_string(n)].update({{"tps_exact", e.mean}, {"tps_exact_sd", e.sd}, {"cost_ratio", q.mean},
                                              {"cost_ratio_sd", q.sd}});
    }
    // Prefill against the dot-product peak measured around the runs, in this process: matmul FLOPs of the default
    // plan from the activated parameters (2 per weight element: every prompt token through the encoder path, the
    // window tail through the rest of the decoder and the head; attention and indexer arithmetic not counted).
    const ComputePeak peak_after = (*engine)->measure_compute_peak();
    const std::optional<ComputePeak> tiles_after = tiles_peak();
    const ComputePeak& peak = higher(peak_before, peak_after);
    const std::optional<ComputePeak> tiles = higher(tiles_before, tiles_after);
    const std::optional<ComputePeak> dot = bf16_dot_peak(peak);
    const double tail = static_cast<double>(std::min(n, info.window_size));
    auto matmul_flops = [&](int64_t prefill_params, int64_t decode_params) {
      return 2.0 * static_cast<double>(prefill_params) * static_cast<double>(n) +
             2.0 * static_cast<double>(decode_params - prefill_params) * tail;
    };
    const double flops = matmul_flops(info.activated_params_prefill, info.activated_params_decode);
    const double fp4_flops = matmul_flops(info.activated_params_prefill_fp4, info.activated_params_decode_fp4);
    const double prompt_s = static_cast<double>(n) / d.mean;
    const double achieved_gflops = flops / prompt_s * 1e-9;
    const ComputeBound bound = compute_bound(flops, fp4_flops, peak, tiles);
    const double fraction = bound.seconds / prompt_s;  // achieved / peak without tiles
    // Where the default plan's time went (shares of its prefill seconds): matmuls against everything else.
    auto share = [&](int p) { return default_s > 0 ? phase_s[p] / default_s : 0.0; };
    char text[600];
    if (tiles) {
      std::snprintf(text, sizeof(text),
                    "%.3f (%.1f GFLOP/s; bound %.1f ms of %.1f ms per prompt = %s, %s and %s, same run, the higher of "
                    "the probes before / after: %.0f / %.0f and %.0f / %.0f",
                    fraction, achieved_gflops, bound.seconds * 1e3, prompt_s * 1e3, bound.text.c_str(),
                    peak.kernel.c_str(), tiles->kernel.c_str(), peak_before.gflops, peak_after.gflops,
                    tiles_before->gflops, tiles_after->gflops);
      j["prefill"][std::to_string(n)]["tiles_peak_gflops"] = tiles->gflops;
      j["prefill"][std::to_string(n)]["fp4_flops"] = fp4_flops;
    } else {
      std::snprintf(text, sizeof(text),
                    "%.3f (%.1f of %.1f GFLOP/s, %s, same run, the higher of the probes before / after: %.0f / %.0f",
                    fraction, achieved_gflops, peak.gflops, peak.kernel.c_str(), peak_before.gflops, peak_after.gflops);
    }
    std::string row_text = text;
    std::snprintf(text, sizeof(text), "; time by phase: linear %.2f, attention %.2f, indexer %.2f, other %.2f)",
                  share(1), share(3), share(2), share(0));
    row_text += text;
    if (dot) {
      const double dot_fraction = achieved_gflops / dot->gflops;
      std::snprintf(text, sizeof(text), "; %.3f of the bf16-dot peak (%.1f GFLOP/s, %s)", dot_fraction, dot->gflops,
                    dot->kernel.c_str());
      row_text += text;
      j["prefill"][std::to_string(n)]["bf16_dot_peak_fraction"] = dot_fraction;
      j["prefill"][std::to_string(n)]["bf16_dot_peak_gflops"] = dot->gflops;
      j["prefill_bf16_dot_peak_fraction"] = dot_fraction;
    }
    rows.push_back({"pp" + std::to_string(n) + " default / dot peak", row_text});
    j["prefill"][std::to_string(n)]["phase_share"] = {
        {"linear", share(1)}, {"attention", share(3)}, {"indexer", share(2)}, {"other", share(0)}};
    j["prefill"][std::to_string(n)]["achieved_gflops"] = achieved_gflops;
    j["prefill"][std::to_string(n)]["flops"] = flops;
    j["prefill"][std::to_string(n)]["peak_gflops"] = peak.gflops;
    j["prefill"][std::to_string(n)]["peak_gflops_before_after"] = {peak_before.gflops, peak_after.gflops};
    j["prefill"][std::to_string(n)]["peak_fraction"] = fraction;
    j["prefill_peak_fraction"] = fraction;
    j["peak_kernel"] = peak.kernel;
    // The top-level keys describe the longest prompt.
    j["prefill_tokens"] = n;
    j["prefill_tps_default"] = d.mean;
    if (o.exact) {
      j["prefill_tps_exact"] = e.mean;
      j["prefill_cost_ratio"] = q.mean;
    }
  }
  if (!prefill_lengths.empty()) lap("prefill");

  // Decode throughput at the smallest depth, per batch.
  std::vector<int64_t> depths = o.depths;
  std::sort(depths.begin(), depths.end());
  if (o.prefix_cache || only_speculative) depths.clear();
  if (!depths.empty()) {
    const int64_t depth = depths.front();
    // The two limits of a decode step, measured in this process: the step's roofline is
    // max(weight bytes touched / read bandwidth, matmul FLOPs / dot peak), each the higher of the probes right
    // before and right after the batch's run.
    // The tile unit's peak too where the table runs MXFP4 GEMMs of some batch there.
    struct Limits {
      ComputePeak peak;
      std::optional<ComputePeak> dot, tiles;
      ReadBandwidth read;
    };
    const bool any_on_tiles =
        info.fp4_amx_min_rows > 0 && *std::max_element(o.batches.begin(), o.batches.end()) >= info.fp4_amx_min_rows;
    auto measure_limits = [&] {
      Limits limits;
      limits.peak = (*engine)->measure_compute_peak();
      limits.dot = bf16_dot_peak(limits.peak);
      if (any_on_tiles) limits.tiles = (*engine)->measure_compute_peak(0.25, ComputeUnit::kAmxTiles);
      limits.read = (*engine)->measure_read_bandwidth();
      return limits;
    };
    Limits before = measure_limits();
    for (int64_t batch : o.batches) {
      // One run decoding every repetition's tokens; its pure decode steps split into repetitions of -n steps.
      auto steps = bench.decode_steps(depth, batch, o.decode_tokens * o.repetitions);
      if (!steps.ok()) return fail(steps.error());
      // `before` becomes the next batch's: its run starts right after this probe.
      const Limits probe_before = std::exchange(before, measure_limits());
      const Limits& probe_after = before;
      const ComputePeak& peak = higher(probe_before.peak, probe_after.peak);
      const std::optional<ComputePeak> dot = higher(probe_before.dot, probe_after.dot);
      // A batch of fewer rows gives no expert GEMM enough rows for the tiles.
      const std::optional<ComputePeak> tiles =
          any_on_tiles && batch >= info.fp4_amx_min_rows ? higher(probe_before.tiles, probe_after.tiles) : std::nullopt;
      const ReadBandwidth& read = higher(probe_before.read, probe_after.read);
      if (batch == o.batches.front()) {
        j["read_gbps"] = read.gbps;
        j["peak_gflops"] = peak.gflops;
        if (dot) j["bf16_dot_peak_gflops"] = dot->gflops;
      }
      std::vector<double> tps;
      for (int r = 0; r < o.repetitions; ++r) {
        // decode_steps returned every repetition's -n steps.
        const size_t from = static_cast<size_t>(r * o.decode_tokens), count = static_cast<size_t>(o.decode_tokens);
        tps.push_back(static_cast<double>(batch) * static_cast<double>(count) / total_seconds(*steps, from, count));
      }
      const Sample d = summarize(tps);
      rows.push_back({"tg" + std::to_string(o.decode_tokens) + " b" + std::to_string(batch) + " @ d" +
                          std::to_string(depth),
                      fmt(d)});
      j["decode"][std::to_string(depth)][std::to_string(batch)] = {{"tps", d.mean}, {"tps_sd", d.sd}};
      j["decode_tps_batch" + std::to_string(batch)] = d.mean;
      // Roofline of these steps: bytes = the dense weights once + every distinct routed expert the step ran once
      // (counted by the MoE layers, StepRecord::routed_expert_bytes); FLOPs = 2 x batch x activated decode
      // parameters (matmuls only). Fraction = roofline time / measured step time.
      double routed = 0, step_s = 0;
      double phase_ms[4] = {};  // mean ms per step: other, linear, indexer, attention (StepRecord::phase_ns)
      for (const StepRecord& s : *steps) {
        routed += static_cast<double>(s.routed_expert_bytes);
        step_s += s.seconds;
        for (int p = 0; p < 4; ++p) phase_ms[p] += static_cast<double>(s.phase_ns[p]) * 1e-6;
      }
      const double num_steps = static_cast<double>(steps->size());
      routed /= num_steps;
      step_s /= num_steps;
      for (double& ms : phase_ms) ms /= num_steps;
      const double bytes = static_cast<double>(info.decode_weight_bytes - info.decode_routed_bytes) + routed;
      const double flops = 2.0 * static_cast<double>(batch) * static_cast<double>(info.activated_params_decode);
      const double fp4_flops = 2.0 * static_cast<double>(batch) * static_cast<double>(info.activated_params_decode_fp4);
      const ComputeBound bound = compute_bound(flops, fp4_flops, peak, tiles);
      const double bytes_s = bytes / (read.gbps * 1e9);
      const double roofline_s = std::max(bytes_s, bound.seconds);
      const double fraction = roofline_s / step_s;
      char tiles_text[64] = "";
      if (tiles) {
        std::snprintf(tiles_text, sizeof(tiles_text), ", %.0f / %.0f GFLOP/s on tiles", probe_before.tiles->gflops,
                      probe_after.tiles->gflops);
        j["decode"][std::to_string(depth)][std::to_string(batch)]["tiles_peak_gflops"] = tiles->gflops;
        j["decode"][std::to_string(depth)][std::to_string(batch)]["fp4_flops"] = fp4_flops;
      }
      char text[600];
      std::snprintf(text, sizeof(text),
                    "%.3f (step %.1f ms; roofline %.1f ms = max(%.2f GB / %.1f GB/s, %s), "
                    "the higher of the probes before / after: %.1f / %.1f GB/s, %.0f / %.0f GFLOP/s%s; "
                    "by phase: linear %.1f, attention %.1f, indexer %.1f, other %.1f)",
                    fraction, step_s * 1e3, roofline_s * 1e3, bytes * 1e-9, read.gbps, bound.text.c_str(),
                    probe_before.read.gbps, probe_after.read.gbps, probe_before.peak.gflops, probe_after.peak.gflops,
                    tiles_text, phase_ms[1], phase_ms[3], phase_ms[2], phase_ms[0]);
      std::string row_text = text;
      if (dot) {
        const double dot_roofline_s = std::max(bytes_s, flops / (dot->gflops * 1e9));
        std::snprintf(text, sizeof(text), "; %.3f of the bf16-dot roofline (%.1f ms, %.1f GFLOP/s)",
                      dot_roofline_s / step_s, dot_roofline_s * 1e3, dot->gflops);
        row_text += text;
        j["decode"][std::to_string(depth)][std::to_string(batch)]["bf16_dot_roofline_fraction"] = dot_roofline_s / step_s;
        j["decode_bf16_dot_roofline_fraction_batch" + std::to_string(batch)] = dot_roofline_s / step_s;
      }
      rows.push_back({"tg b" + std::to_string(batch) + " / roofline", row_text});
      j["decode"][std::to_string(depth)][std::to_string(batch)]["roofline_fraction"] = fraction;
      j["decode"][std::to_string(depth)][std::to_string(batch)]["read_gbps_before_after"] = {
          probe_before.read.gbps, probe_after.read.gbps};
      j["decode"][std::to_string(depth)][std::to_string(batch)]["peak_gflops_before_after"] = {
          probe_before.peak.gflops, probe_after.peak.gflops};
      j["decode"][std::to_string(depth)][std::to_string(batch)]["step_ms"] = step_s * 1e3;
      j["decode"][std::to_string(depth)][std::to_string(batch)]["weight_bytes"] = bytes;
      j["decode"][std::to_string(depth)][std::to_string(batch)]["flops"] = flops;
      j["decode"][std::to_string(depth)][std::to_string(batch)]["phase_ms"] = {
          {"linear", phase_ms[1]}, {"attention", phase_ms[3]}, {"indexer", phase_ms[2]}, {"other", phase_ms[0]}};
      j["decode_roofline_fraction_batch" + std::to_string(batch)] = fraction;
    }
    j["decode_depth"] = depth;
    lap("decode");
  }

  // One batch-1 decode step at each depth (synthetic context), split into the context-free part (the step at the
  // window depth) and the context-dependent rest, and by phase as timed inside the step.
  double base_step = 0;
  const int64_t reference_depth = std::max<int64_t>(1, info.window_size);
  const int steps_per_depth = std::max(3, o.repetitions);
  if (!depths.empty()) {
    auto records = bench.decode_steps(reference_depth, 1, steps_per_depth);
    if (!records.ok()) return fail(records.error());
    std::vector<double> steps;
    for (const StepRecord& step : *records) steps.push_back(step.seconds);
    base_step = summarize(steps).mean;
    j["decode_step_breakdown"]["reference_depth"] = reference_depth;
    j["decode_step_breakdown"]["reference_step_ms"] = base_step * 1e3;
  }
  double first_step_ms = 0;
  for (int64_t depth : depths) {
    auto records = bench.decode_steps(depth, 1, steps_per_depth);
    if (!records.ok()) return fail(records.error());
    if (records->empty()) return fail(bench_error("no decode step at depth " + std::to_string(depth)));
    std::vector<double> steps;
    int64_t phase_ns[4] = {};
    for (const StepRecord& step : *records) {
      steps.push_back(step.seconds);
      for (int p = 0; p < 4; ++p) phase_ns[p] += step.phase_ns[p];
    }
    const Sample step = summarize(steps);
    if (depth == depths.front()) first_step_ms = step.mean * 1e3;
    const double context = std::max(0.0, step.mean - base_step);
    // Mean ms per step of each phase (phase_ns: other, linear, indexer, attention).
    auto phase_ms = [&](int p) { return static_cast<double>(phase_ns[p]) * 1e-6 / static_cast<double>(steps.size()); };
    const double other = phase_ms(0), linear = phase_ms(1), indexer = phase_ms(2), attention = phase_ms(3);
    char text[400];
    std::snprintf(text, sizeof(text),
                  "%s ms (x%.2f of d%lld) = %.2f context-free + %.2f context; by phase: indexer %.2f, attention %.2f, "
                  "linear %.2f, other %.2f",
                  fmt(Sample{step.mean * 1e3, step.sd * 1e3}).c_str(), step.mean * 1e3 / first_step_ms,
                  static_cast<long long>(depths.front()), std::min(base_step, step.mean) * 1e3, context * 1e3,
                  indexer, attention, linear, other);
    rows.push_back({"decode step @ d" + std::to_string(depth), text});
    j["decode_step_ms_by_depth"][std::to_string(depth)] = step.mean * 1e3;
    j["decode_step_breakdown"][std::to_string(depth)] = {
        {"step_ms", step.mean * 1e3},  {"step_ms_sd", step.sd * 1e3},
        {"context_free_ms", std::min(base_step, step.mean) * 1e3}, {"context_ms", context * 1e3},
        {"indexer_ms", indexer},       {"attention_ms", attention},
        {"linear_ms", linear},         {"other_ms", other},
        {"over_smallest_depth", step.mean * 1e3 / first_step_ms}};
  }
  if (!depths.empty()) lap("depths");

  // Global KV actually allocated, and what reserving a long context allocates (pages are not touched).
  const double kv_per_token =
      kv_positions_longest > 0 ? static_cast<double>(kv_bytes_longest) / static_cast<double>(kv_positions_longest) : 0;
  j["global_kv_bytes_per_token_allocated"] = kv_per_token;
  j["global_kv_bytes_per_token_formula"] = info.global_kv_bytes_per_token;
  j["kv_block_tokens"] = info.kv_block_tokens;
  {
    const int64_t reserved = (*engine)->global_kv_bytes_for_positions(o.reserve_context);
    j["reserve_context"] = o.reserve_context;
    j["reserve_global_kv_bytes"] = reserved;
    char text[96];
    std::snprintf(text, sizeof(text), "%.4f GB (%lld B)", static_cast<double>(reserved) / 1e9,
                  static_cast<long long>(reserved));
    rows.push_back({"global KV reserved @ " + std::to_string(o.reserve_context), text});
  }
  {
    char text[96];
    std::snprintf(text, sizeof(text), "%.1f B/token (formula %.1f; %lld positions, %lld-token blocks)", kv_per_token,
                  info.global_kv_bytes_per_token, static_cast<long long>(kv_positions_longest),
                  static_cast<long long>(info.kv_block_tokens));
    rows.push_back({"global KV allocated", text});
  }
  const int64_t rss = peak_rss_bytes();
  j["peak_rss_bytes"] = rss;
  j["tile_major_bytes"] = info.tile_major_bytes;
  rows.push_back({"peak RSS", std::to_string(rss / (1 << 20)) + " MiB (of which the load-time weight copies " +
                                  std::to_string(info.tile_major_bytes >> 20) + " MiB)"});
  lap("rest");
  double wall = 0;
  std::string wall_text;
  for (const auto& [section, seconds] : wall_split) {
    wall += seconds;
    j["wall_split_s"][section] = seconds;
    char part[64];
    std::snprintf(part, sizeof(part), "%s%s %.1f", wall_text.empty() ? "" : ", ", section.c_str(), seconds);
    wall_text += part;
  }
  j["wall_s"] = wall;
  {
    char text[32];
    std::snprintf(text, sizeof(text), "%.1f s (", wall);
    rows.push_back({"bench wall time", text + wall_text + ")"});
  }

  if (o.json) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("| model | size | params | kernels | test | t/s |\n| --- | ---: | ---: | --- | --- | ---: |\n");
  for (const auto& [test, value] : rows) {
    std::printf("| %s | %s | %s | %s | %s | %s |\n", model_name.c_str(), size_text, params_text,
                kernels_text.c_str(), test.c_str(), value.c_str());
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
  cmd->add_option("-n,--decode", options->decode_tokens, "decode steps per measurement")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--batch", options->batches, "decode batch sizes, comma separated")->delimiter(',');
  cmd->add_option("--depth", options->depths,
                  "decode depths over a synthetic context (valid random KV, nothing prefilled), comma separated; "
                  "the smallest also runs the tg rows")
      ->delimiter(',');
  cmd->add_option("--chunk", options->chunk, "prefill chunk (tokens)");
  cmd->add_flag("!--no-exact", options->exact,
                "prefill with the default plan only, not also the exact plan (the official full forward, which "
                "at long prompts takes most of the run)");
  cmd->add_option("-r,--repetitions", options->repetitions, "repetitions per figure")->check(CLI::Range(1, 1000));
  cmd->add_option("-t,--threads", options->threads, "worker threads (0: one per hardware thread)");
  add_backend_option(cmd, &options->backend);
  cmd->add_flag("--pin-threads", options->pin_threads, "pin each worker thread to one CPU, spread over the NUMA nodes");
  cmd->add_flag("--mlock", options->mlock, "lock the weights in RAM (mlock; needs ulimit -l or root)");
  cmd->add_option("--reserve-context", options->reserve_context, "context whose global-KV reservation is reported");
  cmd->add_flag("--json", options->json, "one JSON object instead of the table");
  cmd->add_flag("--prefix-cache", options->prefix_cache,
                "only time to first token, cold vs a prefix-cache hit of all but the last 64 prompt tokens");
  cmd->add_option("--speculative", options->speculative,
                  "only speculative decoding: cost of verifying K drafts vs a plain step, the projected speed-up at "
                  "2.8 tokens/step, adaptive vs plain decode speed")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--spec-tokens", options->spec_tokens, "decode tokens of each adaptive-vs-plain run")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 20));
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
    for (int64_t v : options->depths) {
      if (v < 1) {
        std::cerr << "dsflash bench: depths must be >= 1\n";
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
