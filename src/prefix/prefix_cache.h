// The persistent prefix cache (spec/MODEL.md §7; DESIGN.md "src/prefix"): what a prompt's leading 64-token
// blocks hold in global KV (every KV source's main entries and indexer keys, 890 B/token on V4.1) is kept
//   RAM tier: as cached blocks of the KV block pool (kv::KvCacheManager: shared by reference count, evicted LRU
//             when the budget needs room), and
//   SSD tier: as block records in a cache directory (prefix/disk_tier.h), written behind, read back on a RAM miss,
//             found again after a restart.
// Keys are chained block hashes over token ids (kv::compute_block_hash) seeded with the model fingerprint
// (prefix/fingerprint.h), so another model or format never hits. Window rows are never kept: a hit is restored
// by Encoder SWA Bounded Replay (the scheduler replays the window before the hit through the encoder).
// Policy only: the bytes live in the KV manager (RAM) and the disk tier (SSD).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kv/kv_cache.h"
#include "prefix/disk_tier.h"
#include "prefix/fingerprint.h"

namespace dsflash::prefix {

struct PrefixCacheOptions {
  std::string cache_dir;                          // empty: RAM tier only
  int64_t disk_budget_bytes = int64_t{16} << 30;  // record bytes on disk
  int64_t writer_queue_records = 256;
};

struct PrefixCacheStats {
  int64_t lookups = 0;
  int64_t ram_hit_blocks = 0;   // blocks found in the RAM tier
  int64_t disk_hit_blocks = 0;  // blocks read back from the SSD tier
  int64_t stored_blocks = 0;    // blocks published by store()
  bool disk_enabled = false;
  DiskTierStats disk;
};

class PrefixCache {
 public:
  PrefixCache(const Fingerprint& fingerprint, const kv::KvLayout& layout, const PrefixCacheOptions& options);

  uint64_t seed() const { return fingerprint_.seed(); }
  const Fingerprint& fingerprint() const { return fingerprint_; }

  // The hashes of the longest cached run of whole blocks at the start of `prompt` that lies before its last token
  // (at least one token is always computed). Blocks missing from RAM are read back from the SSD tier, verified
  // token for token and chain for chain, and imported into `manager`'s cache, so that attach_cached_prefix maps
  // them all.
  std::vector<kv::BlockHash> lookup(std::span<const int32_t> prompt, kv::KvCacheManager& manager);

  // Publishes the whole blocks of `seq` whose positions are all written: `tokens` are the ids of positions
  // [0, tokens.size()) of the sequence. New blocks become cached in RAM and are queued for the SSD tier.
  Status store(kv::SequenceKv& seq, std::span<const int32_t> tokens, kv::KvCacheManager& manager);

  PrefixCacheStats stats() const;
  // Messages to say once each (the SSD tier switched off, a damaged record removed).
  std::vector<std::string> take_notices();
  // Waits for the SSD writer (shutdown).
  void flush();

 private:
  Fingerprint fingerprint_;
  int64_t block_tokens_;
  int64_t block_bytes_;
  std::unique_ptr<DiskTier> disk_;  // null: RAM tier only
  PrefixCacheStats stats_;
};

}  // namespace dsflash::prefix
