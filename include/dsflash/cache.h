// Administration of a prefix-cache directory (`dsflash cache stats|verify|clear`): what it holds per model
// (records, bytes, ages), a check of every record, and clearing it. Safe while engines use the directory: reads
// only, or removes record files (a reader holding one open still reads it whole).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dsflash/errors.h"

namespace dsflash {

struct CacheModelReport {
  std::string fingerprint;       // the model fingerprint the records were written for (32 hex digits)
  int64_t records = 0;
  int64_t bytes = 0;             // record file bytes
  int64_t temporary_files = 0;   // writes in progress or left by a killed writer (removed by the next engine)
  int64_t foreign_files = 0;     // files that are not records (left alone)
  int64_t oldest_unix_s = 0, newest_unix_s = 0;
  int64_t bad_records = 0;       // verify: records that failed a check
  int64_t tokens = 0;            // verify: tokens the good records cover
};

struct CacheDirReport {
  std::vector<CacheModelReport> models;
  std::vector<std::string> problems;  // verify: one line per bad record (file, field, offset)
};

// Names, sizes and times only.
Expected<CacheDirReport> cache_stats(const std::string& dir);
// Reads and verifies every record (magic, version, sizes, checksum, fingerprint = its directory, name = its
// block hash); with remove_bad, bad records are deleted.
Expected<CacheDirReport> cache_verify(const std::string& dir, bool remove_bad);
// Deletes every record and temporary file of every model; returns how many files went.
Expected<int64_t> cache_clear(const std::string& dir);

}  // namespace dsflash
