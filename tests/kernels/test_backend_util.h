// Shared by the Backend tests: every table this CPU runs, and bitwise comparison of fp32 buffers.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.h"

namespace dsflash::test {

inline std::vector<const Backend*> every_backend() { return available_backends(); }

// Bit-for-bit equality (NaNs and signed zeros included); reports the first few differences.
inline void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && ++bad <= 5) {
      ADD_FAILURE() << what << " at " << i << ": " << got[i] << " vs " << want[i];
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

}  // namespace dsflash::test
