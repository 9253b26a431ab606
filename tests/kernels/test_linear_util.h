// Random operands for the linear kernel tests: stored-format weights and quantised activations with the
// layouts of src/kernels/linear.h, plus a double-precision oracle of the same block formula.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "formats/formats.h"
#include "kernels/linear.h"
#include "kernels/linear_impl.h"

namespace dsflash::test {

// One matmul of the shape tests: [rows, in] activations times an [out, in] weight.
struct LinearShape {
  int rows, out, in;
};

// A random finite e4m3 code (never the NaN codes 0x7f / 0xff).
inline uint8_t random_e4m3(std::mt19937& rng) {
  for (;;) {
    uint8_t c = static_cast<uint8_t>(rng() & 0xff);
    if ((c & 0x7f) != 0x7f) return c;
  }
}

// Owns the bytes behind an Fp8Activations view. rows x k codes and rows x k/32 scales.
struct Fp8ActData {
  std::vector<uint8_t> codes, scales;
  int64_t rows = 0, k = 0;
  Fp8Activations view() const { return {codes.data(), scales.data(), rows, k}; }
};

struct Fp8WeightData {
  std::vector<uint8_t> codes, scales;
  int64_t out = 0, in = 0;
  Fp8Weight view() const { return {codes.data(), scales.data(), out, in}; }
};

struct Fp4WeightData {
  std::vector<uint8_t> packed, scales;
  int64_t out = 0, in = 0;
  Fp4Weight view() const { return {packed.data(), scales.data(), out, in}; }
};

struct Bf16WeightData {
  std::vector<uint16_t> data;
  int64_t out = 0, in = 0;
  Bf16Weight view() const { return {data.data(), out, in}; }
};

// Scales are drawn from [scale_lo, scale_hi] as e8m0 codes (127 = 1.0).
inline Fp8ActData random_fp8_acts(std::mt19937& rng, int64_t rows, int64_t k, int scale_lo = 110, int scale_hi = 135) {
  Fp8ActData d;
  d.rows = rows;
  d.k = k;
  d.codes.resize(static_cast<size_t>(rows * k));
  d.scales.resize(static_cast<size_t>(rows * (k / 32)));
  for (auto& c : d.codes) c = random_e4m3(rng);
  std::uniform_int_distribution<int> s(scale_lo, scale_hi);
  for (auto& c : d.scales) c = static_cast<uint8_t>(s(rng));
  return d;
}

inline Fp8WeightData random_fp8_weight(std::mt19937& rng, int64_t out, int64_t in, int scale_lo = 110,
                                       int scale_hi = 130) {
  Fp8WeightData d;
  d.out = out;
  d.in = in;
  d.codes.resize(static_cast<size_t>(out * in));
  d.scales.resize(static_cast<size_t>(((out + 31) / 32) * ((in + 31) / 32)));
  for (auto& c : d.codes) c = random_e4m3(rng);
  std::uniform_int_distribution<int> s(scale_lo, scale_hi);
  for (auto& c : d.scales) c = static_cast<uint8_t>(s(rng));
  return d;
}

inline Fp4WeightData random_fp4_weight(std::mt19937& rng, int64_t out, int64_t in, int scale_lo = 110,
                                       int scale_hi = 130) {
  Fp4WeightData d;
  d.out = out;
  d.in = in;
  d.packed.resize(static_cast<size_t>(out * in / 2));
  d.scales.resize(static_cast<size_t>(out * (in / 32)));
  for (auto& c : d.packed) c = static_cast<uint8_t>(rng() & 0xff);
  std::uniform_int_distribution<int> s(scale_lo, scale_hi);
  for (auto& c : d.scales) c = static_cast<uint8_t>(s(rng));
  return d;
}

inline Bf16WeightData random_bf16_weight(std::mt19937& rng, int64_t out, int64_t in) {
  Bf16WeightData d;
  d.out = out;
  d.in = in;
  d.data.resize(static_cast<size_t>(out * in));
  std::normal_distribution<float> n(0.0f, 0.05f);
  for (auto& v : d.data) v = f32_to_bf16(n(rng));
  return d;
}

// An FP8 weight (row-major) as the bf16 copy convert.py makes of wo_a: bf16(e4m3 · ue8m0 block scale), exact.
inline Bf16WeightData dequantised_bf16(const Fp8WeightData& w) {
  Bf16WeightData d;
  d.out = w.out;
  d.in = w.in;
  d.data.resize(static_cast<size_t>(w.out * w.in));
  const int64_t scale_cols = (w.in + 31) / 32;
  for (int64_t o = 0; o < w.out; ++o)
    for (int64_t k = 0; k < w.in; ++k) {
      const float scale = e8m0_to_f32(w.scales[static_cast<size_t>((o / 32) * scale_cols + k / 32)]);
      d.data[static_cast<size_t>(o * w.in + k)] = f32_to_bf16(e4m3_to_f32(w.codes[static_cast<size_t>(o * w.in + k)]) * scale);
    }
  return d;
}

inline std::vector<float> random_floats(std::mt19937& rng, int64_t n, bool bf16_values) {
  std::vector<float> v(static_cast<size_t>(n));
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (auto& x : v) x = bf16_values ? round_to_bf16(dist(rng)) : dist(rng);
  return v;
}

// Double-precision value and the sum of |terms| of one output element (the error bound's scale).
struct Exact {
  double value = 0, abs_sum = 0;
};

inline Exact exact_fp8(const Fp8Activations& x, const Fp8Weight& w, int64_t r, int64_t o) {
  Exact e;
  const int64_t kb = w.in / 32;
  for (int64_t b = 0; b < kb; ++b) {
    double s = static_cast<double>(e8m0_to_f32(x.scales[r * kb + b])) * e8m0_to_f32(w.scales[(o / 32) * kb + b]);
    for (int j = 0; j < 32; ++j) {
      double t = static_cast<double>(e4m3_to_f32(x.codes[r * w.in + b * 32 + j])) *
                 e4m3_to_f32(w.codes[o * w.in + b * 32 + j]) * s;
      e.value += t;
      e.abs_sum += std::fabs(t);
    }
  }
  return e;
}

inline Exact exact_fp4(const Fp8Activations& x, const Fp4Weight& w, int64_t r, int64_t o) {
  Exact e;
  const int64_t kb = w.in / 32;
  for (int64_t b = 0; b < kb; ++b) {
    double s = static_cast<double>(e8m0_to_f32(x.scales[r * kb + b])) * e8m0_to_f32(w.scales[o * kb + b]);
    for (int j = 0; j < 32; ++j) {
      int64_t kk = b * 32 + j;
      uint8_t byte = w.packed[o * (w.in / 2) + kk / 2];
      uint8_t code = (kk % 2 == 0) ? (byte & 15) : (byte >> 4);
      double t = static_cast<double>(e4m3_to_f32(x.codes[r * w.in + kk])) * e2m1_to_f32(code) * s;
      e.value += t;
      e.abs_sum += std::fabs(t);
    }
  }
  return e;
}

inline Exact exact_bf16(const float* x, const Bf16Weight& w, int64_t r, int64_t o) {
  Exact e;
  for (int64_t i = 0; i < w.in; ++i) {
    double t = static_cast<double>(x[r * w.in + i]) * bf16_to_f32(w.data[o * w.in + i]);
    e.value += t;
    e.abs_sum += std::fabs(t);
  }
  return e;
}

// Every linear kernel table this CPU runs but the scalar reference.
inline std::vector<const LinearKernels*> fast_kernels() {
  std::vector<const LinearKernels*> all = linear_impl::available_kernels();
  all.pop_back();  // the reference itself
  return all;
}

// An FP8 and an MXFP4 weight in the checkpoint's order, or as the load-time tile-major copy (tiled).
struct OrderedWeights {
  Fp8WeightData w8;
  Fp4WeightData w4;
  bool tiled = false;
  Fp8Weight fp8() const {
    Fp8Weight v = w8.view();
    v.tile_major = tiled;
    return v;
  }
  Fp4Weight fp4() const {
    Fp4Weight v = w4.view();
    v.tile_major = tiled;
    return v;
  }
};
inline OrderedWeights in_order(const Fp8WeightData& w8, const Fp4WeightData& w4, bool tiled) {
  OrderedWeights o{w8, w4, tiled};
  if (tiled) {
    repack_fp8_tile_major(w8.codes.data(), w8.out, w8.in, o.w8.codes.data());
    repack_fp4_tile_major(w4.packed.data(), w4.out, w4.in, o.w4.packed.data());
    repack_fp4_scales_tile_major(w4.scales.data(), w4.out, w4.in, o.w4.scales.data());
  }
  return o;
}

// Bound of an fp32 sum of n terms in any order: n * 2^-24 * Σ|terms| (first-order; n*u << 1 here).
inline double fp32_sum_bound(int64_t n, double abs_sum) { return static_cast<double>(n + 2) * 0x1p-24 * abs_sum; }

}  // namespace dsflash::test
