// `dsflash generate` fixes: the end-of-sentence id ends generation and is never printed (ids or text); a missing
// model directory is reported as such (not as a missing tokenizer.json); a negative -n gets a readable message;
// --stop strings cut the output.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "apps/cli_run.h"
#include "model/golden_tensors.h"

namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using dsflash::testing::CliRun;
using dsflash::testing::run_dsflash;

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

class GenerateCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!dsflash::testing::goldens_present()) GTEST_SKIP() << "goldens not found";
  }
  const std::string model_ = dsflash::testing::golden_checkpoint_dir("tiny-a");
};

// A copy of tiny-a whose end-of-sentence id is the third id greedy generation produces.
TEST_F(GenerateCli, EndOfSentenceIdIsNotOutput) {
  CliRun free_run = run_dsflash({"generate", "-m", model_, "--tokens", "0,17,300", "-n", "6", "--ids"});
  ASSERT_EQ(free_run.exit_code, 0) << free_run.err;
  const auto ids = lines(free_run.out);
  ASSERT_EQ(ids.size(), 6u);
  const std::string eos = ids[2];
  const size_t first = static_cast<size_t>(std::find(ids.begin(), ids.end(), eos) - ids.begin());

  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("dsflash_test_eos_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  for (const auto& entry : std::filesystem::directory_iterator(model_)) {
    if (entry.path().filename() == "config.json") continue;
    std::filesystem::create_symlink(entry.path(), dir / entry.path().filename());
  }
  std::ifstream in(std::filesystem::path(model_) / "config.json");
  std::stringstream config;
  config << in.rdbuf();
  std::ofstream(dir / "config.json")
      << std::regex_replace(config.str(), std::regex("\"eos_token_id\": *[0-9]+"), "\"eos_token_id\": " + eos);

  CliRun stopped = run_dsflash({"generate", "-m", dir.string(), "--tokens", "0,17,300", "-n", "6", "--ids"});
  ASSERT_EQ(stopped.exit_code, 0) << stopped.err;
  EXPECT_EQ(lines(stopped.out), std::vector<std::string>(ids.begin(), ids.begin() + static_cast<int64_t>(first)));
  // Text mode: the same text as the ids before the stop, without the end-of-sentence token's text.
  CliRun text = run_dsflash({"generate", "-m", dir.string(), "--tokens", "0,17,300", "-n", "6"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  CliRun text_free = run_dsflash({"generate", "-m", model_, "--tokens", "0,17,300", "-n", std::to_string(first)});
  ASSERT_EQ(text_free.exit_code, 0) << text_free.err;
  EXPECT_EQ(text.out, text_free.out);
  std::filesystem::remove_all(dir);
}

TEST_F(GenerateCli, MissingModelDirectoryIsReportedAsSuch) {
  for (const char* source : {"-p", "--tokens"}) {
    CliRun r = run_dsflash({"generate", "-m", "/no/such/dir", source, source == std::string("-p") ? "hello" : "1,2"});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_THAT(r.err, HasSubstr("model directory /no/such/dir does not exist"));
    EXPECT_THAT(r.err, Not(HasSubstr("tokenizer.json")));
  }
}

TEST_F(GenerateCli, NegativeMaxTokensGetsAReadableMessage) {
  CliRun r = run_dsflash({"generate", "-m", model_, "--tokens", "1,2", "-n", "-3"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("must be a whole number >= 0, got -3"));
  EXPECT_LT(r.err.size(), 200u) << r.err;
}

TEST_F(GenerateCli, StopStringCutsTheOutput) {
  CliRun free_run = run_dsflash({"generate", "-m", model_, "--tokens", "0,17,300", "-n", "8"});
  ASSERT_EQ(free_run.exit_code, 0) << free_run.err;
  const std::string text = free_run.out.substr(0, free_run.out.size() - 1);  // without the final newline
  ASSERT_GE(text.size(), 4u);
  const std::string stop = text.substr(text.size() / 2, 2);
  CliRun r = run_dsflash({"generate", "-m", model_, "--tokens", "0,17,300", "-n", "8", "--stop", stop});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, text.substr(0, text.find(stop)) + "\n");
}

}  // namespace
