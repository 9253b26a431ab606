// CLI11 validators with messages a user can read (CLI11's NonNegativeNumber prints its range with a 300-digit
// upper bound).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdlib>
#include <string>

namespace dsflash::cli {

// A whole number >= minimum.
inline CLI::Validator whole_number_at_least(long long minimum) {
  return CLI::Validator(
      [minimum](std::string& value) -> std::string {
        char* end = nullptr;
        const long long v = std::strtoll(value.c_str(), &end, 10);
        if (value.empty() || end == value.c_str() || *end != '\0' || v < minimum) {
          return "must be a whole number >= " + std::to_string(minimum) + ", got " + value;
        }
        return "";
      },
      "N>=" + std::to_string(minimum), "WholeNumberAtLeast");
}

// The prefix-cache options shared by logits, generate, serve and bench.
inline void add_prefix_cache_options(CLI::App* cmd, std::string* cache_dir, int64_t* cache_disk_bytes,
                                     bool* no_prefix_cache) {
  cmd->add_option("--cache-dir", *cache_dir,
                  "prefix cache SSD tier: keeps prompts' global KV across runs (created if missing)");
  cmd->add_option("--cache-disk-bytes", *cache_disk_bytes, "byte budget of the SSD tier (default 16 GiB)")
      ->check(whole_number_at_least(0));
  cmd->add_flag("--no-prefix-cache", *no_prefix_cache, "no prefix cache at all (not even the RAM tier)");
}

// --backend NAME, shared by logits, generate, serve and bench: the fast kernel table (LoadOptions::backend).
inline void add_backend_option(CLI::App* cmd, std::string* backend) {
  cmd->add_option("--backend", *backend,
                  "fast kernel table: avx512, amx (AMX tiles: faster prefill and batches, slower one-row decode), "
                  "avx2; default: the CPU's best");
}

// --speculative N, shared by logits, generate, serve and bench.
inline void add_speculative_option(CLI::App* cmd, int* speculative) {
  cmd->add_option("--speculative", *speculative,
                  "speculative decoding with the model's DSpark stages: most drafted tokens verified per step "
                  "(0 = off; adaptive, greedy output unchanged)")
      ->check(whole_number_at_least(0));
}

}  // namespace dsflash::cli
