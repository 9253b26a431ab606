// SwiGLU of the MoE experts (spec/MODEL.md §4.8, model.py Expert.forward): the w1 / w3 GEMM outputs are bf16
// tensors in the reference, the activation runs in fp32 with the clamps, the routed weight, and a bf16 result.
// Per element:
//   g = bf16(gate), u = bf16(up); with limit > 0: u = clamp(u, -limit, limit), g = min(g, limit);
//   out = bf16(weight * (silu(g) * u)),  silu(g) = g / (1 + expf(-g)) in fp32 with the C library's expf.
// weight is 1 for the shared expert (a multiply by 1 changes no bit).
#pragma once

#include <cstdint>

namespace dsflash {

// gate, up, out [n] fp32 (out may alias gate or up).
using SwigluKernel = void (*)(const float* gate, const float* up, int64_t n, float limit, float weight, float* out);

// The scalar oracle: the formula above, element by element.
void swiglu_reference(const float* gate, const float* up, int64_t n, float limit, float weight, float* out);
// The same bits, 8 lanes (AVX2, the build baseline): g is a bf16 value, so silu(g) comes from a table of all
// 65536 bf16 values built once with the same expression (vpgatherdd); the clamps and the bf16 rounding in integer
// and compare-blend operations with the reference's NaN behaviour (std::min / std::clamp keep a NaN). A limit
// that is not a bf16 value (min(g, limit) could leave the table) takes the oracle.
void swiglu_avx2(const float* gate, const float* up, int64_t n, float limit, float weight, float* out);

}  // namespace dsflash
