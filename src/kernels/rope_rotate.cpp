#include "kernels/rope_rotate.h"

#include "formats/formats.h"

namespace dsflash {

void rope_rotate_pairs(float* x, int64_t count, int64_t stride, const float* cos, const float* sin, int64_t pairs,
                       bool inverse) {
  for (int64_t v = 0; v < count; ++v) {
    float* xv = x + v * stride;
    for (int64_t i = 0; i < pairs; ++i) {
      const float a = xv[2 * i];
      const float b = xv[2 * i + 1];
      const float c = cos[i];
      const float d = inverse ? -sin[i] : sin[i];
      // (a + ib)(c + id) = (ac - bd) + i(ad + bc), each product rounded (torch's complex multiply, no FMA).
      const float ac = a * c;
      const float bd = b * d;
      const float ad = a * d;
      const float bc = b * c;
      xv[2 * i] = round_to_bf16(ac - bd);
      xv[2 * i + 1] = round_to_bf16(ad + bc);
    }
  }
}

}  // namespace dsflash
