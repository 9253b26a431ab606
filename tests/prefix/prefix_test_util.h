// Shared helpers of the prefix-cache tests: deterministic records and scratch directories.
#pragma once

#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>

#include "prefix/block_record.h"

namespace dsflash::testing {

inline prefix::Fingerprint test_fingerprint(uint64_t n = 1) { return {0x1234567890abcdefull * n, 0xfedcba0987654321ull + n}; }

inline prefix::RecordExpectation test_expectation(uint64_t kv_bytes = 512, uint32_t tokens = 64) {
  return {test_fingerprint(), kv_bytes, tokens};
}

// A record whose content is a function of `hash` (so a reader can check what it got).
inline prefix::BlockRecord test_record(uint64_t hash, uint64_t kv_bytes = 512, uint32_t tokens = 64) {
  prefix::BlockRecord r;
  r.fingerprint = test_fingerprint();
  r.block_hash = hash;
  r.parent_hash = hash * 31 + 7;
  r.block_index = hash % 1000;
  r.created_unix_s = 1700000000;
  std::mt19937_64 rng(hash);
  for (uint32_t i = 0; i < tokens; ++i) r.tokens.push_back(static_cast<int32_t>(rng() % 100000));
  for (uint64_t i = 0; i < kv_bytes; ++i) r.kv.push_back(static_cast<uint8_t>(rng()));
  return r;
}

inline bool same_record(const prefix::BlockRecord& a, const prefix::BlockRecord& b) {
  return a.fingerprint == b.fingerprint && a.block_hash == b.block_hash && a.parent_hash == b.parent_hash &&
         a.block_index == b.block_index && a.tokens == b.tokens && a.kv == b.kv;
}

// A fresh directory under the system temp dir, removed at the end of the test.
class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "dsflash-prefix-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~ScratchDir() {
    if (mounted_) ::umount(path_.c_str());
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  // Mounts a small tmpfs here (root only; false when the machine does not allow it).
  bool mount_tmpfs(const std::string& options, unsigned long flags = 0) {
    mounted_ = ::mount("tmpfs", path_.c_str(), "tmpfs", flags, options.c_str()) == 0;
    return mounted_;
  }

 private:
  std::string path_;
  bool mounted_ = false;
};

}  // namespace dsflash::testing
