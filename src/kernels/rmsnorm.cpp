#include "kernels/rmsnorm.h"

#include <cmath>

#include "core/thread_pool.h"
#include "formats/formats.h"
#include "kernels/reduce.h"

namespace dsflash {

float reciprocal_rms(const float* x, int64_t dim, float eps) {
  const float mean = cascade_sum_squares(x, dim) / static_cast<float>(dim);
  return 1.0f / std::sqrt(mean + eps);
}

void rmsnorm_bf16(const float* x, int64_t rows, int64_t dim, const uint16_t* weight, float eps, float* out,
                  ThreadPool* pool) {
  auto run = [&](int64_t begin, int64_t end, int) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = x + r * dim;
      float* dst = out + r * dim;
      const float inv = reciprocal_rms(row, dim, eps);
      for (int64_t i = 0; i < dim; ++i) {
        const float normed = row[i] * inv;
        dst[i] = round_to_bf16(bf16_to_f32(weight[i]) * normed);
      }
    }
  };
  if (pool != nullptr && rows > 1) {
    pool->parallel_for(rows, run);
  } else {
    run(0, rows, 0);
  }
}

}  // namespace dsflash
