// Indexer q·k dot products vectorised across keys (spec/MODEL.md §4.5, model.py Indexer.forward's
// einsum("bshd,btd->bsht")). The reference path sums each dot product in K order, one rounded product and one
// rounded add per element (no fma: the build uses -ffp-contract=off). Index scores are rounded to bf16 and tie
// often, so a one-ulp difference in a dot product flips top-k selections; the fast path therefore keeps every
// dot product's operation sequence and only runs 16 independent keys in the lanes of the vector registers.
#pragma once

#include <cstdint>

#include "core/workspace.h"

namespace dsflash {

inline constexpr int kIndexKeyLanes = 16;  // keys per packed block

// keys [num_keys, dim] fp32 (num_keys <= 16) -> packed [dim][16]; lanes num_keys..15 are zero.
void pack_index_keys(const float* keys, int64_t num_keys, int64_t dim, float* packed);

// dots [heads][16]: dots[h][l] = Σ_d q[h][d] * packed[d][l], accumulated from 0.0f in d order with the
// product rounded to fp32 before each add: bit for bit the scalar in-order dot of q_h and key l.
// q [heads, dim] fp32; packed as pack_index_keys writes it. AVX2 (the x86-64-v3 build baseline).
void index_dots16(const float* packed, const float* q, int heads, int64_t dim, float* dots);

// The scalar in-order dot (the reference path's and the tests' oracle).
float dot_in_order(const float* a, const float* b, int64_t n);

// The per-key head weighting of 16 keys: dots [heads][16] fp32 (dots[h][l] = q_h · key_l), w [heads] fp32 ->
//   out[l] = bf16( Σ_h bf16( relu(bf16(dots[h][l])) * w[h] ) ), out [16],
// the head sum in torch's outer cascade order (kernels/reduce.h outer_cascade_sum). The reference runs the scalar
// formula lane by lane; the vector twins run the same float operations in the same order on all 16 lanes at once
// (relu as max(0, x), which returns x unless 0 > x, as std::max(x, 0.0f) does, so -0.0 and NaN pass through alike;
// bf16 rounding by integer arithmetic, never vcvtneps2bf16, which flushes subnormals), so all three agree bit for bit
// (NaN payloads aside).
void weigh_heads16_reference(const float* dots, const float* w, int heads, float* out);
void weigh_heads16_avx2(const float* dots, const float* w, int heads, float* out);  // the x86-64-v3 baseline
using WeighHeads16Kernel = void (*)(const float* dots, const float* w, int heads, float* out);
WeighHeads16Kernel weigh_heads16_avx512();  // nullptr when the CPU lacks AVX-512 F
// The same bits where every dot is finite and every weight a bf16 value (its low 16 bits zero), as in the indexer's
// exact-integer path, with the bf16 roundings' NaN handling left out. It cannot change a result there: every NaN
// that can arise is made by the arithmetic (inf * 0, inf - inf: the default NaN) or carries a weight's payload, so
// it is quiet with its low 16 bits zero, and the rounding's add of at most 0x8000 cannot carry out of them.
WeighHeads16Kernel weigh_heads16_finite_avx512();  // nullptr when the CPU lacks AVX-512 F

// One call of the indexer's scoring: a tile of queries against a block of keys.
//   score[t][j] = bf16( Σ_h bf16( relu(bf16(q[t][h] · key[j])) * weights[t][h] ) ),
// the head sum in torch's outer cascade order (kernels/reduce.h outer_cascade_sum).
struct IndexScoreArgs {
  const float* q = nullptr;        // [num_queries, heads, dim] fp32 (MXFP4-rounded values)
  const float* weights = nullptr;  // [num_queries, heads] fp32 (bf16 values)
  const float* keys = nullptr;     // [num_keys, dim] fp32 (dequantised index keys)
  float* scores = nullptr;         // scores[t * score_stride + j] for t < num_queries, j < num_keys
  int64_t num_queries = 0;
  int64_t num_keys = 0;
  int64_t score_stride = 0;
  int heads = 0;
  int64_t dim = 0;
  // Memory for the kernel's buffers (packed keys, dot products), taken and given back inside the call; nullptr:
  // the call uses a private arena (which allocates).
  Arena* scratch = nullptr;
};

// The oracle: for each query, key and head the in-order dot, one at a time.
void index_scores_reference(const IndexScoreArgs& args);
// The same bits: the keys packed 16 to a group, each query's heads scored against a group by index_dots16 and
// weighted by weigh_heads16_avx2.
void index_scores_packed16(const IndexScoreArgs& args);

// The same scores from the stored indexer key rows (kv/state_storage.h: [dim/2] packed e2m1, low nibble = even
// element, then [dim/32] ue8m0 scales, block 32), so a table may work on the packed bytes instead of fp32 keys.
struct IndexScoreRowsArgs {
  const float* q = nullptr;        // [num_queries, heads, dim] fp32 (MXFP4-rounded values)
  const float* weights = nullptr;  // [num_queries, heads] fp32 (bf16 values)
  const uint8_t* const* key_rows = nullptr;  // [num_keys] -> one stored key row ([dim/2 + dim/32] bytes) each
  float* scores = nullptr;         // scores[t * score_stride + j]
  int64_t num_queries = 0;
  int64_t num_keys = 0;            // any count (ragged tails included)
  int64_t score_stride = 0;
  int heads = 0;
  int64_t dim = 0;                 // a multiple of 32
  Arena* scratch = nullptr;        // as IndexScoreArgs::scratch
};

// The oracle twin: each row dequantised (exactly), then index_scores_reference.
void index_scores_rows_reference(const IndexScoreRowsArgs& args);
// Rows dequantised, then index_scores_packed16 (same bits).
void index_scores_rows_packed16(const IndexScoreRowsArgs& args);
// The exact-integer kernels on the packed bytes, same bits as the oracle. q and k are e2m1 times power-of-two
// scales: q_d = iq_d * 2^eq_b, k_d = ik_d * 2^(u_b - 128) with iq, ik integers in [-12, 12] (twice the e2m1
// value), so a block's products are integers times 2^E_b, E_b = eq_b + u_b - 128, and the dot product is
// N * 2^E_min with N = Σ_b 2^(E_b - E_min) Σ_{d in b} iq_d ik_d an exact integer. Every partial sum of the
// reference's in-order fp32 loop is such an integer multiple of 2^E_min bounded by Σ_b 12 Σ|iq_b| 2^(E_b - E_min);
// when that bound is < 2^24 and 2^E_min is a normal float (E_min in [-126, 103]), every product and partial sum
// is exact in fp32, so the reference's rounded sum IS N * 2^E_min. The kernels check this per (query, head, key)
// and compute that group of 16 keys with index_dots16 on dequantised keys where it fails, and the whole call
// that way when q is not MXFP4-shaped; either way the bits are the oracle's (kernels/index_score_exact.h).
// AVX2 (vpmaddubsw, the x86-64-v3 baseline; heads weighed by weigh_heads16_avx2):
void index_scores_rows_avx2(const IndexScoreRowsArgs& args);
// AVX-512 VNNI (vpdpbusd; weigh_heads16_avx512); nullptr when the CPU lacks AVX-512 F/BW/VNNI.
using IndexScoreRowsKernel = void (*)(const IndexScoreRowsArgs& args);
IndexScoreRowsKernel index_scores_rows_vnni();
// AVX-512 F/BW without VNNI (512-bit vpmaddubsw; weigh_heads16_avx512); nullptr when the CPU lacks AVX-512 F/BW.
IndexScoreRowsKernel index_scores_rows_avx512bw();

}  // namespace dsflash
