// Fused activation quantisation + quantised GEMM (model.py linear() for FP8 / MXFP4 weights, §4.9).
#include <span>

#include "core/thread_pool.h"
#include "formats/quant.h"
#include "kernels/linear.h"

namespace dsflash {

namespace {

struct QuantisedRows {
  std::span<uint8_t> codes, scales;  // [rows, k] e4m3, [rows, k/32] ue8m0
};

// Codes and scales in `scratch` (the caller's thread scratch, held through the GEMM).
QuantisedRows quantise_rows(const float* x, int64_t rows, int64_t k, ThreadPool* pool, ThreadScratch& scratch) {
  QuantisedRows q;
  q.codes = scratch.take<uint8_t>(static_cast<size_t>(rows * k));
  q.scales = scratch.take<uint8_t>(static_cast<size_t>(rows * (k / 32)));
  auto body = [&](int64_t begin, int64_t end, int) {
    for (int64_t r = begin; r < end; ++r)
      act_quant_block32(x + r * k, k, q.codes.data() + r * k, q.scales.data() + r * (k / 32));
  };
  if (pool && rows > 1) pool->parallel_for(rows, body);
  else body(0, rows, 0);
  return q;
}

}  // namespace

void linear_fp8(const float* x, int64_t rows, const Fp8Weight& w, float* y, const LinearKernels& kernels,
                ThreadPool* pool) {
  if (rows <= 0) return;
  ThreadScratch scratch(pool, 0);
  QuantisedRows q = quantise_rows(x, rows, w.in, pool, scratch);
  kernels.fp8_gemm(Fp8Activations{q.codes.data(), q.scales.data(), rows, w.in}, w, y, pool);
}

void linear_fp4(const float* x, int64_t rows, const Fp4Weight& w, float* y, const LinearKernels& kernels,
                ThreadPool* pool) {
  if (rows <= 0) return;
  ThreadScratch scratch(pool, 0);
  QuantisedRows q = quantise_rows(x, rows, w.in, pool, scratch);
  kernels.fp4_gemm(Fp8Activations{q.codes.data(), q.scales.data(), rows, w.in}, w, y, pool);
}

}  // namespace dsflash
