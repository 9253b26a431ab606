#include "kernels/torch_exp.h"

#include <cmath>

namespace dsflash {

float sleef_expf_u10(float x) {
  // SLEEF's final selections, taken first here so that no infinity reaches the integer conversion.
  if (std::isnan(x)) return x;
  if (x < -104.0f) return 0.0f;
  if (x > 100.0f) return INFINITY;
  // q = round(x / ln 2); s = x - q ln 2 in two FMA steps (ln 2 split into a short high part and a low part).
  const float q_f = std::nearbyint(x * 1.442695040888963407359924681001892137f);
  const int q = static_cast<int>(q_f);
  float s = std::fma(q_f, -0.693145751953125f, x);
  s = std::fma(q_f, -1.428606765330187045e-06f, s);
  float u = 0.000198527617612853646278381f;
  u = std::fma(u, s, 0.00139304355252534151077271f);
  u = std::fma(u, s, 0.00833336077630519866943359f);
  u = std::fma(u, s, 0.0416664853692054748535156f);
  u = std::fma(u, s, 0.166666671633720397949219f);
  u = std::fma(u, s, 0.5f);
  u = 1.0f + std::fma(s * s, u, s);
  const int q_half = q >> 1;  // 2^q applied as 2^(q/2) * 2^(q - q/2): q may leave the normal range a little
  u = u * std::ldexp(1.0f, q_half) * std::ldexp(1.0f, q - q_half);
  return u;
}

float torch_exp_element(float x, int64_t index, int64_t count) {
  return torch_exp_vector_path(index, count) ? sleef_expf_u10(x) : std::exp(x);
}

}  // namespace dsflash
