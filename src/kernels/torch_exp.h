// exp as the reference's CPU PyTorch computes it (spec/MODEL.md "Numerics"): element-wise ops run vectorised
// over whole chunks of 2 x 8 floats (AVX2 Vectorized<float>, the goldens' build) with SLEEF's expf_u10, and the
// remainder of the tensor with the scalar std::exp. The two differ in the last ulp now and then, which is
// enough to move a bf16 rounding downstream (attention probabilities, the compressor's softmax weights).
#pragma once

#include <cstdint>

namespace dsflash {

// Elements per vectorised chunk of PyTorch's element-wise CPU loop.
inline constexpr int64_t kTorchVectorChunk = 16;

// SLEEF expf_u10 (Cody-Waite reduction by ln 2, degree-6 polynomial with FMAs, scaling by 2^q in two steps).
float sleef_expf_u10(float x);

// exp of element `index` of a contiguous tensor of `count` elements, as torch.exp evaluates it.
inline bool torch_exp_vector_path(int64_t index, int64_t count) {
  return index < count - count % kTorchVectorChunk;
}
float torch_exp_element(float x, int64_t index, int64_t count);

}  // namespace dsflash
