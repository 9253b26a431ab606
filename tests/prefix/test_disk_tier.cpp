// The SSD tier: write behind, read back verified, restart, LRU by bytes, damage, foreign files, broken
// directories, several processes, and writers killed at random moments.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <random>
#include <thread>

#include "prefix/disk_tier.h"
#include "prefix_test_util.h"

namespace dsflash::testing {
namespace {

using prefix::DiskTier;
using prefix::DiskTierOptions;

std::unique_ptr<DiskTier> open_tier(const std::string& dir, int64_t budget = int64_t{1} << 30, int64_t queue = 256) {
  DiskTierOptions options;
  options.dir = dir;
  options.budget_bytes = budget;
  options.writer_queue_records = queue;
  return DiskTier::open(options, test_expectation());
}

const int64_t kRecordFileBytes = static_cast<int64_t>(prefix::encode_record(test_record(0)).size());

TEST(DiskTier, WritesBehindAndReadsBackVerified) {
  ScratchDir dir;
  auto tier = open_tier(dir.path());
  ASSERT_TRUE(tier->enabled());
  for (uint64_t h = 1; h <= 5; ++h) EXPECT_TRUE(tier->write_async(test_record(h)));
  tier->flush();
  for (uint64_t h = 1; h <= 5; ++h) {
    auto r = tier->read(h);
    ASSERT_TRUE(r.has_value()) << h;
    EXPECT_TRUE(same_record(*r, test_record(h)));
  }
  EXPECT_FALSE(tier->read(99).has_value());
  const auto s = tier->stats();
  EXPECT_EQ(s.records, 5);
  EXPECT_EQ(s.bytes, 5 * kRecordFileBytes);
  EXPECT_EQ(s.writes, 5);
  EXPECT_EQ(s.hits, 5);
  EXPECT_EQ(s.misses, 1);
}

TEST(DiskTier, RestartFindsTheRecordsAgain) {
  ScratchDir dir;
  {
    auto tier = open_tier(dir.path());
    for (uint64_t h = 1; h <= 20; ++h) tier->write_async(test_record(h));
  }  // the destructor writes what is queued
  auto again = open_tier(dir.path());
  EXPECT_EQ(again->stats().records, 20);
  for (uint64_t h = 1; h <= 20; ++h) {
    auto r = again->read(h);
    ASSERT_TRUE(r.has_value());
    EXPECT_TRUE(same_record(*r, test_record(h)));
  }
}

TEST(DiskTier, EvictsLeastRecentlyUsedByBytes) {
  ScratchDir dir;
  auto tier = open_tier(dir.path(), 3 * kRecordFileBytes);
  for (uint64_t h = 1; h <= 3; ++h) tier->write_async(test_record(h));
  tier->flush();
  ASSERT_TRUE(tier->read(1).has_value());  // 1 becomes the most recently used
  tier->write_async(test_record(4));
  tier->flush();
  EXPECT_EQ(tier->stats().records, 3);
  EXPECT_EQ(tier->stats().evicted, 1);
  EXPECT_FALSE(tier->read(2).has_value());  // the least recently used went
  EXPECT_TRUE(tier->read(1).has_value());
  EXPECT_TRUE(tier->read(4).has_value());
  EXPECT_LE(tier->stats().bytes, 3 * kRecordFileBytes);
}

TEST(DiskTier, DamagedTruncatedAndEmptyRecordsAreRemovedOnceAndNeverUsed) {
  ScratchDir dir;
  auto tier = open_tier(dir.path());
  for (uint64_t h = 1; h <= 3; ++h) tier->write_async(test_record(h));
  tier->flush();
  const std::string m = tier->model_dir();
  {
    std::fstream f(m + "/0000000000000001.kvb", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(300);
    f.put('\x55');
  }
  std::filesystem::resize_file(m + "/0000000000000002.kvb", 100);
  std::filesystem::resize_file(m + "/0000000000000003.kvb", 0);
  for (uint64_t h = 1; h <= 3; ++h) EXPECT_FALSE(tier->read(h).has_value()) << h;
  EXPECT_EQ(tier->stats().corrupt_removed, 3);
  EXPECT_EQ(tier->take_notices().size(), 3u);
  for (uint64_t h = 1; h <= 3; ++h) EXPECT_FALSE(std::filesystem::exists(m + "/000000000000000" + std::to_string(h) + ".kvb"));
  EXPECT_FALSE(tier->read(1).has_value());
  EXPECT_TRUE(tier->take_notices().empty());  // reported once
}

TEST(DiskTier, RecordUnderTheWrongNameOrFromAnotherModelIsRejected) {
  ScratchDir dir;
  auto tier = open_tier(dir.path());
  const std::string m = tier->model_dir();
  // Block 5's bytes under block 6's name.
  {
    const auto bytes = prefix::encode_record(test_record(5));
    std::ofstream(m + "/0000000000000006.kvb", std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                                                       static_cast<std::streamsize>(bytes.size()));
    auto other = test_record(7);
    other.fingerprint = test_fingerprint(9);
    const auto foreign = prefix::encode_record(other);
    std::ofstream(m + "/0000000000000007.kvb", std::ios::binary).write(reinterpret_cast<const char*>(foreign.data()),
                                                                       static_cast<std::streamsize>(foreign.size()));
  }
  EXPECT_FALSE(tier->read(6).has_value());
  EXPECT_FALSE(tier->read(7).has_value());
  EXPECT_EQ(tier->stats().corrupt_removed, 2);
}

TEST(DiskTier, ForeignFilesAreIgnoredAndLeftAlone) {
  ScratchDir dir;
  const std::string m = open_tier(dir.path())->model_dir();
  std::ofstream(m + "/notes.txt") << "hello";
  std::ofstream(m + "/zzzzzzzzzzzzzzzz.kvb") << "not hex";
  std::filesystem::create_directory(m + "/subdir");
  std::ofstream(dir.path() + "/README") << "top-level file";
  auto tier = open_tier(dir.path());
  EXPECT_TRUE(tier->enabled());
  EXPECT_EQ(tier->stats().records, 0);
  EXPECT_EQ(tier->stats().foreign_files, 3);
  EXPECT_TRUE(std::filesystem::exists(m + "/notes.txt"));
  auto models = prefix::scan_cache_dir(dir.path());
  ASSERT_TRUE(models.ok());
  ASSERT_EQ(models->size(), 1u);
  EXPECT_EQ((*models)[0].foreign_files, 3);
}

TEST(DiskTier, ADeadWritersTemporaryFileIsRemovedAtOpen) {
  ScratchDir dir;
  const std::string m = open_tier(dir.path())->model_dir();
  pid_t dead = 0;
  const pid_t child = fork();
  if (child == 0) _exit(0);
  waitpid(child, nullptr, 0);
  dead = child;  // reaped: no such process now
  const std::string leftover = m + "/.0000000000000001." + std::to_string(dead) + ".1.tmp";
  std::ofstream(leftover) << "half a record";
  auto tier = open_tier(dir.path());
  EXPECT_FALSE(std::filesystem::exists(leftover));
}

TEST(DiskTier, AFullQueueDropsInsteadOfBlocking) {
  ScratchDir dir;
  auto tier = open_tier(dir.path(), int64_t{1} << 30, 0);
  EXPECT_FALSE(tier->write_async(test_record(1)));
  EXPECT_EQ(tier->stats().dropped_writes, 1);
}

TEST(DiskTier, MissingDirectoryThatCannotBeCreatedDisablesTheTier) {
  ScratchDir dir;
  std::ofstream(dir.path() + "/a-file") << "x";
  auto tier = open_tier(dir.path() + "/a-file/cache");
  EXPECT_FALSE(tier->enabled());
  const auto notices = tier->take_notices();
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_NE(notices[0].find("SSD tier off"), std::string::npos);
  EXPECT_FALSE(tier->write_async(test_record(1)));
  EXPECT_FALSE(tier->read(1).has_value());
}

TEST(DiskTier, ReadOnlyDirectoryDisablesTheTier) {
  ScratchDir dir;
  if (!dir.mount_tmpfs("size=1m", MS_RDONLY)) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  auto tier = open_tier(dir.path());
  EXPECT_FALSE(tier->enabled());
  EXPECT_EQ(tier->take_notices().size(), 1u);
}

TEST(DiskTier, FullDiskDisablesTheTierOnceAndKeepsWhatWasWritten) {
  ScratchDir dir;
  if (!dir.mount_tmpfs("size=64k")) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  auto tier = open_tier(dir.path());
  ASSERT_TRUE(tier->enabled());
  for (uint64_t h = 1; h <= 200; ++h) tier->write_async(test_record(h));
  tier->flush();
  EXPECT_FALSE(tier->enabled());
  const auto notices = tier->take_notices();
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_NE(notices[0].find("No space"), std::string::npos) << notices[0];
  const int64_t written = tier->stats().writes;
  EXPECT_GT(written, 0);
  auto again = open_tier(dir.path());  // full: the probe fails, so it is off, but nothing crashes
  EXPECT_FALSE(again->enabled());
}

// Two processes write overlapping record sets into one directory at the same time; afterwards every record reads
// back verified.
TEST(DiskTier, TwoProcessesShareADirectory) {
  ScratchDir dir;
  pid_t children[2];
  for (int c = 0; c < 2; ++c) {
    children[c] = fork();
    if (children[c] == 0) {
      auto tier = open_tier(dir.path());
      for (uint64_t h = 1 + 20 * static_cast<uint64_t>(c); h <= 60 + 20 * static_cast<uint64_t>(c); ++h) tier->write_async(test_record(h));
      tier->flush();
      for (uint64_t h = 1; h <= 100; ++h) {
        auto r = tier->read(h);
        if (r && !same_record(*r, test_record(h))) _exit(3);
      }
      _exit(0);
    }
  }
  for (pid_t child : children) {
    int status = 0;
    waitpid(child, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  auto tier = open_tier(dir.path());
  EXPECT_EQ(tier->stats().records, 80);  // 1..60 and 21..80
  for (uint64_t h = 1; h <= 80; ++h) {
    auto r = tier->read(h);
    ASSERT_TRUE(r.has_value()) << h;
    EXPECT_TRUE(same_record(*r, test_record(h)));
  }
  EXPECT_EQ(tier->stats().corrupt_removed, 0);
}

// Fault injection: a writer process is killed with SIGKILL at a random moment, many times; every run on the
// directory afterwards sees only whole, verified records (or none), and leftovers are cleaned.
TEST(DiskTier, WritersKilledAtRandomMomentsNeverLeaveABadRecord) {
  ScratchDir dir;
  std::mt19937 rng(77);
  const int rounds = 40;
  for (int round = 0; round < rounds; ++round) {
    const pid_t child = fork();
    if (child == 0) {
      auto tier = open_tier(dir.path(), 40 * kRecordFileBytes);
      for (uint64_t h = 1;; h = h % 200 + 1) tier->write_async(test_record(h));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(500 + rng() % 20000));
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    auto tier = open_tier(dir.path(), 40 * kRecordFileBytes);
    ASSERT_TRUE(tier->enabled());
    for (uint64_t h = 1; h <= 200; ++h) {
      auto r = tier->read(h);
      if (r) {
        EXPECT_TRUE(same_record(*r, test_record(h))) << "round " << round << " block " << h;
      }
    }
    EXPECT_EQ(tier->stats().corrupt_removed, 0) << "round " << round;
  }
  int temporaries = 0;
  for (const auto& sub : std::filesystem::recursive_directory_iterator(dir.path())) {
    temporaries += sub.path().extension() == ".tmp";
  }
  EXPECT_EQ(temporaries, 0);
}

}  // namespace
}  // namespace dsflash::testing
