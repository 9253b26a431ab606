// Chained content hashes of full global-KV blocks (the prefix-cache key). A block covers `block_tokens` positions
// (KvLayout::block_tokens, 64 on V4.1) and its hash names everything that decides its KV bytes: the tokens of
// every earlier block (through the parent's hash), its own tokens, and a seed (the model fingerprint: the same
// tokens under another checkpoint or config must not match).
//
//   hash(block i) = XXH3-128(seed, bytes = [parent.lo u64][parent.hi u64][tokens int32 x block_tokens])
//   parent of block 0 = kRootBlockHash ({0, 0})
//
// Integers are hashed in host byte order (little-endian on every target dsflash builds for); a persisted prefix
// cache records the hashes, never recomputes them on another byte order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace dsflash::kv {

struct BlockHash {
  uint64_t lo = 0;
  uint64_t hi = 0;
  friend bool operator==(const BlockHash&, const BlockHash&) = default;
};

inline constexpr BlockHash kRootBlockHash{};

// For std::unordered_map<BlockHash, ...>: the hash is already uniform, its low word is a fine bucket key.
struct BlockHashKey {
  size_t operator()(const BlockHash& h) const { return static_cast<size_t>(h.lo); }
};

// Hash of one block from its parent's hash (kRootBlockHash for block 0), its token ids and the seed.
BlockHash compute_block_hash(const BlockHash& parent, std::span<const int32_t> tokens, uint64_t seed);

// Hashes of every full block of `tokens` (tokens[p] = token id at position p), chained from kRootBlockHash:
// [tokens.size() / block_tokens] hashes; a partial last block has none. block_tokens > 0.
std::vector<BlockHash> hash_full_blocks(std::span<const int32_t> tokens, int64_t block_tokens, uint64_t seed);

}  // namespace dsflash::kv
