// `dsflash inspect` end to end through its CLI11 subcommand: text and JSON output, exit codes.
#include <CLI/CLI.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "commands.h"

namespace {

using ::testing::HasSubstr;

struct InspectRun {
  int exit_code = -1;
  std::string out, err;
};

// Parses and runs `args` (argv without the program name) with stdout/stderr captured.
InspectRun run_inspect(std::vector<std::string> args) {
  CLI::App app{"dsflash"};
  app.require_subcommand(1);
  InspectRun r;
  r.exit_code = 0;
  dsflash::cli::add_inspect_command(app, &r.exit_code);
  std::reverse(args.begin(), args.end());  // CLI11 takes the arguments in reverse order
  std::ostringstream out, err;
  auto* old_out = std::cout.rdbuf(out.rdbuf());
  auto* old_err = std::cerr.rdbuf(err.rdbuf());
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    r.exit_code = app.exit(e);
  }
  std::cout.rdbuf(old_out);
  std::cerr.rdbuf(old_err);
  r.out = out.str();
  r.err = err.str();
  return r;
}

const std::string kShared = DSFLASH_SHARED_DIR;

TEST(Inspect, RealConfigJsonWithExpectedTensors) {
  InspectRun r = run_inspect({"inspect", "--config", kShared + "/spec/config_v41_flash.json", "--json", "--expected-tensors"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["global_kv_bytes_per_token"], 890);
  EXPECT_EQ(j["window_bytes_per_row"], 528);
  EXPECT_EQ(j["persistent_bytes_per_token"], 890);
  EXPECT_EQ(j["num_tensors_expected"], 96085);
  EXPECT_EQ(j["bytes_expected"], 510286023000);
  EXPECT_GT(j["activated_params_decode"].get<int64_t>(), j["activated_params_prefill"].get<int64_t>());
  EXPECT_EQ(j["roles"].size(), 43u);
  EXPECT_EQ(j["expected_tensors"].size(), 96085u);
}

TEST(Inspect, FlatConfigGivesTheSameJson) {
  InspectRun root = run_inspect({"inspect", "--config", kShared + "/spec/config_v41_flash.json", "--json"});
  InspectRun flat = run_inspect({"inspect", "--config", kShared + "/spec/inference_config_v41_flash.json", "--json"});
  ASSERT_EQ(root.exit_code, 0);
  ASSERT_EQ(flat.exit_code, 0);
  EXPECT_EQ(root.out, flat.out);
}

TEST(Inspect, GoldenCheckpointText) {
  InspectRun r = run_inspect({"inspect", "-m", kShared + "/goldens/tiny-b/checkpoint"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Checkpoint tensors: 1,225 tensors, 12,500,337 bytes"));
  EXPECT_THAT(r.out, HasSubstr("I8"));
  EXPECT_THAT(r.out, HasSubstr("mtp.2"));
  EXPECT_THAT(r.out, HasSubstr("global total        280 B/token"));
}

TEST(Inspect, ErrorsAreOneLineWithExitCodes) {
  InspectRun missing = run_inspect({"inspect", "-m", "/nonexistent-dsflash-model"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.err, HasSubstr("/nonexistent-dsflash-model"));
  EXPECT_TRUE(missing.out.empty());
  InspectRun neither = run_inspect({"inspect"});
  EXPECT_EQ(neither.exit_code, 2);
  InspectRun both = run_inspect({"inspect", "-m", "a", "--config", "b"});
  EXPECT_EQ(both.exit_code, 2);
}

}  // namespace
