// A synthetic context for benchmarks: fills an empty sequence with `depth` positions of valid random KV state so a
// decode step can be timed at a depth no one wants to prefill (a million tokens). The state is well formed, not
// meaningful: every byte decodes to a finite value in the range the model's own quantisers produce, so every kernel
// runs on the code paths real data takes (no NaN, no all-zero rows, no empty windows).
//   global KV, every source s (ratio r): entries [0, depth / r), each
//     main row    : head_dim/2 packed e2m1 (any nibble) + head_dim/16 e4m3 scales in [2^-4, 2^-1) (positive, finite)
//     indexer key : index_head_dim/2 packed e2m1 (any nibble) + index_head_dim/32 ue8m0 scales 2^-3 .. 2^0
//   window rings (every layer): positions [max(0, depth - window), depth), rows of e4m3 codes (any non-NaN byte)
//     with ue8m0 scales 2^-8 .. 2^-6 (|value| <= 448 * 2^-6 = 7)
//   compressor tails (ratio > 1 sources): the depth % r pending slots random (kv N(0,1)-ish, score finite), the rest
//     reset (kv 0, score -inf), as after writing those positions
//   num_positions() = depth.
// Engram history is not KV: the caller restores it from token ids (model/engram_hash.h restore_history).
#pragma once

#include <cstdint>

#include "core/status.h"
#include "kv/sequence_kv.h"

namespace dsflash::kv {

// `seq` must hold no positions and have reserved pages for at least `depth` positions
// (KvCacheManager::reserve); errors (nothing changed) otherwise. Deterministic in `seed`.
Status fill_synthetic_context(SequenceKv& seq, int64_t depth, uint64_t seed);

}  // namespace dsflash::kv
