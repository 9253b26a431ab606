// The linear layers as model.py's linear() runs them on the model's activations (spec/MODEL.md §4.9):
// FP8 weights take act_quant'ed activations (e4m3, ue8m0 per 32) and return bf16 (the reference's default dtype).
#pragma once

#include "formats/formats.h"
#include "model/compute_context.h"

namespace dsflash {

// y [rows, w.out] = bf16(x [rows, w.in] · Wᵀ) for an FP8 weight.
inline void fp8_linear_bf16(const float* x, int64_t rows, const Fp8Weight& w, float* y, const ComputeContext& ctx) {
  ProfileScope scope(ctx.profile, ProfilePhase::kLinear);
  ctx.backend->linear_fp8(x, rows, w, y, ctx.pool);
  round_to_bf16_inplace(y, rows * w.out);
}

// BF16 (or fp32-promoted) linear: fp32 sums; rounded to bf16 when the reference's output tensor is bf16.
inline void bf16_linear(const float* x, int64_t rows, const Bf16Weight& w, float* y, const ComputeContext& ctx,
                        bool round_output) {
  ProfileScope scope(ctx.profile, ProfilePhase::kLinear);
  ctx.backend->bf16_gemm(x, rows, w, y, ctx.pool);
  if (round_output) round_to_bf16_inplace(y, rows * w.out);
}

}  // namespace dsflash
