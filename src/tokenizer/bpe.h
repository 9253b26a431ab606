// Byte-level BPE model of tokenizer.json ("model": {"type": "BPE", vocab, merges}) and the cache of its results.
// Spec: MODEL.md §8 (128,000 vocab entries, 127,741 merges; ids 3..258 are the 256 byte tokens).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"
#include "tokenizer/byte_level.h"

namespace dsflash {

// Storage: piece bytes -> BPE ids, shared by all threads. Bounded: once full it stops inserting (as Hugging
// Face's cache does), so memory stays fixed; pieces longer than kMaxPieceBytes are never cached.
class BpeCache {
 public:
  static constexpr size_t kMaxPieceBytes = 256;
  explicit BpeCache(size_t max_entries) : max_entries_(max_entries) {}

  bool lookup(std::string_view piece, std::vector<int32_t>& out) const;  // appends to out on a hit
  void insert(std::string_view piece, const int32_t* ids, size_t num_ids);
  size_t size() const;
  uint64_t hits() const { return hits_.load(std::memory_order_relaxed); }
  uint64_t misses() const { return misses_.load(std::memory_order_relaxed); }

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  size_t max_entries_;
  mutable std::shared_mutex mutex_;
  std::unordered_map<std::string, std::vector<int32_t>, Hash, std::equal_to<>> map_;
  mutable std::atomic<uint64_t> hits_{0};
  mutable std::atomic<uint64_t> misses_{0};
};

class BpeModel {
 public:
  static constexpr size_t kDefaultCacheEntries = 1 << 17;

  // Parses "model"; refuses what is not implemented (dropout, byte_fallback, subword prefix/suffix).
  static Result<BpeModel> from_json(const nlohmann::json& model, size_t cache_entries = kDefaultCacheEntries);

  // Appends the ids of one pre-tokenized piece given as raw bytes (byte-level mapping done here).
  void tokenize_piece(std::string_view piece, std::vector<int32_t>& out) const;
  // The same without the cache (tests, benchmarks).
  void tokenize_piece_uncached(std::string_view piece, std::vector<int32_t>& out) const;

  // Ids span [0, id_limit()); some may be unassigned.
  int32_t id_limit() const { return static_cast<int32_t>(id_to_token_.size()); }
  size_t vocab_size() const { return vocab_.size(); }
  size_t num_merges() const { return merges_.size(); }
  std::optional<int32_t> token_to_id(std::string_view token) const;  // token in the byte-level alphabet
  const std::string* id_to_token(int32_t id) const;                   // nullptr when unassigned
  const ByteLevelAlphabet& alphabet() const { return alphabet_; }
  const BpeCache& cache() const { return *cache_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  void merge_word(std::vector<int32_t>& symbols) const;

  ByteLevelAlphabet alphabet_;
  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;      // "" for unassigned ids
  std::vector<bool> assigned_;
  std::array<int32_t, 256> byte_ids_{};       // id of each single-byte token, -1 when absent
  std::unordered_map<uint64_t, Merge> merges_;  // (left id, right id) -> rank, merged id
  bool ignore_merges_ = false;
  std::unique_ptr<BpeCache> cache_;
};

}  // namespace dsflash
