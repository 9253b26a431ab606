// Matmuls on the checkpoint's stored weight formats (spec/MODEL.md §4.9), y = x · Wᵀ.
// Every kernel has a scalar reference (the oracle: it defines the reference's numerics) and faster
// versions chosen once at start from the CPU's features; tests compare them.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "kernels/peak_probe.h"

namespace dsflash {

class ThreadPool;

// Activations quantised by act_quant_block32: codes [rows, k] e4m3, scales [rows, k/32] ue8m0.
struct Fp8Activations {
  const uint8_t* codes = nullptr;
  const uint8_t* scales = nullptr;
  int64_t rows = 0;
  int64_t k = 0;
};

// Order of FP8 codes / FP4 packed codes in memory.
// Row-major (the checkpoint's): output o's codes at o * in + k (FP8), byte o * in/2 + k/2, low nibble = even k (FP4).
// Tile-major (a load-time repack for kernels that read 16 outputs at a time, LinearKernels::prefers_tile_major):
// every 16 outputs are one tile of contiguous bytes, cut into 64-byte vectors that each hold a few k of all 16
// outputs, k ascending (so a 32-K block of a tile is 512 / 256 consecutive bytes). Inside a vector, the bytes
// sit where a kernel that decodes them to bf16 gets 32-bit lane i = two adjacent k of output i (an operand of
// vdpbf16ps against a broadcast activation pair), with i = o % 16:
// - FP8, 4 k per vector: code (o, k) at byte 16 * (i/4) + 8 * ((k%4)/2) + 2 * (i%4) + k%2 of vector k/4.
//   vpunpck{l,h}bw of the decoded low/high bytes give lane i = pairs k/2 = 2v and 2v+1 of vector v.
// - FP4, 8 k per vector: code (o, k) in 16-bit word 2i + k%2 of vector k/8, nibble (k%8)/2 of that word.
//   vpermw on the words shifted right by 4q gives lane i = pair 4v + q of vector v.
// FP4 scales move with their codes: scale (o, b) at (o/16) * 16 * kb + 16 * b + o%16 (kb = in/32), so that a
// tile's 16 scales of a block are 16 consecutive bytes; FP8 scales (one per 32x32 block) never move.
// Possible when out % 16 == 0 and in % 32 == 0 (every quantised linear of the real model).
constexpr int64_t kTileMajorOutputs = 16;
constexpr int64_t kTileMajorVectorBytes = 64;
inline bool tile_major_possible(int64_t out, int64_t in) {
  return out > 0 && in > 0 && out % kTileMajorOutputs == 0 && in % 32 == 0;
}
// Byte of FP8 code (o, k) in the tile-major order of a weight with `in` inputs.
inline int64_t fp8_tile_major_offset(int64_t o, int64_t k, int64_t in) {
  const int64_t i = o % kTileMajorOutputs;
  return (o - i) * in + (k / 4) * kTileMajorVectorBytes + 16 * (i / 4) + 8 * ((k % 4) / 2) + 2 * (i % 4) + k % 2;
}
// Byte and bit shift of FP4 code (o, k) in the tile-major order of a weight with `in` inputs.
struct NibbleOffset {
  int64_t byte;
  int shift;  // 0: low nibble, 4: high nibble
};
inline NibbleOffset fp4_tile_major_offset(int64_t o, int64_t k, int64_t in) {
  const int64_t i = o % kTileMajorOutputs;
  const int64_t q = (k % 8) / 2;  // nibble of the 16-bit word
  return {(o - i) * (in / 2) + (k / 8) * kTileMajorVectorBytes + 2 * (2 * i + k % 2) + q / 2, static_cast<int>(4 * (q % 2))};
}
// Index of FP4 scale (o, b) in either order, for a weight with kb = in/32 blocks per output.
inline int64_t fp4_scale_index(int64_t o, int64_t b, int64_t kb, bool tile_major) {
  if (!tile_major) return o * kb + b;
  const int64_t i = o % kTileMajorOutputs;
  return (o - i) * kb + kTileMajorOutputs * b + i;
}
// Writes a row-major weight into `tile_major` (the same number of bytes, not overlapping), tiles split over the
// pool (nullptr: this thread). Precondition: tile_major_possible(out, in). FP8: returns whether any code is a NaN
// (0x7f / 0xff), checked on each tile as it is written (Fp8Weight::may_hold_nan), and fills `plain_code_blocks`
// (fp8_plain_code_block_count bytes, see Fp8Weight) unless it is nullptr.
bool repack_fp8_tile_major(const uint8_t* row_major, int64_t out, int64_t in, uint8_t* tile_major,
                           ThreadPool* pool = nullptr, uint8_t* plain_code_blocks = nullptr);
// Subnormal (exponent field 0, mantissa not 0) or NaN (0x7f / 0xff): the e4m3 codes whose bf16 bits a 64-entry
// table on 6 of their 7 magnitude bits cannot give (Fp8Weight::plain_code_blocks).
inline bool fp8_code_is_subnormal_or_nan(uint8_t c) {
  const uint8_t magnitude = c & 0x7f;  // subnormal: 1..7 (exponent field 0); NaN: 0x7f
  return (static_cast<uint8_t>(magnitude - 1) < 7) | (magnitude == 0x7f);  // `|`: no branch, so loops vectorise
}
// Bytes of Fp8Weight::plain_code_blocks for a weight [out, in]: one per 16-output tile and 32-k block.
inline int64_t fp8_plain_code_block_count(int64_t out, int64_t in) { return out / kTileMajorOutputs * (in / 32); }
void repack_fp4_tile_major(const uint8_t* row_major, int64_t out, int64_t in, uint8_t* tile_major,
                           ThreadPool* pool = nullptr);
// FP4 scales [out, in/32] -> the tile-major order above (out * in/32 bytes), split like the codes.
void repack_fp4_scales_tile_major(const uint8_t* row_major, int64_t out, int64_t in, uint8_t* tile_major,
                                  ThreadPool* pool = nullptr);

// FP8 linear weight: codes [out, in] e4m3, scales [ceil(out/32), ceil(in/32)] ue8m0 (one per 32x32 block).
struct Fp8Weight {
  const uint8_t* codes = nullptr;
  const uint8_t* scales = nullptr;
  int64_t out = 0;
  int64_t in = 0;
  bool tile_major = false;  // codes in tile-major order (see above)
  // False when no code is a NaN (0x7f / 0xff), as the load-time tile-major copy finds out (repack_fp8_tile_major):
  // kernels whose fast paths would turn NaN codes into numbers then skip looking for them.
  bool may_hold_nan = true;
  // Tile-major only: [out/16, in/32], 1 where the tile's block (its 512 codes) holds no subnormal and no NaN code
  // (fp8_code_is_subnormal_or_nan), as the load-time copy finds out. The AVX-512 kernels with VBMI decode
  // such blocks with two 64-entry byte lookups (vpermb) instead of two 128-entry ones (vpermt2b, about twice the
  // shuffle port's time each); the same bits either way. nullptr: every block takes the 128-entry lookups. (An
  // estimate, not a measurement of released weights: normal-like weights quantised per 32x32 block put a subnormal,
  // |w| below ~5e-5 of the block's largest, in roughly one 512-code block in 15.)
  const uint8_t* plain_code_blocks = nullptr;
};
// Outputs [first, first + count) of w, the same bytes from output `first` on in either order (a tile-major tile's
// codes are contiguous), with their scales and block flags. first: a multiple of 32 (one scale row per 32 outputs).
inline Fp8Weight fp8_output_slice(const Fp8Weight& w, int64_t first, int64_t count) {
  Fp8Weight slice = w;
  slice.codes = w.codes + first * w.in;
  slice.scales = w.scales + first / 32 * ((w.in + 31) / 32);
  if (w.plain_code_blocks != nullptr)
    slice.plain_code_blocks = w.plain_code_blocks + first / kTileMajorOutputs * (w.in / 32);
  slice.out = count;
  return slice;
}
// Output o's block b (32 codes, k order) in row-major bytes: a pointer into the weight when it is row-major,
// else `scratch` after gathering them.
const uint8_t* fp8_block_codes(const Fp8Weight& w, int64_t o, int64_t b, uint8_t (&scratch)[32]);

// MXFP4 routed-expert weight: packed [out, in/2] e2m1 (low nibble = even k), scales [out, in/32] ue8m0.
struct Fp4Weight {
  const uint8_t* packed = nullptr;
  const uint8_t* scales = nullptr;
  int64_t out = 0;
  int64_t in = 0;
  bool tile_major = false;  // packed codes and scales in tile-major order (see above)
};
// Output o's block b as 16 row-major packed bytes (low nibble = even k): into the weight, or `scratch`.
const uint8_t* fp4_block_packed(const Fp4Weight& w, int64_t o, int64_t b, uint8_t (&scratch)[16]);
// Two row-major MXFP4 weights of one shape [out, in] that read the same activations (an expert's w1 and w3) -> one
// tile-major weight of 2 * out outputs whose 16-output tiles alternate: tile 2t is a's tile t, tile 2t + 1 b's
// (packed [2 * out, in/2], scales [2 * out, in/32] in the tile-major orders above). One GEMM on it gives both
// weights' outputs, each row [2 * out]: a's output o at column fp4_pair_column(o), b's 16 columns further. Tiles are
// split over the pool as a GEMM on the pair splits them (node-local reads). Precondition: tile_major_possible.
void repack_fp4_pair_tile_major(const Fp4Weight& a, const Fp4Weight& b, uint8_t* packed, uint8_t* scales,
                                ThreadPool* pool = nullptr);
inline int64_t fp4_pair_column(int64_t o) { return o + o / kTileMajorOutputs * kTileMajorOutputs; }

// BF16 weight [out, in] (also used for "promoted to fp32" weights: bf16 -> fp32 is exact).
struct Bf16Weight {
  const uint16_t* data = nullptr;
  int64_t out = 0;
  int64_t in = 0;
};

// Outputs are fp32 [rows, out] before any bf16 rounding; callers round where the reference rounds.
// FP8/FP4 (kernel.py's fp8_gemm / fp4_gemm): per 32-wide K block, partial = Σ a·w in fp32, then
// y = y + (partial · sa) · sw (activation scale first), blocks in K order, y starting at 0. The products are
// exact in fp32; the reference sums a block's 32 products in k order, the SIMD sets in another order, so
// they agree bit for bit whenever a block's sum is exact in fp32 (nearly always) and within the reordering
// bound otherwise (tests/kernels/test_linear_fast.cpp).
// BF16: x is fp32 (bf16 activations, or genuine fp32 for the "fp32" linears); the reference sums in K order
// with fused multiply-adds; the SIMD sets sum 16 (or 8) lanes and reduce, within the reordering bound.
// FP8 as BF16 (spec §3: wo_a is stored FP8, convert.py dequantises it to bf16 and the reference runs a bf16
// matmul): the BF16 linear of the weight W = bf16(e4m3 · sw), which is exact (3 mantissa bits times a power of
// two), computed from the codes, so it reads half the bytes of a bf16 copy. The reference is the BF16 reference on
// those values (bit for bit what a dequantised copy gives); the SIMD sets sum each 32-K block, scale it by sw
// (exact) and add the blocks in K order, within the same reordering bound.
// The quantised formats whose weights a kernel table reads fastest in tile-major order (the load-time repack).
struct TileMajorFormats {
  bool fp8 = false;
  bool fp4 = false;
  bool any() const { return fp8 || fp4; }
};

struct LinearKernels {
  const char* name;
  // Every table reads both weight orders; these formats run fastest on tile-major weights.
  TileMajorFormats prefers_tile_major;
  void (*fp8_gemm)(const Fp8Activations& x, const Fp8Weight& w, float* y, ThreadPool* pool);
  void (*fp4_gemm)(const Fp8Activations& x, const Fp4Weight& w, float* y, ThreadPool* pool);
  void (*bf16_gemm)(const float* x, int64_t rows, const Bf16Weight& w, float* y, ThreadPool* pool);
  void (*fp8_as_bf16_gemm)(const float* x, int64_t rows, const Fp8Weight& w, float* y, ThreadPool* pool);
  // The dense-compute limit of this table's GEMMs, for speed figures (the instruction its many-row GEMMs multiply
  // with).
  PeakOps gemm_peak = PeakOps::kBf16Dot;
  // This table's own fp8_as_bf16_grouped_gemm (below), or nullptr: one fp8_as_bf16_gemm per group.
  void (*fp8_as_bf16_grouped_gemm)(const float* x, int64_t rows, int64_t groups, const Fp8Weight& w, float* y,
                                   ThreadPool* pool) = nullptr;
  // MXFP4 GEMMs of at least this many rows (on tile-major weights) multiply on the AMX tile unit
  // (PeakOps::kAmxBf16) rather than with gemm_peak's instruction, for speed figures; 0: none do.
  int64_t fp4_amx_min_rows = 0;
};

// Preconditions of every kernel (the kernels trust their arguments; check once when binding weights):
// x.k == w.in, w.in % 32 == 0 (FP8/FP4), scale tensors as documented above, y has rows*out floats.
// pool may be nullptr (single-threaded). These return an error naming the mismatch.
Status check_fp8_linear(const Fp8Activations& x, const Fp8Weight& w);
Status check_fp4_linear(const Fp8Activations& x, const Fp4Weight& w);
Status check_bf16_linear(int64_t x_k, const Bf16Weight& w);
Status check_fp8_as_bf16_linear(int64_t x_k, const Fp8Weight& w);
// The grouped form below: x_k == groups * w.in and each group has whole 32-output scale blocks.
Status check_fp8_as_bf16_grouped_linear(int64_t x_k, int64_t groups, const Fp8Weight& w);

// The scalar oracle (single-threaded even when given a pool).
const LinearKernels& reference_linear_kernels();
// The fastest set this CPU runs (AVX-512 / AVX2 / scalar), chosen once.
const LinearKernels& best_linear_kernels();

// The block-diagonal fp8_as_bf16 linear of wo_a's grouped einsum (model.py): w [groups * out_g, in] holds the
// groups' weights one after another (out_g = w.out / groups), x [rows, groups * in] their inputs side by side,
// y [rows, groups * out_g] fp32: group g's outputs at columns g * out_g, from x's columns g * in. Each group's
// results are those of fp8_as_bf16_gemm on its own columns and rows of w. kernels.fp8_as_bf16_grouped_gemm where
// the table has one (all groups in one pass over the pool, split like w's load-time copy), else one
// fp8_as_bf16_gemm per group.
void fp8_as_bf16_grouped_gemm(const float* x, int64_t rows, int64_t groups, const Fp8Weight& w, float* y,
                              const LinearKernels& kernels, ThreadPool* pool);

// model.py's linear() for quantised weights, fused: act_quant_block32 (src/formats/quant.h) of each row of
// x, then the kernel set's fp8_gemm / fp4_gemm. x [rows, w.in] fp32 (bf16-representable activations),
// y [rows, w.out] fp32 before any bf16 rounding. Quantisation runs on the pool too (rows are independent).
void linear_fp8(const float* x, int64_t rows, const Fp8Weight& w, float* y, const LinearKernels& kernels,
                ThreadPool* pool);
void linear_fp4(const float* x, int64_t rows, const Fp4Weight& w, float* y, const LinearKernels& kernels,
                ThreadPool* pool);

}  // namespace dsflash
