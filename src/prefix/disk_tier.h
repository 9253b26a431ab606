// The SSD tier of the prefix cache (DESIGN.md "src/prefix"): block records (prefix/block_record.h) as one file each
// under DIR/<model fingerprint>/<block hash>.kvb, written behind the decode path by a bounded writer queue, read
// back on a RAM miss, evicted least recently used by bytes, and found again after a restart (the index is rebuilt
// from a directory scan at open: names, sizes and times only, no contents).
//
// Integrity: a file is written to a temporary name in the same directory, fsync'ed and renamed, so a reader sees
// either a whole record or none (a writer killed mid-write leaves only a temporary file, removed later once its
// process is gone). Every record is verified when read (prefix/block_record.h); one that fails is never used:
// counted, reported once (a notice), removed. Several processes may share a directory: names are content hashes,
// renames are atomic, lookups go to the file system (records another process wrote are found), and eviction
// passes hold an exclusive flock on DIR/<fingerprint>/.lock.
// Failures of the directory itself (missing and cannot be created, read-only, disk full) disable the tier: the run
// goes on without it and a notice says so once.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "prefix/block_record.h"

namespace dsflash::prefix {

struct DiskTierOptions {
  std::string dir;                              // the cache directory (created if missing)
  int64_t budget_bytes = int64_t{16} << 30;     // record bytes kept on disk (file sizes)
  int64_t writer_queue_records = 256;           // writes waiting at most; beyond, writes are dropped
};

struct DiskTierStats {
  bool enabled = false;
  int64_t records = 0;          // in this process's index
  int64_t bytes = 0;            // their file sizes
  int64_t hits = 0, misses = 0;
  int64_t writes = 0;           // records written
  int64_t dropped_writes = 0;   // refused: queue full or tier disabled
  int64_t corrupt_removed = 0;  // records that failed verification
  int64_t evicted = 0;          // records removed for the byte budget
  int64_t foreign_files = 0;    // files in the directory that are not records (left alone)
};

class DiskTier {
 public:
  // Never fails: a directory that cannot be used gives a disabled tier (enabled() false, a notice says why).
  static std::unique_ptr<DiskTier> open(const DiskTierOptions& options, const RecordExpectation& expect);
  ~DiskTier();  // writes what is queued, then stops the writer
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  bool enabled() const;
  // The directory holding this model's records.
  const std::string& model_dir() const { return model_dir_; }

  // The verified record of `block_hash`, or nullopt (a miss, a disabled tier, or a record that failed a check).
  std::optional<BlockRecord> read(uint64_t block_hash);
  // Queues a copy of `record` for writing; false when it was dropped (queue full, tier disabled).
  bool write_async(BlockRecord record);
  // Waits until every queued write is done (or dropped by a failure).
  void flush();

  DiskTierStats stats() const;
  // Messages to say once each (tier disabled, record removed as damaged); the caller logs them.
  std::vector<std::string> take_notices();

 private:
  DiskTier(const DiskTierOptions& options, const RecordExpectation& expect);
  void scan();                                  // builds the index from the directory
  void writer_loop();
  void write_one(const BlockRecord& record);
  void evict_over_budget();
  void disable(const std::string& reason);      // mutex held
  void touch(uint64_t hash, int64_t size);      // index insert / LRU bump, mutex held
  void forget(uint64_t hash);                   // mutex held
  std::string record_path(uint64_t hash) const;

  DiskTierOptions options_;
  RecordExpectation expect_;
  std::string model_dir_;

  mutable std::mutex mutex_;
  std::condition_variable wake_writer_, idle_;
  bool enabled_ = false;
  bool stopping_ = false;
  bool writing_ = false;
  std::deque<BlockRecord> queue_;
  struct Entry {
    int64_t size = 0;
    uint64_t last_used = 0;  // LRU clock (file mtime in ns at scan, then a counter above it)
  };
  std::map<uint64_t, Entry> index_;
  std::set<std::pair<uint64_t, uint64_t>> lru_;  // (last_used, hash), oldest first
  uint64_t clock_ = 0;
  int64_t bytes_ = 0;
  DiskTierStats counters_;
  std::vector<std::string> notices_;
  std::thread writer_;
};

// Names of a cache directory for `dsflash cache`: every model subdirectory with its record count and bytes.
struct CacheDirModel {
  std::string fingerprint_hex;
  int64_t records = 0, bytes = 0, temporary_files = 0, foreign_files = 0;
  int64_t oldest_unix_s = 0, newest_unix_s = 0;  // record file times
};
Result<std::vector<CacheDirModel>> scan_cache_dir(const std::string& dir);

}  // namespace dsflash::prefix
