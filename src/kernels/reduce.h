// fp32 row sums in the order the reference's own (non-BLAS) reductions use, so RMSNorm statistics and
// the mHC norm statistic can reproduce the goldens bit for bit (spec/MODEL.md "Numerics").
//
// The reference computes `x.square().mean(-1)` with PyTorch's CPU cascade sum: lanes of `vector_width`
// floats, four interleaved vector accumulators, a 4-level cascade every 16 steps, then the scalar tail and
// the lanes added in order. Plain K-order summation differs from it by an ulp now and then, which is
// enough to move a bf16 rounding of a normalised activation.
#pragma once

#include <cstdint>

namespace dsflash {

// The vector width (floats) of the reduction the goldens were made with: 8 (AVX2). Measured on the goldens
// (tests/kernels/test_hc.cpp): width 8 reproduces every attn_in of tiny-a/b bit for bit and matches more pre_mix
// values than width 16.
inline constexpr int kReferenceReduceWidth = 8;

// Σ x[i] (fp32) in the cascade order described above.
float cascade_sum(const float* x, int64_t n, int vector_width = kReferenceReduceWidth);
// Σ x[i]² (fp32; each square rounded to fp32 first, as `x.square()` does).
float cascade_sum_squares(const float* x, int64_t n, int vector_width = kReferenceReduceWidth);

// cascade_sum_squares(x, n) at kReferenceReduceWidth, the same bits: the 8 lanes are AVX2 vectors and the four
// interleaved accumulators run side by side (which is what PyTorch itself does), instead of one lane at a time.
float cascade_sum_squares_avx2(const float* x, int64_t n);
// cascade_sum(x, n) at kReferenceReduceWidth, the same bits, the same way.
float cascade_sum_avx2(const float* x, int64_t n);

// Σ values[i] (fp32) in PyTorch's CPU cascade order for a reduced dimension that is not the innermost one
// (multi_row_sum): blocks of 2^level_power values into level 0, folded upwards. The indexer's sum over heads.
float outer_cascade_sum(const float* values, int64_t n);

}  // namespace dsflash
