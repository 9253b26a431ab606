// The rotation of rotary position embedding (spec/MODEL.md §4.6, model.py apply_rotary_emb); the angle tables
// stay with the layer (model/rope.h). Interleaved pairs (x[2i], x[2i+1]) times (cos_i + i sin_i), each product
// rounded to fp32 before the add (torch's complex multiply, no FMA); inverse uses the conjugate. The result is
// rounded to bf16 (the reference rotates bf16 tensors in place).
#pragma once

#include <cstdint>

namespace dsflash {

// `count` vectors x + v*stride (v < count), each [2*pairs] fp32 (bf16 values), rotated in place by the shared
// angles cos/sin [pairs] fp32.
void rope_rotate_pairs(float* x, int64_t count, int64_t stride, const float* cos, const float* sin, int64_t pairs,
                       bool inverse);

}  // namespace dsflash
