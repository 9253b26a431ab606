// dsflash/cache.h over the prefix cache's directory layout (prefix/disk_tier.h) and record format
// (prefix/block_record.h).
#include "dsflash/cache.h"

#include <filesystem>
#include <fstream>
#include <iterator>

#include "prefix/block_record.h"
#include "prefix/disk_tier.h"

namespace dsflash {
namespace {

EngineError cache_error(const std::string& message) { return EngineError{ErrorCode::kInvalidRequest, message}; }

uint64_t parse_hex(const std::string& digits) {
  uint64_t v = 0;
  for (char c : digits) v = (v << 4) | static_cast<uint64_t>(c <= '9' ? c - '0' : c - 'a' + 10);
  return v;
}

CacheModelReport to_report(const prefix::CacheDirModel& m) {
  CacheModelReport r;
  r.fingerprint = m.fingerprint_hex;
  r.records = m.records;
  r.bytes = m.bytes;
  r.temporary_files = m.temporary_files;
  r.foreign_files = m.foreign_files;
  r.oldest_unix_s = m.oldest_unix_s;
  r.newest_unix_s = m.newest_unix_s;
  return r;
}

}  // namespace

Expected<CacheDirReport> cache_stats(const std::string& dir) {
  auto models = prefix::scan_cache_dir(dir);
  if (!models.ok()) return cache_error(models.status().message());
  CacheDirReport report;
  for (const auto& m : *models) report.models.push_back(to_report(m));
  return report;
}

Expected<CacheDirReport> cache_verify(const std::string& dir, bool remove_bad) {
  auto stats = cache_stats(dir);
  if (!stats.ok()) return stats;
  CacheDirReport report = std::move(*stats);
  for (CacheModelReport& model : report.models) {
    const prefix::RecordExpectation expect{
        prefix::Fingerprint{parse_hex(model.fingerprint.substr(0, 16)), parse_hex(model.fingerprint.substr(16))}, 0, 0};
    std::error_code ec;
    for (const auto& file : std::filesystem::directory_iterator(std::filesystem::path(dir) / model.fingerprint, ec)) {
      const std::string name = file.path().filename().string();
      if (name.size() != 20 || file.path().extension() != ".kvb") continue;
      std::ifstream in(file.path(), std::ios::binary);
      const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      auto record = prefix::decode_record(bytes, expect, file.path().string());
      std::string problem;
      if (!record.ok()) {
        problem = record.status().message();
      } else if (record->block_hash != parse_hex(name.substr(0, 16))) {
        problem = file.path().string() + ": holds another block than its name says";
      }
      if (problem.empty()) {
        model.tokens += static_cast<int64_t>(record->tokens.size());
        continue;
      }
      ++model.bad_records;
      report.problems.push_back(problem);
      if (remove_bad) std::filesystem::remove(file.path(), ec);
    }
  }
  return report;
}

Expected<int64_t> cache_clear(const std::string& dir) {
  auto stats = cache_stats(dir);
  if (!stats.ok()) return stats.error();
  int64_t removed = 0;
  for (const CacheModelReport& model : stats->models) {
    std::error_code ec;
    for (const auto& file : std::filesystem::directory_iterator(std::filesystem::path(dir) / model.fingerprint, ec)) {
      const std::string ext = file.path().extension().string();
      if (ext == ".kvb" || ext == ".tmp") removed += std::filesystem::remove(file.path(), ec) ? 1 : 0;
    }
  }
  return removed;
}

}  // namespace dsflash
