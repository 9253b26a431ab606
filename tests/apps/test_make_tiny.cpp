// `dsflash make-tiny` end to end through its CLI11 subcommand: writes, verifies, refuses a non-empty directory
// unless --force, rejects an unknown preset.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>

#include "apps/cli_run.h"
#include "io/checkpoint.h"

namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

using dsflash::testing::CliRun;
using dsflash::testing::run_dsflash;

class MakeTinyCli : public ::testing::Test {
 protected:
  void SetUp() override {
    tokenizer_ = (fs::path(DSFLASH_SHARED_DIR) / "tokenizer" / "deepseek_v3_tokenizer.json").string();
    if (!fs::exists(tokenizer_)) GTEST_SKIP() << "no shared tokenizer";
    std::random_device rd;
    dir_ = fs::temp_directory_path() / ("dsflash-make-tiny-cli-" + std::to_string(rd()) + std::to_string(rd()));
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string tokenizer_;
  fs::path dir_;
};

TEST_F(MakeTinyCli, WritesVerifiesAndRefusesToOverwrite) {
  const std::vector<std::string> args = {"make-tiny", "--preset", "tiny", "-o", dir_.string(), "--seed", "3",
                                         "--tokenizer", tokenizer_};
  CliRun first = run_dsflash(args);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_THAT(first.out, HasSubstr("1028 tensors"));
  EXPECT_THAT(first.out, HasSubstr("verified"));
  EXPECT_TRUE(dsflash::Checkpoint::open(dir_.string()).ok());

  CliRun again = run_dsflash(args);
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_THAT(again.err, HasSubstr("not empty"));

  std::vector<std::string> forced = args;
  forced.push_back("--force");
  EXPECT_EQ(run_dsflash(forced).exit_code, 0);
}

TEST_F(MakeTinyCli, RejectsUnknownPresetAndMissingOutput) {
  EXPECT_NE(run_dsflash({"make-tiny", "--preset", "huge", "-o", dir_.string()}).exit_code, 0);
  EXPECT_NE(run_dsflash({"make-tiny", "--preset", "tiny"}).exit_code, 0);
  EXPECT_FALSE(fs::exists(dir_));
}

}  // namespace
