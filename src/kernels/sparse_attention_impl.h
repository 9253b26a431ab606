// Internals shared by the fast sparse-attention kernel (sparse_attention.cpp: driver, softmax, AVX2 paths) and
// its AVX-512 paths (sparse_attention_avx512.cpp). Not part of the kernels' interface.
#pragma once

#include <cstdint>

#include "kernels/sparse_attention.h"

namespace dsflash::sparse_attention_impl {

inline constexpr int kHeadLanes = 16;   // heads in the lanes of one zmm / two ymm
inline constexpr int kScoreHeads = 32;  // heads per scoring group: two zmm, so that each broadcast row element
                                        // serves two multiplies (a broadcast costs a vector slot on some cores)
inline constexpr int kGroupHeads = 8;  // heads per P·V group: each row chunk is loaded once for 8 heads

// One block of up to 64 list entries for a group of 8 heads of one query, as the P·V kernels consume it:
// the block's present rows (nullptr entries dropped, list order kept) and their bf16-rounded probabilities
// p [present][8] (heads past the group's end hold 0 and their results are discarded), and the group's
// softmax corrections c [8] for num = num * c + Σ_j p_j * row_j. lanes: the group's heads (1..8); a kernel may
// skip heads past it or compute them on p = 0, c = 1.
struct PvBlock {
  const float* rows[kSparseAttentionBlock];
  alignas(64) float p[kSparseAttentionBlock * kGroupHeads];
  alignas(32) float correction[kGroupHeads];
  int present = 0;
  int lanes = 0;
};

// num [8][num_stride] fp32, updated over d in [0, dim): per head g and element d,
//   mm = 0; for j in list order: mm = mm + round(p[j][g] * rows[j][d]);  num = num * c[g] + mm
// with mul then add (never fused), i.e. the scalar oracle's sequence for every (head, d).
using PvBlockKernel = void (*)(const PvBlock& block, int64_t dim, float* num, int64_t num_stride);

// scores of 8 rows for 32 heads: acc[i][l] = Σ_d q_t[d][l] * r[i][d] in d order from 0.0f, mul then add.
// q_t [dim][32] (the group's queries transposed), r [8] row pointers (duplicates allowed).
using ScoreRowsKernel = void (*)(const float* q_t, const float* const* r, int64_t dim, float (*acc)[kScoreHeads]);
inline constexpr int kScoreRows = 8;

struct FastPaths {
  ScoreRowsKernel score_rows;
  PvBlockKernel pv_block;
};

// The AVX-512 (F/VL) paths, or nullptr members when the CPU lacks them.
FastPaths avx512_paths();

// The scalar P·V of one head and element d (the tails of the vector paths): returns the updated num.
inline float pv_element(const PvBlock& block, int g, int64_t d, float num) {
  float mm = 0.0f;
  for (int j = 0; j < block.present; ++j) mm += block.p[j * kGroupHeads + g] * block.rows[j][d];
  return num * block.correction[g] + mm;
}

}  // namespace dsflash::sparse_attention_impl
