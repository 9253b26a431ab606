#include "prefix/prefix_cache.h"

#include <chrono>
#include <cstring>

#include "kv/block_hash.h"

namespace dsflash::prefix {

PrefixCache::PrefixCache(const Fingerprint& fingerprint, const kv::KvLayout& layout, const PrefixCacheOptions& options)
    : fingerprint_(fingerprint), block_tokens_(layout.block_tokens), block_bytes_(layout.block_bytes) {
  if (!options.cache_dir.empty()) {
    DiskTierOptions disk;
    disk.dir = options.cache_dir;
    disk.budget_bytes = options.disk_budget_bytes;
    disk.writer_queue_records = options.writer_queue_records;
    disk_ = DiskTier::open(disk, RecordExpectation{fingerprint, static_cast<uint64_t>(layout.block_bytes),
                                                   static_cast<uint32_t>(layout.block_tokens)});
  }
}

std::vector<kv::BlockHash> PrefixCache::lookup(std::span<const int32_t> prompt, kv::KvCacheManager& manager) {
  ++stats_.lookups;
  if (prompt.size() < 2) return {};
  // Whole blocks strictly before the prompt's last token.
  std::vector<kv::BlockHash> hashes = kv::hash_full_blocks(prompt.first(prompt.size() - 1), block_tokens_, seed());
  const int64_t in_ram = manager.cached_prefix_blocks(hashes);
  stats_.ram_hit_blocks += in_ram;
  int64_t found = in_ram;
  for (; disk_ != nullptr && found < static_cast<int64_t>(hashes.size()); ++found) {
    const size_t i = static_cast<size_t>(found);
    auto record = disk_->read(hashes[i].lo);
    if (!record) break;
    const auto block = prompt.subspan(i * static_cast<size_t>(block_tokens_), static_cast<size_t>(block_tokens_));
    const uint64_t parent = i == 0 ? 0 : hashes[i - 1].lo;
    // A record under the right name is only used when it is this block of this prefix, token for token.
    if (record->block_index != i || record->parent_hash != parent ||
        !std::equal(block.begin(), block.end(), record->tokens.begin(), record->tokens.end())) {
      break;
    }
    if (!manager.import_cached_block(hashes[i], record->kv).ok()) break;  // no room in RAM: use what is there
    ++stats_.disk_hit_blocks;
  }
  hashes.resize(static_cast<size_t>(found));
  return hashes;
}

Status PrefixCache::store(kv::SequenceKv& seq, std::span<const int32_t> tokens, kv::KvCacheManager& manager) {
  kv::SequencePages& pages = seq.pages();
  const int64_t first = pages.num_frozen_blocks();
  auto published = manager.commit_full_blocks(pages, tokens, seed());
  if (!published.ok()) return published.status().with_context("prefix cache");
  stats_.stored_blocks += *published;
  if (disk_ == nullptr || *published == 0) return Status::Ok();
  const uint64_t now = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  for (int64_t i = first; i < first + *published; ++i) {
    const size_t b = static_cast<size_t>(i);
    BlockRecord record;
    record.fingerprint = fingerprint_;
    record.block_hash = pages.block_hashes()[b].lo;
    record.parent_hash = i == 0 ? 0 : pages.block_hashes()[b - 1].lo;
    record.block_index = static_cast<uint64_t>(i);
    record.created_unix_s = now;
    const auto block = tokens.subspan(b * static_cast<size_t>(block_tokens_), static_cast<size_t>(block_tokens_));
    record.tokens.assign(block.begin(), block.end());
    const uint8_t* bytes = manager.block_data(pages.block_ids()[b]);
    record.kv.assign(bytes, bytes + block_bytes_);
    disk_->write_async(std::move(record));  // a full queue drops the write: the decode path never waits
  }
  return Status::Ok();
}

PrefixCacheStats PrefixCache::stats() const {
  PrefixCacheStats s = stats_;
  if (disk_ != nullptr) {
    s.disk = disk_->stats();
    s.disk_enabled = s.disk.enabled;
  }
  return s;
}

std::vector<std::string> PrefixCache::take_notices() {
  return disk_ != nullptr ? disk_->take_notices() : std::vector<std::string>{};
}

void PrefixCache::flush() {
  if (disk_ != nullptr) disk_->flush();
}

}  // namespace dsflash::prefix
