// Rotary position embedding of one layer (spec/MODEL.md §4.6; model.py precompute_freqs_cis and
// apply_rotary_emb). Rotates the last rope_dim channels of a vector as interleaved pairs (x[2i], x[2i+1]).
//   freq_i = 1 / base^(2i/rope_dim)                                         (fp32)
//   YaRN (original_seq_len > 0): blend freq_i/factor and freq_i with a linear ramp between the
//   corrected dims of beta_fast and beta_slow; no mscale.
//   angle = fp32(position) * freq_i; (cos, sin) = std::cos/std::sin of the fp32 angle (as torch.polar).
//   rotate: the Backend's rope_rotate kernel (kernels/rope_rotate.h): (a + ib)(cos + i sin) with each product
//   rounded to fp32 before the add (no FMA); inverse uses the conjugate; the result rounded to bf16.
// Layers with compress ratio > 0 use compress_rope_theta with YaRN; ratio-0 layers (SWA only, DSpark)
// use rope_theta without YaRN.
#pragma once

#include <cstdint>
#include <vector>

#include "io/model_config.h"
#include "kernels/backend.h"

namespace dsflash {

class Rope {
 public:
  Rope() = default;
  // original_seq_len <= 0: no YaRN.
  Rope(int64_t rope_dim, double base, int64_t original_seq_len, double factor, double beta_fast, double beta_slow);
  // The table of `layer` as model.py's Attention builds it.
  static Rope for_layer(const ModelConfig& config, int layer);

  int64_t rope_dim() const { return rope_dim_; }
  const std::vector<float>& frequencies() const { return frequencies_; }  // [rope_dim/2]

  // cos/sin [rope_dim/2] at an absolute position.
  void angles(int64_t position, float* cos_out, float* sin_out) const;
  // x [rope_dim] fp32 (bf16 values) rotated in place at `position` by the backend's kernel, rounded to bf16.
  void rotate(const Backend& backend, float* x, int64_t position, bool inverse = false) const;
  // `count` vectors x + v*stride (each [rope_dim]) rotated by the same precomputed angles (from angles()).
  void rotate(const Backend& backend, float* x, int64_t count, int64_t stride, const float* cos_in,
              const float* sin_in, bool inverse = false) const;

  // The same on the scalar kernel, for callers without a Backend (transitional: AttentionLayer::forward,
  // attention_decode_batch.cpp; tests).
  void rotate(float* x, int64_t position, bool inverse = false) const;
  void rotate(float* x, const float* cos_in, const float* sin_in, bool inverse = false) const;

 private:
  int64_t rope_dim_ = 0;
  std::vector<float> frequencies_;
};

}  // namespace dsflash
