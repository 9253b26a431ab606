// Matmuls on the checkpoint's stored weight formats (spec/MODEL.md §4.9), y = x · Wᵀ.
// Every kernel has a scalar reference (the oracle: it defines the reference's numerics) and faster
// versions chosen once at start from the CPU's features; tests compare them.
#pragma once

#include <cstdint>

#include "core/status.h"

namespace dsflash {

class ThreadPool;

// Activations quantised by act_quant_block32: codes [rows, k] e4m3, scales [rows, k/32] ue8m0.
struct Fp8Activations {
  const uint8_t* codes = nullptr;
  const uint8_t* scales = nullptr;
  int64_t rows = 0;
  int64_t k = 0;
};

// Byte order of FP8 codes / FP4 packed bytes, rows of row_bytes (in for FP8, in/2 for FP4) per output.
// Row-major (the checkpoint's): output o's byte c at o * row_bytes + c.
// Tile-major (a load-time repack for kernels that read 16 outputs at a time): every 16 outputs
// [16, row_bytes] become [row_bytes/64][16][64]: byte c of output 16t + i at
// 16t * row_bytes + (c/64) * 1024 + i * 64 + c%64. A decode step then reads each tile as one forward stream
// instead of 16 interleaved ones. Possible when out % 16 == 0 and row_bytes % 64 == 0; scales never move.
constexpr int64_t kTileMajorOutputs = 16;
constexpr int64_t kTileMajorGroupBytes = 64;
inline bool tile_major_possible(int64_t out, int64_t row_bytes) {
  return out > 0 && row_bytes > 0 && out % kTileMajorOutputs == 0 && row_bytes % kTileMajorGroupBytes == 0;
}
inline int64_t weight_byte_offset(int64_t o, int64_t c, int64_t row_bytes, bool tile_major) {
  if (!tile_major) return o * row_bytes + c;
  return (o - o % kTileMajorOutputs) * row_bytes + (c / kTileMajorGroupBytes) * kTileMajorOutputs * kTileMajorGroupBytes +
         (o % kTileMajorOutputs) * kTileMajorGroupBytes + c % kTileMajorGroupBytes;
}
// Writes row-major bytes [out, row_bytes] into `tile_major` (out * row_bytes bytes, not overlapping) in tile-major
// order, tiles split over the pool (nullptr: this thread). Precondition: tile_major_possible(out, row_bytes).
void repack_tile_major(const uint8_t* row_major, int64_t out, int64_t row_bytes, uint8_t* tile_major,
                       ThreadPool* pool = nullptr);

// FP8 linear weight: codes [out, in] e4m3, scales [ceil(out/32), ceil(in/32)] ue8m0 (one per 32x32 block).
struct Fp8Weight {
  const uint8_t* codes = nullptr;
  const uint8_t* scales = nullptr;
  int64_t out = 0;
  int64_t in = 0;
  bool tile_major = false;  // codes in tile-major order (see above)
};

// MXFP4 routed-expert weight: packed [out, in/2] e2m1 (low nibble = even k), scales [out, in/32] ue8m0.
struct Fp4Weight {
  const uint8_t* packed = nullptr;
  const uint8_t* scales = nullptr;
  int64_t out = 0;
  int64_t in = 0;
  bool tile_major = false;  // packed bytes in tile-major order (see above)
};

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
struct LinearKernels {
  const char* name;
  // Every table reads both weight orders; this one's FP8/FP4 kernels are fastest on tile-major weights.
  bool prefers_tile_major;
  void (*fp8_gemm)(const Fp8Activations& x, const Fp8Weight& w, float* y, ThreadPool* pool);
  void (*fp4_gemm)(const Fp8Activations& x, const Fp4Weight& w, float* y, ThreadPool* pool);
  void (*bf16_gemm)(const float* x, int64_t rows, const Bf16Weight& w, float* y, ThreadPool* pool);
};

// Preconditions of every kernel (the kernels trust their arguments; check once when binding weights):
// x.k == w.in, w.in % 32 == 0 (FP8/FP4), scale tensors as documented above, y has rows*out floats.
// pool may be nullptr (single-threaded). These return an error naming the mismatch.
Status check_fp8_linear(const Fp8Activations& x, const Fp8Weight& w);
Status check_fp4_linear(const Fp8Activations& x, const Fp4Weight& w);
Status check_bf16_linear(int64_t x_k, const Bf16Weight& w);

// The scalar oracle (single-threaded even when given a pool).
const LinearKernels& reference_linear_kernels();
// The fastest set this CPU runs (AVX-512 / AVX2 / scalar), chosen once.
const LinearKernels& best_linear_kernels();

// model.py's linear() for quantised weights, fused: act_quant_block32 (src/formats/quant.h) of each row of
// x, then the kernel set's fp8_gemm / fp4_gemm. x [rows, w.in] fp32 (bf16-representable activations),
// y [rows, w.out] fp32 before any bf16 rounding. Quantisation runs on the pool too (rows are independent).
void linear_fp8(const float* x, int64_t rows, const Fp8Weight& w, float* y, const LinearKernels& kernels,
                ThreadPool* pool);
void linear_fp4(const float* x, int64_t rows, const Fp4Weight& w, float* y, const LinearKernels& kernels,
                ThreadPool* pool);

}  // namespace dsflash
