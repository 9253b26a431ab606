// `dsflash logits`: prefill on prompt ids, then N greedy (or --follow teacher-forced) decode steps; writes the
// logits rows as little-endian float32 [rows, vocab] and prints one JSON line describing them. Outside checks
// and tests call this: keep the interface stable. Runs one Engine request with return_logits (rows: --exact every
// prompt position, else the last; then one per decode step), no stop ids.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli_checks.h"
#include "commands.h"
#include "dsflash/engine.h"
#include "token_ids.h"

namespace dsflash::cli {

namespace {

EngineError bad_ids(std::string message) { return EngineError{ErrorCode::kInvalidRequest, std::move(message)}; }

}  // namespace

Expected<std::vector<int32_t>> parse_token_ids(const std::string& text, const std::string& origin) {
  std::vector<int32_t> ids;
  std::string token;
  auto flush = [&]() -> std::optional<EngineError> {
    if (token.empty()) return std::nullopt;
    char* end = nullptr;
    const long long value = std::strtoll(token.c_str(), &end, 10);
    if (end == token.c_str() || *end != '\0' || value < INT32_MIN || value > INT32_MAX) {
      return bad_ids(origin + ": \"" + token + "\" is not a token id");
    }
    ids.push_back(static_cast<int32_t>(value));
    token.clear();
    return std::nullopt;
  };
  for (char c : text) {
    if (c == ',' || c == ' ' || c == '\n' || c == '\t' || c == '\r') {
      if (auto error = flush()) return *error;
    } else {
      token.push_back(c);
    }
  }
  if (auto error = flush()) return *error;
  return ids;
}

Expected<std::vector<int32_t>> read_prompt_ids(const std::string& tokens, const std::string& tokens_file) {
  if (!tokens.empty() && !tokens_file.empty()) return bad_ids("give either --tokens or --tokens-file, not both");
  if (!tokens_file.empty()) {
    std::ifstream in(tokens_file);
    if (!in) return bad_ids("cannot read --tokens-file " + tokens_file);
    std::stringstream buffer;
    buffer << in.rdbuf();
    return parse_token_ids(buffer.str(), tokens_file);
  }
  return parse_token_ids(tokens, "--tokens");
}

void add_logits_command(CLI::App& app, int* exit_code) {
  struct Options {
    std::string model_dir, tokens, tokens_file, out, follow, cache_dir;
    int64_t cache_disk_bytes = int64_t{16} << 30;
    bool no_prefix_cache = false;
    int64_t steps = 0;
    bool exact = false, reference = false;
    int threads = 0;
    std::string backend;
    bool mlock = false;
    int speculative = 0;
  };
  auto options = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("logits", "prefill + greedy decode, write float32 logits rows");
  cmd->add_option("-m,--model", options->model_dir, "checkpoint directory")->required();
  cmd->add_option("--tokens", options->tokens, "prompt token ids, comma separated");
  cmd->add_option("--tokens-file", options->tokens_file, "file with prompt token ids (comma/space separated)");
  cmd->add_option("-n,--steps", options->steps, "decode steps after the prompt")->check(whole_number_at_least(0));
  cmd->add_option("--out", options->out, "output file: little-endian float32 [rows, vocab]")->required();
  cmd->add_flag("--exact", options->exact,
                "official full forward with a row for every prompt position (default: CED prefill with Decoder "
                "SWA Bounded Replay, the last prompt row)");
  cmd->add_option("--follow", options->follow, "ids fed at the decode steps instead of the greedy choice");
  cmd->add_flag("--reference", options->reference, "scalar reference kernels (the oracle), single-threaded");
  add_backend_option(cmd, &options->backend);
  cmd->add_option("--threads", options->threads, "worker threads of the fast path (0 = all)");
  cmd->add_flag("--mlock", options->mlock, "lock the weights in RAM (mlock; needs ulimit -l or root)");
  add_prefix_cache_options(cmd, &options->cache_dir, &options->cache_disk_bytes, &options->no_prefix_cache);
  add_speculative_option(cmd, &options->speculative);
  cmd->callback([options, exit_code] {
    auto fail = [exit_code](const std::string& message) {
      std::cerr << "dsflash logits: " << message << "\n";
      *exit_code = 1;
    };
    auto prompt = read_prompt_ids(options->tokens, options->tokens_file);
    if (!prompt.ok()) return fail(prompt.error().message);
    if (prompt->empty()) return fail("the prompt is empty: give --tokens or --tokens-file");
    std::vector<int32_t> follow;
    if (!options->follow.empty()) {
      auto ids = parse_token_ids(options->follow, "--follow");
      if (!ids.ok()) return fail(ids.error().message);
      follow = std::move(*ids);
    }
    if (!follow.empty() && static_cast<int64_t>(follow.size()) < options->steps) {
      return fail("--follow gives " + std::to_string(follow.size()) + " ids but " + std::to_string(options->steps) +
                  " decode steps need one each");
    }
    const auto started = std::chrono::steady_clock::now();
    LoadOptions load;
    load.prefix_cache = !options->no_prefix_cache;
    load.cache_dir = options->cache_dir;
    load.cache_disk_bytes = options->cache_disk_bytes;
    load.reference_kernels = options->reference;
    load.backend = options->backend;
    load.num_threads = options->threads;
    load.lock_weights = options->mlock;
    load.dspark = options->speculative > 0;  // the stages' weights only where they draft
    // One chunk for the whole prompt (the rows do not depend on it; one chunk is the official call shape).
    load.prefill_tokens_per_step = std::max<int64_t>(load.prefill_tokens_per_step, static_cast<int64_t>(prompt->size()));
    auto engine = Engine::load(options->model_dir, load);
    if (!engine.ok()) return fail(engine.error().message);
    GenerationRequest request;
    request.prompt_ids = *prompt;
    request.max_tokens = options->steps + 1;  // one id after the prompt, one after every decode step
    request.stop_at_eos = false;
    request.plan = options->exact ? Plan::kExact : Plan::kBoundedReplay;
    request.return_logits = true;
    request.follow_ids = follow;
    request.detokenize = false;
    request.speculative = options->speculative;
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    auto run = (*engine)->generate(std::move(request));
    if (!run.ok()) return fail(run.error().message);
    std::ofstream out(options->out, std::ios::binary);
    out.write(reinterpret_cast<const char*>(run->logits.data()),
              static_cast<std::streamsize>(run->logits.size() * sizeof(float)));
    if (!out) return fail("cannot write " + options->out);
    nlohmann::json line;
    line["generated"] = run->tokens;
    line["positions"] = run->positions;
    line["rows"] = run->positions.size();
    line["vocab"] = (*engine)->info().vocab_size;
    line["prompt_tokens"] = prompt->size();
    line["decode_steps"] = options->steps;
    line["kernels"] = (*engine)->info().kernels;
    line["plan"] = options->exact ? "exact" : "bounded-replay";
    line["out"] = options->out;
    line["cached_tokens"] = run->usage.cached_tokens;  // prompt tokens whose global KV came from the prefix cache
    line["ttft_s"] = load_s + run->first_token_s;      // load + replay + suffix prefill + first logits
    // Speculative decoding: drafts verified and accepted, tokens per decode step (1 without speculation).
    const Usage& usage = run->usage;
    line["speculative"] = options->speculative;
    line["draft_tokens"] = usage.draft_tokens;
    line["accepted_tokens"] = usage.accepted_tokens;
    line["mean_accept_len"] =
        usage.decode_steps > 0 ? static_cast<double>(usage.generated_tokens - 1) / static_cast<double>(usage.decode_steps) : 1.0;
    std::cout << line.dump() << std::endl;
    *exit_code = 0;
  });
}

}  // namespace dsflash::cli
