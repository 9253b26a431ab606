// `dsflash bench --json` through its CLI11 subcommand on a freshly made tiny checkpoint: the figures the speed
// targets are read from are present and consistent (each batch's roofline fraction and its step split by phase,
// the prefill peak fraction, the step by depth).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/cli_run.h"

namespace {

namespace fs = std::filesystem;
using dsflash::testing::CliRun;
using dsflash::testing::run_dsflash;

fs::path shared_tokenizer() { return fs::path(DSFLASH_SHARED_DIR) / "tokenizer" / "deepseek_v3_tokenizer.json"; }

// A freshly made tiny checkpoint (`make-tiny --preset tiny`), removed with the test.
struct TinyCheckpoint {
  fs::path dir;
  CliRun made;
  TinyCheckpoint() {
    std::random_device rd;
    dir = fs::temp_directory_path() / ("dsflash-bench-cli-" + std::to_string(rd()) + std::to_string(rd()));
    made = run_dsflash(
        {"make-tiny", "--preset", "tiny", "-o", dir.string(), "--tokenizer", shared_tokenizer().string()});
  }
  ~TinyCheckpoint() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

TEST(BenchCli, JsonHasEveryTargetFigureAndPhasesAddUpToTheStep) {
  if (!fs::exists(shared_tokenizer())) GTEST_SKIP() << "no shared tokenizer";
  const TinyCheckpoint tiny;
  ASSERT_EQ(tiny.made.exit_code, 0) << tiny.made.err;

  const auto bench_start = std::chrono::steady_clock::now();
  const CliRun bench = run_dsflash({"bench", "-m", tiny.dir.string(), "-p", "16", "-n", "2", "-r", "1", "--batch",
                                    "1,2", "--depth", "256", "--threads", "2", "--json"});
  const double bench_elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - bench_start).count();
  ASSERT_EQ(bench.exit_code, 0) << bench.err;
  const nlohmann::json j = nlohmann::json::parse(bench.out);

  EXPECT_GT(j.at("prefill_peak_fraction").get<double>(), 0.0);
  {
    // The wall time is split into the sections that ran, and it is the process's run time, less its start and exit.
    const nlohmann::json& split = j.at("wall_split_s");
    EXPECT_EQ(split.size(), 5u);
    for (const char* section : {"load", "prefill", "decode", "depths", "rest"})
      EXPECT_GE(split.at(section).get<double>(), 0.0) << section;
    for (const char* section : {"load", "prefill", "decode", "depths"})
      EXPECT_GT(split.at(section).get<double>(), 0.0) << section;
    const double wall_s = j.at("wall_s").get<double>();
    EXPECT_LE(wall_s, bench_elapsed_s);
    EXPECT_GT(wall_s, 0.5 * bench_elapsed_s);
  }
  {
    // The prefill peak is the higher of the probes right before and right after the prompt's runs.
    const nlohmann::json& p = j.at("prefill").at("16");
    const nlohmann::json& peaks = p.at("peak_gflops_before_after");
    ASSERT_EQ(peaks.size(), 2u);
    EXPECT_EQ(p.at("peak_gflops").get<double>(), std::max(peaks[0].get<double>(), peaks[1].get<double>()));
    // Against the table's GEMM peak; where the table runs the MXFP4 GEMMs on AMX tiles, their FLOPs at the tile
    // unit's peak (measured too).
    const double achieved = p.at("achieved_gflops").get<double>(), peak = p.at("peak_gflops").get<double>();
    double expected = achieved / peak;
    const int64_t tile_rows = j.at("fp4_amx_min_rows").get<int64_t>();
    EXPECT_EQ(p.contains("tiles_peak_gflops"), tile_rows > 0 && 16 >= tile_rows);
    if (p.contains("tiles_peak_gflops")) {
      const double fp4_share = p.at("fp4_flops").get<double>() / p.at("flops").get<double>();
      EXPECT_GT(fp4_share, 0.0);
      expected = achieved * ((1 - fp4_share) / peak + fp4_share / p.at("tiles_peak_gflops").get<double>());
    }
    EXPECT_NEAR(p.at("peak_fraction").get<double>(), expected, 1e-9);
  }
  EXPECT_GT(j.at("read_gbps").get<double>(), 0.0);
  EXPECT_GT(j.at("peak_gflops").get<double>(), 0.0);
  EXPECT_GT(j.at("decode_step_ms_by_depth").at("256").get<double>(), 0.0);
  // Where the table multiplies with another instruction than the bf16 dot, both figures also against its peak
  // (only where the CPU has a bf16 dot product: an AVX2-only machine has no second peak to measure).
  const bool has_bf16_dot = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
  const bool other_instruction = has_bf16_dot && j.at("peak_kernel").get<std::string>() != "avx512bf16 vdpbf16ps";
  EXPECT_EQ(j.contains("prefill_bf16_dot_peak_fraction"), other_instruction);
  EXPECT_EQ(j.contains("bf16_dot_peak_gflops"), other_instruction);
  if (other_instruction) {
    EXPECT_GT(j.at("prefill_bf16_dot_peak_fraction").get<double>(), 0.0);
    // The same achieved rate against each peak.
    const nlohmann::json& p = j.at("prefill").at("16");
    EXPECT_NEAR(p.at("bf16_dot_peak_fraction").get<double>(),
                p.at("achieved_gflops").get<double>() / p.at("bf16_dot_peak_gflops").get<double>(), 1e-9);
  }
  for (const char* batch : {"1", "2"}) {
    SCOPED_TRACE(std::string("batch ") + batch);
    const nlohmann::json& d = j.at("decode").at("256").at(batch);
    EXPECT_GT(d.at("roofline_fraction").get<double>(), 0.0);
    // The roofline takes the higher of the probes run right before and right after the batch (the fraction errs
    // low where the machine's limits drift).
    const nlohmann::json& reads = d.at("read_gbps_before_after");
    const nlohmann::json& peaks = d.at("peak_gflops_before_after");
    ASSERT_EQ(reads.size(), 2u);
    ASSERT_EQ(peaks.size(), 2u);
    const double read = std::max(reads[0].get<double>(), reads[1].get<double>());
    const double peak = std::max(peaks[0].get<double>(), peaks[1].get<double>());
    EXPECT_GT(std::min(reads[0].get<double>(), reads[1].get<double>()), 0.0);
    const double flops = d.at("flops").get<double>();
    double compute_s = flops / (peak * 1e9);
    const int64_t tile_rows = j.at("fp4_amx_min_rows").get<int64_t>();
    EXPECT_EQ(d.contains("tiles_peak_gflops"), tile_rows > 0 && std::stoll(batch) >= tile_rows);
    if (d.contains("tiles_peak_gflops")) {
      const double fp4_flops = d.at("fp4_flops").get<double>();
      compute_s = (flops - fp4_flops) / (peak * 1e9) + fp4_flops / (d.at("tiles_peak_gflops").get<double>() * 1e9);
    }
    const double roofline_ms = 1e3 * std::max(d.at("weight_bytes").get<double>() / (read * 1e9), compute_s);
    EXPECT_NEAR(d.at("roofline_fraction").get<double>(), roofline_ms / d.at("step_ms").get<double>(),
                1e-9 * d.at("roofline_fraction").get<double>());
    EXPECT_EQ(j.at(std::string("decode_roofline_fraction_batch") + batch).get<double>(),
              d.at("roofline_fraction").get<double>());
    EXPECT_EQ(d.contains("bf16_dot_roofline_fraction"), other_instruction);
    if (other_instruction) {
      EXPECT_GT(d.at("bf16_dot_roofline_fraction").get<double>(), 0.0);
      EXPECT_EQ(j.at(std::string("decode_bf16_dot_roofline_fraction_batch") + batch).get<double>(),
                d.at("bf16_dot_roofline_fraction").get<double>());
    }
    // The phases split the timed step: each is >= 0 and together they are the step, up to the clock reads
    // between the step's own timer and the profile's.
    double phases = 0;
    for (const char* phase : {"linear", "attention", "indexer", "other"}) {
      const double ms = d.at("phase_ms").at(phase).get<double>();
      EXPECT_GE(ms, 0.0) << phase;
      phases += ms;
    }
    const double step_ms = d.at("step_ms").get<double>();
    EXPECT_GT(d.at("phase_ms").at("linear").get<double>(), 0.0);
    EXPECT_NEAR(phases, step_ms, 0.1 * step_ms + 0.05);
  }
}

// --no-exact: the prefill rows of the default plan only (its speed and peak fraction), none of the exact plan's.
TEST(BenchCli, NoExactRunsTheDefaultPlanOnly) {
  if (!fs::exists(shared_tokenizer())) GTEST_SKIP() << "no shared tokenizer";
  const TinyCheckpoint tiny;
  ASSERT_EQ(tiny.made.exit_code, 0) << tiny.made.err;
  const CliRun bench = run_dsflash({"bench", "-m", tiny.dir.string(), "-p", "16", "-n", "1", "-r", "1", "--batch",
                                    "1", "--depth", "256", "--threads", "2", "--json", "--no-exact"});
  ASSERT_EQ(bench.exit_code, 0) << bench.err;
  const nlohmann::json j = nlohmann::json::parse(bench.out);
  const nlohmann::json& p = j.at("prefill").at("16");
  EXPECT_GT(p.at("tps_default").get<double>(), 0.0);
  EXPECT_GT(p.at("peak_fraction").get<double>(), 0.0);
  EXPECT_GT(j.at("prefill_tps_default").get<double>(), 0.0);
  for (const char* key : {"tps_exact", "tps_exact_sd", "cost_ratio", "cost_ratio_sd"})
    EXPECT_FALSE(p.contains(key)) << key;
  EXPECT_FALSE(j.contains("prefill_tps_exact"));
  EXPECT_FALSE(j.contains("prefill_cost_ratio"));
}

TEST(BenchCli, RejectsZeroDecodeStepsOrRepetitionsBeforeLoading) {
  // A run with no measured step has no figure to report: refused at the command line (the model path need not
  // exist, nothing is loaded).
  for (const char* flag : {"--decode", "--repetitions"}) {
    const CliRun bench = run_dsflash({"bench", "-m", "no-such-model", flag, "0"});
    EXPECT_NE(bench.exit_code, 0) << flag;
    EXPECT_NE(bench.err.find(std::string(flag) + ": Value 0 not in range"), std::string::npos) << bench.err;
  }
}

}  // namespace
