// RMSNorm (spec/MODEL.md §4.2 and "Numerics"): y = bf16( w * (x * rsqrt(mean(x²) + eps)) ).
// Statistics in fp32 (cascade order of the reference, kernels/reduce.h), rsqrt as 1/sqrt (two IEEE
// roundings, as the reference's rsqrt), the weight product in fp32, one rounding to bf16 at the end.
#pragma once

#include <cstdint>

namespace dsflash {

class ThreadPool;

// x [rows, dim] fp32 (usually bf16 values), weight [dim] bf16 bits, out [rows, dim] bf16 values in fp32.
// out may alias x. pool may be nullptr.
void rmsnorm_bf16(const float* x, int64_t rows, int64_t dim, const uint16_t* weight, float eps, float* out,
                  ThreadPool* pool = nullptr);

// The reciprocal RMS of one row: 1 / sqrt(mean(x²) + eps) in fp32.
float reciprocal_rms(const float* x, int64_t dim, float eps);

}  // namespace dsflash
