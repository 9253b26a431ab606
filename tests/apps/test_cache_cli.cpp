// The prefix cache through the CLI: `dsflash logits --cache-dir` reports cached_tokens and ttft_s, a second run
// hits what the first stored, `dsflash cache stats|verify|clear`, and the bad cases (a damaged directory gives the
// logits of a run without a cache bit for bit; a directory that cannot be used is said once and the run goes on).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mount.h>

#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "apps/cli_run.h"
#include "model/golden_tensors.h"
#include "prefix/prefix_test_util.h"

namespace {

using ::testing::HasSubstr;
using dsflash::testing::CliRun;
using dsflash::testing::run_dsflash;
using dsflash::testing::ScratchDir;

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

class CacheCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!dsflash::testing::goldens_present()) GTEST_SKIP() << "goldens not found";
    std::mt19937 rng(3);
    for (int i = 0; i < 500; ++i) ids_ += (i ? "," : "") + std::to_string(3 + rng() % 2000);
  }
  // logits with `extra` options; returns the JSON line (and the logits file bytes in *logits).
  nlohmann::json logits(const std::vector<std::string>& extra, std::string* logits_bytes = nullptr,
                        std::string* err = nullptr) {
    std::vector<std::string> args = {"logits", "-m", model_, "--tokens", ids_, "-n", "2", "--out", out_.path() + "/l.bin"};
    args.insert(args.end(), extra.begin(), extra.end());
    CliRun r = run_dsflash(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    if (logits_bytes) *logits_bytes = file_bytes(out_.path() + "/l.bin");
    if (err) *err = r.err;
    return r.exit_code == 0 ? nlohmann::json::parse(r.out) : nlohmann::json();
  }
  const std::string model_ = dsflash::testing::golden_checkpoint_dir("tiny-a");
  std::string ids_;
  ScratchDir out_;
};

TEST_F(CacheCli, ASecondRunHitsWhatTheFirstStored) {
  ScratchDir cache;
  std::string cold_bytes, hit_bytes, plain_bytes;
  const auto cold = logits({"--cache-dir", cache.path()}, &cold_bytes);
  EXPECT_EQ(cold["cached_tokens"], 0);
  EXPECT_GT(cold["ttft_s"].get<double>(), 0.0);
  const auto plain = logits({"--no-prefix-cache"}, &plain_bytes);
  EXPECT_EQ(cold_bytes, plain_bytes);  // a cache that holds nothing changes nothing
  const auto hit = logits({"--cache-dir", cache.path()}, &hit_bytes);
  EXPECT_EQ(hit["cached_tokens"], 448);  // 7 whole blocks before the last prompt token
  EXPECT_EQ(hit["generated"][0], cold["generated"][0]);

  CliRun stats = run_dsflash({"cache", "stats", "--cache-dir", cache.path(), "--json"});
  ASSERT_EQ(stats.exit_code, 0) << stats.err;
  const auto s = nlohmann::json::parse(stats.out);
  ASSERT_EQ(s["models"].size(), 1u);
  EXPECT_EQ(s["models"][0]["records"], 7);
  CliRun verify = run_dsflash({"cache", "verify", "--cache-dir", cache.path(), "--json"});
  EXPECT_EQ(verify.exit_code, 0) << verify.out;
  EXPECT_EQ(nlohmann::json::parse(verify.out)["models"][0]["tokens"], 448);
  CliRun clear = run_dsflash({"cache", "clear", "--cache-dir", cache.path()});
  EXPECT_EQ(clear.exit_code, 0);
  EXPECT_THAT(clear.out, HasSubstr("removed 7 files"));
  EXPECT_EQ(logits({"--cache-dir", cache.path()})["cached_tokens"], 0);
}

TEST_F(CacheCli, DamagedRecordsAreFoundByVerifyAndNeverChangeAnAnswer) {
  ScratchDir cache;
  std::string plain_bytes, damaged_bytes;
  logits({"--cache-dir", cache.path()});
  for (const auto& f : std::filesystem::recursive_directory_iterator(cache.path())) {
    if (f.path().extension() != ".kvb") continue;
    std::fstream io(f.path(), std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(500);
    io.put('\x33');
  }
  CliRun verify = run_dsflash({"cache", "verify", "--cache-dir", cache.path()});
  EXPECT_EQ(verify.exit_code, 1);
  EXPECT_THAT(verify.out, HasSubstr("checksum mismatch"));
  std::string err;
  const auto run = logits({"--cache-dir", cache.path()}, &damaged_bytes, &err);
  logits({"--no-prefix-cache"}, &plain_bytes);
  EXPECT_EQ(run["cached_tokens"], 0);
  EXPECT_EQ(damaged_bytes, plain_bytes);
}

TEST_F(CacheCli, AnUnusableDirectoryIsSaidOnceAndTheRunGoesOn) {
  ScratchDir blocker;
  std::ofstream(blocker.path() + "/file") << "x";
  std::string err, bytes, plain_bytes;
  const auto run = logits({"--cache-dir", blocker.path() + "/file/cache"}, &bytes, &err);
  EXPECT_EQ(run["cached_tokens"], 0);
  EXPECT_THAT(err, HasSubstr("SSD tier off"));
  logits({"--no-prefix-cache"}, &plain_bytes);
  EXPECT_EQ(bytes, plain_bytes);
  ScratchDir read_only;
  if (!read_only.mount_tmpfs("size=1m", MS_RDONLY)) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  const auto ro = logits({"--cache-dir", read_only.path()}, &bytes, &err);
  EXPECT_EQ(ro["cached_tokens"], 0);
  EXPECT_THAT(err, HasSubstr("SSD tier off"));
  EXPECT_EQ(bytes, plain_bytes);
}

TEST_F(CacheCli, AFullDiskKeepsTheRunGoing) {
  ScratchDir full;
  if (!full.mount_tmpfs("size=48k")) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  std::string err, bytes, plain_bytes;
  const auto run = logits({"--cache-dir", full.path()}, &bytes, &err);
  EXPECT_THAT(err, HasSubstr("No space"));
  logits({"--no-prefix-cache"}, &plain_bytes);
  EXPECT_EQ(bytes, plain_bytes);
  EXPECT_EQ(run["cached_tokens"], 0);
}

}  // namespace
