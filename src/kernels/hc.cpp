#include "kernels/hc.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "core/thread_pool.h"
#include "formats/formats.h"
#include "kernels/reduce.h"
#include "kernels/torch_exp.h"

namespace dsflash {
namespace {

// torch.sigmoid: vectorised (SLEEF exp) over whole 16-float chunks of the tensor, scalar std::exp on the tail.
float sigmoid(float x, bool vector_path) {
  const float e = vector_path ? sleef_expf_u10(-x) : std::exp(-x);
  return 1.0f / (1.0f + e);
}

}  // namespace

void hc_split_sinkhorn(const float* mixes, const float* scale, const float* base, const HcShape& shape, float* pre,
                       float* post, float* comb, int scalar_from) {
  const int hc = shape.hc;
  const float eps = shape.hc_eps;
  for (int i = 0; i < hc; ++i) {
    const float pre_logit = mixes[i] * scale[0] + base[i];
    pre[i] = sigmoid(pre_logit, i < scalar_from) + eps;
    const float post_logit = mixes[hc + i] * scale[1] + base[hc + i];
    post[i] = 2.0f * sigmoid(post_logit, i < scalar_from);
  }
  // comb logits, row-major [hc, hc]; row softmax (max-subtracted), then + eps.
  for (int r = 0; r < hc; ++r) {
    float* row = comb + r * hc;
    for (int c = 0; c < hc; ++c) row[c] = mixes[2 * hc + r * hc + c] * scale[2] + base[2 * hc + r * hc + c];
    float max_value = row[0];
    for (int c = 1; c < hc; ++c) max_value = std::max(max_value, row[c]);
    float sum = 0.0f;
    for (int c = 0; c < hc; ++c) {
      row[c] = sleef_expf_u10(row[c] - max_value);
      sum += row[c];
    }
    for (int c = 0; c < hc; ++c) row[c] = row[c] / sum + eps;
  }
  auto normalise_columns = [&] {
    for (int c = 0; c < hc; ++c) {
      float sum = 0.0f;
      for (int r = 0; r < hc; ++r) sum += comb[r * hc + c];
      const float den = sum + eps;
      for (int r = 0; r < hc; ++r) comb[r * hc + c] = comb[r * hc + c] / den;
    }
  };
  auto normalise_rows = [&] {
    for (int r = 0; r < hc; ++r) {
      float sum = 0.0f;
      for (int c = 0; c < hc; ++c) sum += comb[r * hc + c];
      const float den = sum + eps;
      for (int c = 0; c < hc; ++c) comb[r * hc + c] = comb[r * hc + c] / den;
    }
  };
  normalise_columns();
  for (int it = 1; it < shape.sinkhorn_iters; ++it) {
    normalise_rows();
    normalise_columns();
  }
}

void hc_mix_dots_reference(const float* streams, int64_t num_tokens, const float* fn, int mix_count, int64_t flat,
                           float* dots, ThreadPool* pool) {
  auto run = [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t) {
      const float* x = streams + t * flat;
      for (int m = 0; m < mix_count; ++m) {
        const float* w = fn + m * flat;
        float acc = 0.0f;
        for (int64_t i = 0; i < flat; ++i) acc += x[i] * w[i];
        dots[t * mix_count + m] = acc;
      }
    }
  };
  if (pool != nullptr && num_tokens > 1) {
    pool->parallel_for(num_tokens, run);
  } else {
    run(0, num_tokens, 0);
  }
}

namespace {

// dots [tokens, mix_count] from `dots_kernel`, then per token: mixes = dots * rsqrt(mean(flat²) + norm_eps) and
// the Sinkhorn split. sum_squares(x, n) must equal cascade_sum_squares(x, n) (kReferenceReduceWidth).
void hc_mixes_impl(HcMixDots dots_kernel, float (*sum_squares)(const float*, int64_t), const float* streams,
                   int64_t num_tokens, const HcSiteWeights& site, const HcShape& shape, float* pre, float* post,
                   float* comb, ThreadPool* pool) {
  const int hc = shape.hc;
  const int mix_count = shape.mix_count();
  const int64_t flat = hc * shape.dim;
  ThreadScratch scratch(pool);
  const std::span<float> dots = scratch.take<float>(static_cast<size_t>(std::max<int64_t>(1, num_tokens * mix_count)));
  dots_kernel(streams, num_tokens, site.fn, mix_count, flat, dots.data(), pool);
  auto run = [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t) {
      const float* x = streams + t * flat;
      const float mean_square = sum_squares(x, flat) / static_cast<float>(flat);
      const float inv_rms = 1.0f / std::sqrt(mean_square + shape.norm_eps);
      float* mixes = dots.data() + t * mix_count;  // [(2+hc)*hc], scaled in place
      for (int m = 0; m < mix_count; ++m) mixes[m] = mixes[m] * inv_rms;
      // The reference applies sigmoid to the whole [tokens, hc] tensor: elements past the last full 16-float
      // chunk take its scalar path.
      const int64_t vector_end = (num_tokens * hc / kTorchVectorChunk) * kTorchVectorChunk;
      const int scalar_from = static_cast<int>(std::clamp<int64_t>(vector_end - t * hc, 0, hc));
      hc_split_sinkhorn(mixes, site.scale, site.base, shape, pre + t * hc, post + t * hc, comb + t * hc * hc,
                        scalar_from);
    }
  };
  if (pool != nullptr && num_tokens > 1) {
    pool->parallel_for(num_tokens, run);
  } else {
    run(0, num_tokens, 0);
  }
}

float scalar_sum_squares(const float* x, int64_t n) { return cascade_sum_squares(x, n, kReferenceReduceWidth); }

}  // namespace

void hc_mixes(const float* streams, int64_t num_tokens, const HcSiteWeights& site, const HcShape& shape, float* pre,
              float* post, float* comb, ThreadPool* pool) {
  hc_mixes_impl(hc_mix_dots_reference, scalar_sum_squares, streams, num_tokens, site, shape, pre, post, comb, pool);
}

void hc_mixes_with(HcMixDots dots, const float* streams, int64_t num_tokens, const HcSiteWeights& site,
                   const HcShape& shape, float* pre, float* post, float* comb, ThreadPool* pool) {
  hc_mixes_impl(dots, cascade_sum_squares_avx2, streams, num_tokens, site, shape, pre, post, comb, pool);
}

void hc_pre(const float* streams, int64_t num_tokens, int hc, int64_t dim, const float* pre_mix, float* out) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* x = streams + t * hc * dim;
    const float* p = pre_mix + t * hc;
    float* dst = out + t * dim;
    for (int64_t i = 0; i < dim; ++i) {
      float acc = 0.0f;
      for (int j = 0; j < hc; ++j) acc += p[j] * x[j * dim + i];
      dst[i] = round_to_bf16(acc);
    }
  }
}

void hc_post(const float* y, const float* residual, int64_t num_tokens, int hc, int64_t dim, const float* post,
             const float* comb, float* out) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* yt = y + t * dim;
    const float* r = residual + t * hc * dim;
    const float* c = comb + t * hc * hc;
    const float* p = post + t * hc;
    float* dst = out + t * hc * dim;
    for (int k = 0; k < hc; ++k) {
      for (int64_t i = 0; i < dim; ++i) {
        float mixed = 0.0f;
        for (int j = 0; j < hc; ++j) mixed += c[j * hc + k] * r[j * dim + i];
        dst[k * dim + i] = round_to_bf16(p[k] * yt[i] + mixed);
      }
    }
  }
}

}  // namespace dsflash
