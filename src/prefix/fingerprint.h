// The model fingerprint that seeds every prefix-cache key (DESIGN.md "src/prefix"): a 128-bit xxh3 digest of what
// decides the bytes of the global KV a prompt produces. Another model, tokenizer, layout or cache format gives
// another fingerprint, so its records never hit.
//
// Covered: the cache format version; config.json (every byte); tokenizer.json and tokenizer_config.json when
// present (every byte); per shard file, its name, its size and its whole safetensors header (names, dtypes, shapes,
// offsets of every tensor); per tensor, its name and 3 samples of 64 bytes of its data (start, middle, end).
// Not covered: tensor bytes between the samples (a checkpoint edited in place there, keeping every header and the
// sampled bytes, would not be noticed), and the engine's own code: a change of dsflash that changes the KV
// numerics must bump kCacheFormatVersion.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "io/checkpoint.h"

namespace dsflash::prefix {

// Bumped whenever the record layout or the numerics of the cached KV change.
inline constexpr uint32_t kCacheFormatVersion = 1;

struct Fingerprint {
  uint64_t high = 0;
  uint64_t low = 0;
  bool operator==(const Fingerprint&) const = default;
  std::string hex() const;                       // 32 lowercase hex digits, high then low
  uint64_t seed() const { return high ^ low; }   // 64-bit seed of the chained block hashes
};

// Reads config/tokenizer files and shard headers from disk and samples the mapped tensors. Error names the file.
Result<Fingerprint> fingerprint_checkpoint(const Checkpoint& checkpoint);

}  // namespace dsflash::prefix
