// Shared by the Backend tests: every table this CPU runs, and bitwise comparison of fp32 buffers.
#pragma once

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.h"

namespace dsflash::test {

inline std::vector<const Backend*> every_backend() { return available_backends(); }

inline bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

// kAnyNan: a NaN in both buffers is equal whatever its sign and payload, for references that leave those to the
// compiler (which operand of a commutative add comes first).
enum class NanBits { kExact, kAnyNan };

// Bit-for-bit equality (signed zeros included, NaNs per nan_bits); reports the first few differences.
inline void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want, const std::string& what,
                             NanBits nan_bits = NanBits::kExact) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (nan_bits == NanBits::kAnyNan && std::isnan(got[i]) && std::isnan(want[i])) continue;
    if (!same_bits(got[i], want[i]) && ++bad <= 5) {
      ADD_FAILURE() << what << " at " << i << ": " << got[i] << " vs " << want[i];
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

}  // namespace dsflash::test
