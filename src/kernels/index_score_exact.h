// The exact-integer indexer scores (kernels/index_score.h index_scores_rows_vnni / _avx512bw / _avx2): what the
// ISA twins share. q and k are e2m1 times power-of-two block scales, so a block's products are small integers times
// one power of two; the argument for when the reference's in-order fp32 sum equals the integer sum is in
// index_score.h. One driver (score_rows_exact) prepares q as integers, packs each group of 16 stored key rows, scores
// every query against it with the ISA's integer dots, falls back to the fp32 dots where a check fails, and weighs the
// heads; the ISA supplies the group packing, the dots and the head weighting (ExactIndexKernels).
#pragma once

#include <cstdint>

#include "kernels/index_score.h"

namespace dsflash::index_exact {

inline constexpr int kMaxIndexBlocks = 4;  // blocks of 32 in a key (dim <= 128)

// Twice the e2m1 value of a nibble (magnitude codes 0-7: 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 = sign), plus 12: an
// unsigned byte in [0, 24] (the u8 operand of vpdpbusd / vpmaddubsw; the +12 is taken back with QueryHeadInts::offset).
alignas(16) inline constexpr uint8_t kTwiceE2m1Plus12[16] = {12, 13, 14, 15, 16, 18, 20, 24,
                                                             12, 11, 10, 9,  8,  6,  4,  0};

// The smallest ue8m0 code whose key values the reference may not hold finite: 255 is NaN, and from 253 (2^126) on
// an e2m1 value of 4 or more overflows to inf when the row is dequantised, so its products with q are inf or NaN
// (0 * inf) even where q is 0. Groups with such a code take the fp32 dots, which keep the reference's bits.
inline constexpr int kFirstNonFiniteScaleCode = 253;

// One (query, head) of q as integers: q_d = iq_d * 2^exponent[b] per block b of 32.
struct QueryHeadInts {
  const int8_t* iq = nullptr;            // [dim]
  int32_t exponent[kMaxIndexBlocks] = {};
  int32_t offset[kMaxIndexBlocks] = {};  // -12 * Σ iq of the block: takes back what the keys' +12 adds to the dot
  // (exponent - 1) << 23: added to a key block's ue8m0 code u << 23, the fp32 bits of the block's product scale
  // 2^(exponent + u - 128) (biased exponent field exponent + u - 1). 0 for an all-zero block, so that the sum is a
  // finite scale (2^(u - 127)) for any u < kFirstNonFiniteScaleCode.
  int32_t scale_bits[kMaxIndexBlocks] = {};
  int32_t bound[kMaxIndexBlocks] = {};   // 12 * Σ|iq| (the partial-sum bound); 0 = the block is all zeros
  bool any_block = false;                // some block is not all zeros
  // (Σ_b bound[b]) << 11 < 2^24: with every block shift <= 11 (checked anyway) the partial sums stay below 2^24,
  // so the per-lane sum of shifted bounds need not be formed.
  bool small_total = false;
};

// One query's exponents over its heads' nonzero blocks, for the group-level check of the dots: the smallest and
// largest exponent, the largest spread (max - min) within one head, and whether every head has small_total; and
// whether its head weights let exact dots take ExactIndexKernels::weigh_finite.
struct QueryExponents {
  bool bf16_weights = false;  // every head weight has its low 16 bits zero
  bool any = false;  // some head has a nonzero block (else every dot is 0 and no check applies)
  int32_t min = 0, max = 0, spread = 0;
  bool small_total = true;
};

// Splits a block of 32 fp32 q values into iq [32] * 2^exponent with iq integers in [-12, 12]; also Σ iq and
// bound = 12 Σ|iq|. False when they are not e2m1 times one power of two, or when a value or 2^±exponent is not a
// normal float. AVX2 (the build baseline), so every ISA's kernel uses it.
bool split_block(const float* q, int8_t* iq, int32_t* exponent, int32_t* sum, int32_t* bound);

// Group packing: 16 stored key rows (`lanes` valid; the rest read as ik = 0, scale code 127) -> kq [dim/4][16][4]
// bytes (ik + 12, four elements of one key per 32-bit lane, keys in lane order) and ub [dim/32][16] int32 scale
// codes; false when a valid row has a scale code >= kFirstNonFiniteScaleCode. dim <= 128 and a multiple of 32.
using PackGroup = bool (*)(const uint8_t* const* rows, int lanes, int64_t dim, uint8_t* kq, int32_t* ub);

// dots [heads][16] fp32 of one query (heads_ints [heads]) against a packed group of `lanes` keys. checked: test
// every valid (head, lane) for exactness and return false (dots unspecified) when one fails; false when the group
// has passed them all at once (group_passes_all_checks). One entry per block count dim / 32.
using ExactDots16 = bool (*)(const uint8_t* kq, const int32_t* ub, const QueryHeadInts* heads_ints, bool checked,
                             int heads, int lanes, float* dots);

struct ExactIndexKernels {
  PackGroup pack_group = nullptr;
  ExactDots16 exact_dots[kMaxIndexBlocks + 1] = {};  // [dim / 32]; [0] unused
  WeighHeads16Kernel weigh = nullptr;
  // The same weighing for exact dots (finite) and bf16-valued weights (index_score.h weigh_heads16_finite_avx512).
  WeighHeads16Kernel weigh_finite = nullptr;
};

// A packed group's key exponents (u - 128) over its valid lanes: the smallest, the largest, and the largest spread
// (max - min) within one key. From ub [blocks][16] scale codes.
struct KeyExponents {
  int32_t min = 0, max = 0, spread = 0;
};
KeyExponents key_exponents(const int32_t* ub, int blocks, int lanes);

// The group-level check: for a nonzero block b of head h, its shift (k_b + q_hb) - min over nonzero b' of
// (k_b' + q_hb') is at most the key's exponent spread plus the head's, and that minimum lies in [min k + min q,
// max k + max q]; with small_total no sum of shifted bounds is needed. So spread_k + spread_q <= 11,
// min k + min q >= -126 and max k + max q <= 103 (over the valid lanes and every head) imply every per-lane check.
bool group_passes_all_checks(const KeyExponents& keys, const QueryExponents& query);

// The scores of IndexScoreRowsArgs with `kernels`; same bits as index_scores_rows_reference.
void score_rows_exact(const IndexScoreRowsArgs& args, const ExactIndexKernels& kernels);

// The ISA tables: VNNI nullptr when the CPU lacks AVX-512 F/BW/VNNI, AVX-512 BW (the same code without VNNI,
// index_score_rows_avx512.cpp) nullptr when it lacks AVX-512 F/BW; AVX2 always (the build baseline).
const ExactIndexKernels* vnni_exact_index_kernels();
const ExactIndexKernels* avx512bw_exact_index_kernels();
const ExactIndexKernels& avx2_exact_index_kernels();

}  // namespace dsflash::index_exact
