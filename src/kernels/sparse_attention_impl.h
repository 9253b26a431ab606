// Internals shared by the fast sparse-attention kernel (sparse_attention.cpp: driver, softmax, AVX2 paths) and
// its AVX-512 paths (sparse_attention_avx512.cpp). Not part of the kernels' interface.
#pragma once

#include <bit>
#include <cstdint>
#include <limits>

#include "kernels/sparse_attention.h"

namespace dsflash::sparse_attention_impl {

inline constexpr int kHeadLanes = 16;   // heads in the lanes of one zmm / two ymm
inline constexpr int kScoreHeads = 32;  // heads per scoring group: two zmm, so that each broadcast row element
                                        // serves two multiplies (a broadcast costs a vector slot on some cores)
inline constexpr int kGroupHeads = 8;  // heads per P·V group: each row chunk is loaded once for 8 heads

// Magnitude bounds of a set of bf16 values in fp32 (a KV row, a query, probabilities): low = the smallest
// nonzero |x| (+inf when every value is zero), high = the largest |x|, NaN when a value is NaN or not a bf16
// value (low 16 bits set), so that no exactness argument is made on it.
struct ValueBounds {
  float low;
  float high;
};
using ValueBoundsKernel = ValueBounds (*)(const float* values, int64_t count);

// ValueBounds from a bounds kernel's reductions over the values' bits: min(|x| - 1) as unsigned (a zero wraps
// to all ones, so all ones = no nonzero value), max |x|, and the OR of every value (a bf16 value's low 16 bits
// are clear).
inline ValueBounds bounds_from_bits(uint32_t low_minus_one, uint32_t high, uint32_t any) {
  return {low_minus_one == ~0u ? std::numeric_limits<float>::infinity() : std::bit_cast<float>(low_minus_one + 1),
          (any & 0xffffu) != 0 ? std::numeric_limits<float>::quiet_NaN() : std::bit_cast<float>(high)};
}

// The bounds of the union of two sets.
inline ValueBounds merge_bounds(ValueBounds a, ValueBounds b) {
  const bool unusable = a.high != a.high || b.high != b.high;  // NaN
  return {a.low < b.low ? a.low : b.low, unusable ? a.high + b.high : (a.high > b.high ? a.high : b.high)};
}

// Whether every product x * y of an x within a and a y within b is exact in fp32: two bf16 significands
// multiply into at most 16 bits, which a normal finite fp32 holds. Then fma(x, y, acc) rounds once, like
// acc + (x * y) with the product rounded (exactly) first, so a fused kernel keeps the oracle's bits; a subnormal
// or overflowing product would not. The test runs in double, where the bounds' products are exact.
inline bool products_exact(ValueBounds a, ValueBounds b) {
  return static_cast<double>(a.low) * b.low >= 0x1p-126 && static_cast<double>(a.high) * b.high < 0x1p127;
}

// Whether vdpbf16ps (bf16 pairs, each product exact, added to the fp32 sum one at a time with round to nearest
// even, the pair's high word first; bf16 inputs that are subnormal read as zero and subnormal sums flush to zero)
// gives the in-order FMA chain's bits for x within a and y within b: the products are exact (products_exact), no
// nonzero input is subnormal, and every nonzero product is at least 2^-100, so (significands of 8 bits, exponents
// summing to at least -101) every product, and hence every partial sum and its rounding, is a multiple of 2^-115:
// a nonzero sum is never subnormal.
inline bool bf16_dot_exact(ValueBounds a, ValueBounds b) {
  return products_exact(a, b) && a.low >= 0x1p-126f && b.low >= 0x1p-126f &&
         static_cast<double>(a.low) * b.low >= 0x1p-100;
}

// One block of up to 64 list entries for a group of 8 heads of one query, as the P·V kernels consume it:
// the block's present rows (nullptr entries dropped, list order kept) and their bf16-rounded probabilities
// p [present][8] (heads past the group's end hold 0 and their results are discarded), and the group's
// softmax corrections c [8] for num = num * c + Σ_j p_j * row_j. lanes: the group's heads (1..8); a kernel may
// skip heads past it or compute them on p = 0, c = 1.
struct PvBlock {
  const float* rows[kSparseAttentionBlock];
  alignas(64) float p[kSparseAttentionBlock * kGroupHeads];
  alignas(32) float correction[kGroupHeads];
  // p as bf16 pairs of consecutive present rows [(present + 1) / 2][8] for PvBlockPairsKernel (make_p_pairs):
  // dword g of pair i = head g's p of row 2i in the high word, of row 2i + 1 (0 past the last) in the low word.
  alignas(64) uint32_t p_pairs[kSparseAttentionBlock / 2 * kGroupHeads];
  int present = 0;
  int lanes = 0;
  bool fused = false;  // every p * row element product is exact (products_exact): FMAs keep the bits
};

// Two bf16 values (fp32 with the low 16 bits clear) as one vdpbf16ps operand dword: `first` in the high word,
// whose product vdpbf16ps adds first.
inline uint32_t bf16_pair(float first, float second) {
  return (std::bit_cast<uint32_t>(first) & 0xffff0000u) | (std::bit_cast<uint32_t>(second) >> 16);
}

// block.p_pairs from block.p (bf16 values).
inline void make_p_pairs(PvBlock& block) {
  for (int i = 0; 2 * i < block.present; ++i)
    for (int g = 0; g < kGroupHeads; ++g) {
      const float second = 2 * i + 1 < block.present ? block.p[(2 * i + 1) * kGroupHeads + g] : 0.0f;
      block.p_pairs[i * kGroupHeads + g] = bf16_pair(block.p[2 * i * kGroupHeads + g], second);
    }
}

// num [8][num_stride] fp32, updated over d in [0, dim): per head g and element d,
//   mm = 0; for j in list order: mm = mm + round(p[j][g] * rows[j][d]);  num = num * c[g] + mm
// with mul then add, i.e. the scalar oracle's sequence for every (head, d); with block.fused the inner
// mm + p * row is one FMA (the same bits there, and twice the rate).
using PvBlockKernel = void (*)(const PvBlock& block, int64_t dim, float* num, int64_t num_stride);
// The same by vdpbf16ps on block.p_pairs, for blocks where bf16_dot_exact holds for the probabilities and the
// rows (the same bits: each pair adds row 2i's product, then row 2i + 1's; a missing last row adds 0 * 0).
using PvBlockPairsKernel = PvBlockKernel;

// scores of 8 rows for 32 heads: acc[i][l] = Σ_d q_t[d][l] * r[i][d] in d order from 0.0f, mul then add, or
// FMAs where `fused` (the caller's products_exact of the queries and rows: the same bits).
// q_t [dim][32] (the group's queries transposed), r [8] row pointers (duplicates allowed).
using ScoreRowsKernel = void (*)(const float* q_t, const float* const* r, int64_t dim, bool fused,
                                 float (*acc)[kScoreHeads]);
inline constexpr int kScoreRows = 8;

// The same scores by vdpbf16ps, for passes where bf16_dot_exact holds for the queries and the rows (the same
// bits, half the instructions): q_pairs [dim / 2][32] (make_query_pairs), dim even.
using ScoreRowsPairsKernel = void (*)(const uint32_t* q_pairs, const float* const* r, int64_t dim,
                                      float (*acc)[kScoreHeads]);

// q_pairs [dim / 2][32] from q_t [dim][32] (dim even): dword l of pair p holds head l's bf16 of d = 2p in the
// high word and of d = 2p + 1 in the low word, so that vdpbf16ps, which adds a pair's high product first, sums in
// d order. q_t holds bf16 values (its low 16 bits are zero; bf16_dot_exact's bounds say so).
inline void make_query_pairs(const float* q_t, int64_t dim, uint32_t* q_pairs) {
  for (int64_t p = 0; p < dim / 2; ++p)
    for (int l = 0; l < kScoreHeads; ++l)
      q_pairs[p * kScoreHeads + l] = bf16_pair(q_t[2 * p * kScoreHeads + l], q_t[(2 * p + 1) * kScoreHeads + l]);
}

struct FastPaths {
  ScoreRowsKernel score_rows;
  PvBlockKernel pv_block;
  ValueBoundsKernel bounds;
  ScoreRowsPairsKernel score_rows_pairs = nullptr;  // nullptr where the CPU lacks AVX512-BF16
  PvBlockPairsKernel pv_block_pairs = nullptr;      // likewise
};

// The AVX2 paths (the build baseline) and the AVX-512 (F/VL) ones, nullptr members when the CPU lacks them;
// bf16_pairs: with the vdpbf16ps ones where the CPU has AVX512-BF16.
FastPaths avx2_paths();
FastPaths avx512_paths(bool bf16_pairs);

// The scalar P·V of one head and element d (the tails of the vector paths): returns the updated num.
inline float pv_element(const PvBlock& block, int g, int64_t d, float num) {
  float mm = 0.0f;
  for (int j = 0; j < block.present; ++j) mm += block.p[j * kGroupHeads + g] * block.rows[j][d];
  return num * block.correction[g] + mm;
}

}  // namespace dsflash::sparse_attention_impl
