#include "kv/block_hash.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include <cstring>

namespace dsflash::kv {

BlockHash compute_block_hash(const BlockHash& parent, std::span<const int32_t> tokens, uint64_t seed) {
  XXH3_state_t state;
  // A state on the stack must be initialised before a seeded reset: the reset compares the seed with the state's
  // previous one and would otherwise skip deriving the secret from uninitialised memory (a hash that changes from
  // call to call).
  XXH3_INITSTATE(&state);
  XXH3_128bits_reset_withSeed(&state, seed);
  const uint64_t words[2] = {parent.lo, parent.hi};
  XXH3_128bits_update(&state, words, sizeof(words));
  XXH3_128bits_update(&state, tokens.data(), tokens.size_bytes());
  const XXH128_hash_t h = XXH3_128bits_digest(&state);
  return BlockHash{h.low64, h.high64};
}

std::vector<BlockHash> hash_full_blocks(std::span<const int32_t> tokens, int64_t block_tokens, uint64_t seed) {
  std::vector<BlockHash> hashes;
  if (block_tokens <= 0) return hashes;
  const size_t block = static_cast<size_t>(block_tokens);
  const size_t full = tokens.size() / block;
  hashes.reserve(full);
  BlockHash parent = kRootBlockHash;
  for (size_t i = 0; i < full; ++i) {
    parent = compute_block_hash(parent, tokens.subspan(i * block, block), seed);
    hashes.push_back(parent);
  }
  return hashes;
}

}  // namespace dsflash::kv
