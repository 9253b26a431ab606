// `dsflash inspect` end to end through its CLI11 subcommand: text and JSON output, exit codes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "apps/cli_run.h"

namespace {

using ::testing::HasSubstr;

using dsflash::testing::CliRun;
using dsflash::testing::run_dsflash;

const std::string kShared = DSFLASH_SHARED_DIR;

TEST(Inspect, RealConfigJsonWithExpectedTensors) {
  CliRun r = run_dsflash({"inspect", "--config", kShared + "/spec/config_v41_flash.json", "--json", "--expected-tensors"});
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
  CliRun root = run_dsflash({"inspect", "--config", kShared + "/spec/config_v41_flash.json", "--json"});
  CliRun flat = run_dsflash({"inspect", "--config", kShared + "/spec/inference_config_v41_flash.json", "--json"});
  ASSERT_EQ(root.exit_code, 0);
  ASSERT_EQ(flat.exit_code, 0);
  EXPECT_EQ(root.out, flat.out);
}

TEST(Inspect, GoldenCheckpointText) {
  CliRun r = run_dsflash({"inspect", "-m", kShared + "/goldens/tiny-b/checkpoint"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Checkpoint tensors: 1,225 tensors, 12,500,337 bytes"));
  EXPECT_THAT(r.out, HasSubstr("I8"));
  EXPECT_THAT(r.out, HasSubstr("mtp.2"));
  EXPECT_THAT(r.out, HasSubstr("global total        280 B/token"));
}

TEST(Inspect, ErrorsAreOneLineWithExitCodes) {
  CliRun missing = run_dsflash({"inspect", "-m", "/nonexistent-dsflash-model"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.err, HasSubstr("/nonexistent-dsflash-model"));
  EXPECT_TRUE(missing.out.empty());
  CliRun neither = run_dsflash({"inspect"});
  EXPECT_EQ(neither.exit_code, 2);
  CliRun both = run_dsflash({"inspect", "-m", "a", "--config", "b"});
  EXPECT_EQ(both.exit_code, 2);
}

}  // namespace
