// `dsflash cache stats|verify|clear --cache-dir DIR`: what a prefix-cache directory holds, a check of every
// record, and clearing it (dsflash/cache.h).
#include <CLI/CLI.hpp>

#include <ctime>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"
#include "dsflash/cache.h"

namespace dsflash::cli {
namespace {

nlohmann::json to_json(const CacheDirReport& report, bool verified) {
  nlohmann::json j;
  j["models"] = nlohmann::json::array();
  for (const CacheModelReport& m : report.models) {
    nlohmann::json model = {{"fingerprint", m.fingerprint},     {"records", m.records},
                            {"bytes", m.bytes},                 {"temporary_files", m.temporary_files},
                            {"foreign_files", m.foreign_files}, {"oldest_unix_s", m.oldest_unix_s},
                            {"newest_unix_s", m.newest_unix_s}};
    if (verified) {
      model["bad_records"] = m.bad_records;
      model["tokens"] = m.tokens;
      model["bytes_per_cached_token"] = m.tokens > 0 ? static_cast<double>(m.bytes) / static_cast<double>(m.tokens) : 0.0;
    }
    j["models"].push_back(model);
  }
  if (verified) j["problems"] = report.problems;
  return j;
}

void print_table(const CacheDirReport& report, bool verified) {
  const std::time_t now = std::time(nullptr);
  for (const CacheModelReport& m : report.models) {
    std::cout << "model " << m.fingerprint << ": " << m.records << " records, " << m.bytes << " bytes";
    if (m.records > 0) {
      std::cout << ", newest " << (now - m.newest_unix_s) << " s ago, oldest " << (now - m.oldest_unix_s) << " s ago";
    }
    if (m.temporary_files > 0) std::cout << ", " << m.temporary_files << " temporary files";
    if (m.foreign_files > 0) std::cout << ", " << m.foreign_files << " foreign files";
    if (verified) std::cout << "; verified: " << m.bad_records << " bad, " << m.tokens << " tokens";
    std::cout << "\n";
  }
  if (report.models.empty()) std::cout << "no records\n";
  for (const std::string& p : report.problems) std::cout << "bad: " << p << "\n";
}

}  // namespace

void add_cache_command(CLI::App& app, int* exit_code) {
  struct Options {
    std::string dir;
    bool json = false, remove_bad = false;
  };
  auto options = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("cache", "prefix-cache directory: stats, verify, clear");
  cmd->require_subcommand(1);
  auto add_dir = [&](CLI::App* sub) {
    sub->add_option("--cache-dir", options->dir, "the cache directory")->required();
    sub->add_flag("--json", options->json, "one JSON object instead of a table");
  };
  auto fail = [exit_code](const std::string& message) {
    std::cerr << "dsflash cache: " << message << "\n";
    *exit_code = 1;
  };
  CLI::App* stats = cmd->add_subcommand("stats", "records, bytes, models, age");
  add_dir(stats);
  stats->callback([options, exit_code, fail] {
    auto report = cache_stats(options->dir);
    if (!report.ok()) return fail(report.error().message);
    options->json ? void(std::cout << to_json(*report, false).dump() << "\n") : print_table(*report, false);
    *exit_code = 0;
  });
  CLI::App* verify = cmd->add_subcommand("verify", "read and check every record (exit 1 if any is bad)");
  add_dir(verify);
  verify->add_flag("--remove-bad", options->remove_bad, "delete the records that fail");
  verify->callback([options, exit_code, fail] {
    auto report = cache_verify(options->dir, options->remove_bad);
    if (!report.ok()) return fail(report.error().message);
    options->json ? void(std::cout << to_json(*report, true).dump() << "\n") : print_table(*report, true);
    *exit_code = report->problems.empty() ? 0 : 1;
  });
  CLI::App* clear = cmd->add_subcommand("clear", "delete every record");
  add_dir(clear);
  clear->callback([options, exit_code, fail] {
    auto removed = cache_clear(options->dir);
    if (!removed.ok()) return fail(removed.error().message);
    std::cout << "removed " << *removed << " files\n";
    *exit_code = 0;
  });
}

}  // namespace dsflash::cli
