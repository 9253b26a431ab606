// round_to_bf16 on 8 fp32 lanes by integer arithmetic, the same bits as formats.cpp's f32_to_bf16: nearest, ties
// to even, overflow to infinity; NaN keeps its sign and top payload and is made quiet. (vcvtneps2bf16 would flush
// subnormals, so it is not used.) AVX2, the build baseline; shared by the SIMD kernels that round to bf16.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace dsflash {

inline __m256 round_bf16_x8(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  const __m256i lowest_kept = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_and_si256(_mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lowest_kept)), high);
  const __m256i quiet_nan = _mm256_or_si256(_mm256_and_si256(bits, high), _mm256_set1_epi32(0x00400000));
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));  // |bits| < 2^31: the signed compare holds
  return _mm256_castsi256_ps(_mm256_blendv_epi8(rounded, quiet_nan, nan));
}

}  // namespace dsflash
