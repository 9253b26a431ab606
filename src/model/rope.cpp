#include "model/rope.h"

#include <algorithm>
#include <cmath>
#include <vector>


namespace dsflash {

Rope::Rope(int64_t rope_dim, double base, int64_t original_seq_len, double factor, double beta_fast,
           double beta_slow)
    : rope_dim_(rope_dim), frequencies_(static_cast<size_t>(rope_dim / 2)) {
  const int64_t half = rope_dim / 2;
  const float dim_f = static_cast<float>(rope_dim);
  for (int64_t i = 0; i < half; ++i) {
    // torch: 1.0 / (base ** (arange(0, dim, 2, fp32) / dim)); pow evaluated in fp32 (here: double, rounded).
    const float exponent = static_cast<float>(2 * i) / dim_f;
    const float power = static_cast<float>(std::pow(static_cast<double>(static_cast<float>(base)),
                                                    static_cast<double>(exponent)));
    frequencies_[static_cast<size_t>(i)] = 1.0f / power;
  }
  if (original_seq_len > 0) {
    // The corrected dims are Python doubles; the ramp is fp32 tensor arithmetic.
    auto corrected_dim = [&](double rotations) {
      return static_cast<double>(rope_dim) * std::log(static_cast<double>(original_seq_len) / (rotations * 2 * M_PI)) /
             (2 * std::log(base));
    };
    const double low = std::max(std::floor(corrected_dim(beta_fast)), 0.0);
    const double high = std::min(std::ceil(corrected_dim(beta_slow)), static_cast<double>(rope_dim - 1));
    const float span = static_cast<float>(std::max(high - low, 1e-3));
    const float low_f = static_cast<float>(low);
    const float factor_f = static_cast<float>(factor);
    for (int64_t i = 0; i < half; ++i) {
      float ramp = (static_cast<float>(i) - low_f) / span;
      ramp = std::clamp(ramp, 0.0f, 1.0f);
      const float smooth = 1.0f - ramp;
      const float f = frequencies_[static_cast<size_t>(i)];
      const float scaled = f / factor_f;
      const float one_minus_smooth = 1.0f - smooth;
      const float a = scaled * one_minus_smooth;
      const float b = f * smooth;
      frequencies_[static_cast<size_t>(i)] = a + b;
    }
  }
}

Rope Rope::for_layer(const ModelConfig& config, int layer) {
  const int ratio = layer >= 0 && static_cast<size_t>(layer) < config.compress_ratios.size()
                        ? config.compress_ratios[static_cast<size_t>(layer)]
                        : 0;
  if (ratio > 0) {
    return Rope(config.rope_head_dim, config.compress_rope_theta, config.original_seq_len, config.rope_factor,
                config.beta_fast, config.beta_slow);
  }
  return Rope(config.rope_head_dim, config.rope_theta, 0, config.rope_factor, config.beta_fast, config.beta_slow);
}

void Rope::angles(int64_t position, float* cos_out, float* sin_out) const {
  const float t = static_cast<float>(position);  // torch.outer promotes the int64 arange to fp32
  for (size_t i = 0; i < frequencies_.size(); ++i) {
    const float angle = t * frequencies_[i];
    cos_out[i] = std::cos(angle);
    sin_out[i] = std::sin(angle);
  }
}

void Rope::rotate(const Backend& backend, float* x, int64_t count, int64_t stride, const float* cos_in,
                  const float* sin_in, bool inverse) const {
  backend.rope_rotate(x, count, stride, cos_in, sin_in, static_cast<int64_t>(frequencies_.size()), inverse);
}

void Rope::rotate(const Backend& backend, float* x, int64_t position, bool inverse) const {
  constexpr size_t kStackPairs = 256;  // every released shape (rope_dim 64); larger tables use the heap
  const size_t pairs = frequencies_.size();
  if (pairs > kStackPairs) {
    std::vector<float> c(pairs), s(pairs);
    angles(position, c.data(), s.data());
    rotate(backend, x, 1, 0, c.data(), s.data(), inverse);
    return;
  }
  float c[kStackPairs], s[kStackPairs];
  angles(position, c, s);
  rotate(backend, x, 1, 0, c, s, inverse);
}

void Rope::rotate(float* x, const float* cos_in, const float* sin_in, bool inverse) const {
  rotate(reference_backend(), x, 1, 0, cos_in, sin_in, inverse);
}

void Rope::rotate(float* x, int64_t position, bool inverse) const {
  rotate(reference_backend(), x, position, inverse);
}

}  // namespace dsflash
