// An 8 x 8 fp32 transpose in AVX2 registers, shared by the kernels that turn rows into lanes (the mHC mix dots,
// the sparse-attention query groups).
#pragma once

#include <immintrin.h>

namespace dsflash {

// rows[r] = a[r][0..7] -> rows[c] = a[0..7][c].
inline void transpose8(__m256 rows[8]) {
  __m256 t[8], u[8];
  for (int p = 0; p < 4; ++p) {
    t[2 * p] = _mm256_unpacklo_ps(rows[2 * p], rows[2 * p + 1]);
    t[2 * p + 1] = _mm256_unpackhi_ps(rows[2 * p], rows[2 * p + 1]);
  }
  for (int h = 0; h < 2; ++h) {  // rows 4h .. 4h+3
    u[4 * h + 0] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0x44);
    u[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0xEE);
    u[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
    u[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
  }
  for (int s = 0; s < 4; ++s) {
    rows[s] = _mm256_permute2f128_ps(u[s], u[4 + s], 0x20);
    rows[4 + s] = _mm256_permute2f128_ps(u[s], u[4 + s], 0x31);
  }
}

}  // namespace dsflash
