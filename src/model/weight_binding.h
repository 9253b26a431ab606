// Typed access to checkpoint tensors for the model's layers: each function finds a tensor by name, checks its
// dtype and shape, and returns a view onto the mapped bytes (no copy). Errors name the tensor and what is wrong.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/checkpoint.h"
#include "kernels/linear.h"

namespace dsflash {

// BF16 [out, in] (embeddings, norms as [1, n], router weights, the head, bf16 linears).
Result<Bf16Weight> bind_bf16_matrix(const Checkpoint& checkpoint, const std::string& name, int64_t out, int64_t in);
// BF16 vector [n] (RMSNorm weights): the raw bf16 bits.
Result<const uint16_t*> bind_bf16_vector(const Checkpoint& checkpoint, const std::string& name, int64_t n);
// F32 tensor with exactly this shape.
Result<const float*> bind_f32(const Checkpoint& checkpoint, const std::string& name, std::vector<int64_t> shape);
// FP8 linear `prefix.weight` [out, in] e4m3 + `prefix.scale` [ceil(out/32), ceil(in/32)] ue8m0.
Result<Fp8Weight> bind_fp8_linear(const Checkpoint& checkpoint, const std::string& prefix, int64_t out, int64_t in);
// MXFP4 linear `prefix.weight` (F4 [out, in] or I8/U8 [out, in/2]) + `prefix.scale` [out, in/32] ue8m0.
Result<Fp4Weight> bind_fp4_linear(const Checkpoint& checkpoint, const std::string& prefix, int64_t out, int64_t in);

}  // namespace dsflash
