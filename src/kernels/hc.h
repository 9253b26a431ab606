// Manifold-constrained Hyper-Connections (mHC, spec/MODEL.md §4.2): the residual is hc parallel streams.
// Each site (attention, FFN) derives three coefficient sets from the streams themselves:
//   pre  [hc]     collapse weights for the NEXT sublayer's input (Single-Pass mHC shift),
//   post [hc]     how the sublayer output is written back to each stream,
//   comb [hc, hc] doubly stochastic residual mixing (Sinkhorn), comb[j][k]: source stream j -> stream k.
// All math in fp32; hc_pre / hc_post round their outputs to bf16 as the reference does.
#pragma once

#include <cstdint>

namespace dsflash {

class ThreadPool;

// The fp32 parameters of one site: hc_{attn,ffn}_{fn,base,scale}.
struct HcSiteWeights {
  const float* fn = nullptr;     // [(2+hc)*hc, hc*dim]
  const float* base = nullptr;   // [(2+hc)*hc]
  const float* scale = nullptr;  // [3]
};

struct HcShape {
  int hc = 4;
  int64_t dim = 0;
  int sinkhorn_iters = 20;
  float hc_eps = 1e-6f;     // Sinkhorn and pre-gate epsilon
  float norm_eps = 1e-20f;  // RMS statistic epsilon
  int mix_count() const { return (2 + hc) * hc; }
};

// mixes -> (pre, post, comb) for one token, the reference's iteration order: row softmax + eps, one column
// normalisation, then (iters-1) x (row, column) normalisations, each dividing by (sum + eps).
// mixes [(2+hc)*hc], pre [hc], post [hc], comb [hc*hc]. exp is computed as PyTorch's vectorised SLEEF expf_u10
// for gate elements i < scalar_from and with std::exp (its scalar tail path) from there on.
void hc_split_sinkhorn(const float* mixes, const float* scale, const float* base, const HcShape& shape, float* pre,
                       float* post, float* comb, int scalar_from = 1 << 30);

// streams [tokens, hc, dim] (bf16 values) -> pre [tokens, hc], post [tokens, hc], comb [tokens, hc, hc].
// mixes = (flat · fnᵀ) * rsqrt(mean(flat²) + norm_eps), one statistic per token over all hc*dim values;
// the fn product is summed in K order (the reference uses BLAS there).
void hc_mixes(const float* streams, int64_t num_tokens, const HcSiteWeights& site, const HcShape& shape, float* pre,
              float* post, float* comb, ThreadPool* pool = nullptr);

// The fn products of hc_mixes: dots [tokens, mix_count] fp32, dots[t][m] = Σ_i x_t[i] * fn[m][i] over the
// flat = hc*dim values of token t (streams [tokens, flat], fn [mix_count, flat]), summed i ascending from 0.0f,
// each product rounded to fp32 before it is added (no FMA): one serial chain per (token, mix). The SIMD kernels run
// many chains side by side in vector lanes and give the same bits. pool may be nullptr.
using HcMixDots = void (*)(const float* streams, int64_t num_tokens, const float* fn, int mix_count, int64_t flat,
                           float* dots, ThreadPool* pool);
// The scalar chains (split over the pool by tokens).
void hc_mix_dots_reference(const float* streams, int64_t num_tokens, const float* fn, int mix_count, int64_t flat,
                           float* dots, ThreadPool* pool);
// AVX2 (the build baseline): 8 tokens per vector, or 8 mixes per vector for the last few tokens (kernels/hc_dots.cpp).
HcMixDots hc_mix_dots_avx2();
// AVX-512F: 16 tokens per vector; nullptr when the CPU lacks AVX-512F.
HcMixDots hc_mix_dots_avx512();

// hc_mixes with the given dot kernel; the RMS statistic with cascade_sum_squares_avx2 (the same bits as the scalar
// cascade_sum_squares). hc_mixes itself is this with the scalar pieces.
void hc_mixes_with(HcMixDots dots, const float* streams, int64_t num_tokens, const HcSiteWeights& site,
                   const HcShape& shape, float* pre, float* post, float* comb, ThreadPool* pool);

// out [tokens, dim] = bf16( Σ_j pre_mix[j] * streams[j] ), j ascending, fp32 sum.
void hc_pre(const float* streams, int64_t num_tokens, int hc, int64_t dim, const float* pre_mix, float* out);

// out [tokens, hc, dim] = bf16( post[k] * y + Σ_j comb[j][k] * residual[j] ), j ascending, fp32.
// out must not alias residual.
void hc_post(const float* y, const float* residual, int64_t num_tokens, int hc, int64_t dim, const float* post,
             const float* comb, float* out);

// hc_pre / hc_post in AVX2 vectors over dim (kernels/hc_pre_post.cpp), the same bits.
void hc_pre_avx2(const float* streams, int64_t num_tokens, int hc, int64_t dim, const float* pre_mix, float* out);
void hc_post_avx2(const float* y, const float* residual, int64_t num_tokens, int hc, int64_t dim, const float* post,
                  const float* comb, float* out);

}  // namespace dsflash
