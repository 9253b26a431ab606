// Test helper: reads the golden outputs (DSFLASH_SHARED_DIR/goldens/<model>/outputs/<scenario>.safetensors)
// and converts tensors to fp32 / int vectors. Header-only, used by tests/kernels, tests/model and tests/apps.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "formats/formats.h"
#include "io/safetensors.h"

namespace dsflash::testing {

inline std::string shared_dir() { return DSFLASH_SHARED_DIR; }
inline std::string goldens_dir() { return shared_dir() + "/goldens"; }
inline std::string golden_checkpoint_dir(const std::string& model) {
  return goldens_dir() + "/" + model + "/checkpoint";
}
inline std::string golden_output_path(const std::string& model, const std::string& scenario) {
  return goldens_dir() + "/" + model + "/outputs/" + scenario + ".safetensors";
}
inline bool goldens_present() { return std::filesystem::exists(goldens_dir() + "/tiny-a/manifest.json"); }

// fp32 copy of a BF16 / F32 tensor; empty when missing or of another dtype.
inline std::vector<float> to_f32(const TensorView* t) {
  std::vector<float> out;
  if (t == nullptr) return out;
  const int64_t n = t->num_elements();
  out.resize(static_cast<size_t>(n));
  if (t->dtype == DType::kBF16) {
    const uint16_t* src = t->as<uint16_t>();
    for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = bf16_to_f32(src[i]);
  } else if (t->dtype == DType::kF32) {
    std::memcpy(out.data(), t->data, static_cast<size_t>(n) * 4);
  } else {
    out.clear();
  }
  return out;
}

// int64 copy of an I32 / I64 / U8 tensor.
inline std::vector<int64_t> to_i64(const TensorView* t) {
  std::vector<int64_t> out;
  if (t == nullptr) return out;
  const int64_t n = t->num_elements();
  out.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    if (t->dtype == DType::kI32) {
      out[static_cast<size_t>(i)] = t->as<int32_t>()[i];
    } else if (t->dtype == DType::kI64) {
      out[static_cast<size_t>(i)] = t->as<int64_t>()[i];
    } else if (t->dtype == DType::kU8) {
      out[static_cast<size_t>(i)] = t->data[i];
    }
  }
  return out;
}

// An I32 / I64 tensor of `file` as int64; a missing tensor or another dtype fails the test, naming the tensor.
inline std::vector<int64_t> read_i64(const SafetensorsFile& file, const std::string& name) {
  const TensorView* t = file.find(name);
  EXPECT_NE(t, nullptr) << name << " missing in " << file.path();
  if (t == nullptr) return {};
  EXPECT_TRUE(t->dtype == DType::kI64 || t->dtype == DType::kI32) << name << ": dtype " << dtype_name(t->dtype);
  if (t->dtype != DType::kI64 && t->dtype != DType::kI32) return {};
  return to_i64(t);
}

// Counts elements whose bits differ (fp32 compare; -0.0 == +0.0 counts as equal, NaN == NaN).
inline int64_t count_mismatches(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return static_cast<int64_t>(std::max(a.size(), b.size()));
  int64_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!(a[i] == b[i]) && !(a[i] != a[i] && b[i] != b[i])) ++bad;
  }
  return bad;
}

inline float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0.0f;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const float d = a[i] > b[i] ? a[i] - b[i] : b[i] - a[i];
    if (d > m) m = d;
  }
  return m;
}

}  // namespace dsflash::testing
