// Linears composed from a kernel table's GEMMs: fused activation quantisation + quantised GEMM (model.py linear()
// for FP8 / MXFP4 weights, §4.9), and the grouped fp8-as-bf16 linear on tables without their own.
#include <cstring>
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

void fp8_as_bf16_grouped_gemm(const float* x, int64_t rows, int64_t groups, const Fp8Weight& w, float* y,
                              const LinearKernels& kernels, ThreadPool* pool) {
  if (rows <= 0) return;
  if (kernels.fp8_as_bf16_grouped_gemm != nullptr) {
    kernels.fp8_as_bf16_grouped_gemm(x, rows, groups, w, y, pool);
    return;
  }
  if (groups == 1) {
    kernels.fp8_as_bf16_gemm(x, rows, w, y, pool);
    return;
  }
  // One call per group on its gathered columns: x_g [rows, in], y_g [rows, out_g].
  const int64_t out_g = w.out / groups, in = w.in;
  ThreadScratch scratch(pool);
  const std::span<float> group_x = scratch.take<float>(static_cast<size_t>(rows * in));
  const std::span<float> group_y = scratch.take<float>(static_cast<size_t>(rows * out_g));
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(group_x.data() + r * in, x + (r * groups + g) * in, static_cast<size_t>(in) * sizeof(float));
    // Group g's rows of w: whole 16-row tiles in either order and whole 32-row scale blocks (out_g % 32 == 0).
    const Fp8Weight group_w = fp8_output_slice(w, g * out_g, out_g);
    kernels.fp8_as_bf16_gemm(group_x.data(), rows, group_w, group_y.data(), pool);
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(y + (r * groups + g) * out_g, group_y.data() + r * out_g, static_cast<size_t>(out_g) * sizeof(float));
  }
}

void linear_fp8(const float* x, int64_t rows, const Fp8Weight& w, float* y, const LinearKernels& kernels,
                ThreadPool* pool) {
  if (rows <= 0) return;
  ThreadScratch scratch(pool);
  QuantisedRows q = quantise_rows(x, rows, w.in, pool, scratch);
  kernels.fp8_gemm(Fp8Activations{q.codes.data(), q.scales.data(), rows, w.in}, w, y, pool);
}

void linear_fp4(const float* x, int64_t rows, const Fp4Weight& w, float* y, const LinearKernels& kernels,
                ThreadPool* pool) {
  if (rows <= 0) return;
  ThreadScratch scratch(pool);
  QuantisedRows q = quantise_rows(x, rows, w.in, pool, scratch);
  kernels.fp4_gemm(Fp8Activations{q.codes.data(), q.scales.data(), rows, w.in}, w, y, pool);
}

}  // namespace dsflash
