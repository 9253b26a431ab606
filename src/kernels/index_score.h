// Indexer q·k dot products vectorised across keys (spec/MODEL.md §4.5, model.py Indexer.forward's
// einsum("bshd,btd->bsht")). The reference path sums each dot product in K order, one rounded product and one
// rounded add per element (no fma: the build uses -ffp-contract=off). Index scores are rounded to bf16 and tie
// often, so a one-ulp difference in a dot product flips top-k selections; the fast path therefore keeps every
// dot product's operation sequence and only runs 16 independent keys in the lanes of the vector registers.
#pragma once

#include <cstdint>

namespace dsflash {

inline constexpr int kIndexKeyLanes = 16;  // keys per packed block

// keys [num_keys, dim] fp32 (num_keys <= 16) -> packed [dim][16]; lanes num_keys..15 are zero.
void pack_index_keys(const float* keys, int64_t num_keys, int64_t dim, float* packed);

// dots [heads][16]: dots[h][l] = Σ_d q[h][d] * packed[d][l], accumulated from 0.0f in d order with the
// product rounded to fp32 before each add: bit for bit the scalar in-order dot of q_h and key l.
// q [heads, dim] fp32; packed as pack_index_keys writes it.
void index_dots16(const float* packed, const float* q, int heads, int64_t dim, float* dots);

// The scalar in-order dot (the reference path's and the tests' oracle).
float dot_in_order(const float* a, const float* b, int64_t n);

}  // namespace dsflash
