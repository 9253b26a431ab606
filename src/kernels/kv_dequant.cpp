#include "kernels/kv_dequant.h"

// GCC 12's _mm512_undefined_* helpers (self-initialised on purpose) trip -Wmaybe-uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <bit>
#include <limits>

#include "formats/formats.h"
#include "formats/quant.h"

#define DSFLASH_AVX512 __attribute__((target("avx512f")))

namespace dsflash {
namespace {

void window_row_reference(const uint8_t* codes, const uint8_t* scales, int64_t n, float* out) {
  dequant_e4m3_ue8m0(codes, scales, n, 32, out);
}

void compressed_row_reference(const uint8_t* packed, const uint8_t* scales, int64_t n, float* out) {
  dequant_e2m1_e4m3(packed, scales, n, 16, out);
}

// 16 e4m3 codes -> their exact fp32 values (the bits of formats' e4m3 table): code = s eeee mmm.
DSFLASH_AVX512 inline __m512 e4m3_x16(const uint8_t* codes) {
  const __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
  const __m512i magnitude = _mm512_and_si512(c, _mm512_set1_epi32(0x7f));
  const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(c, _mm512_set1_epi32(0x80)), 24);
  // Normal: (1.mmm) * 2^(e - 7) = fp32 exponent e + 120, mantissa mmm at the top of the fp32 mantissa.
  const __m512i normal = _mm512_add_epi32(_mm512_slli_epi32(magnitude, 20), _mm512_set1_epi32(120 << 23));
  // Subnormal (e = 0): m * 2^-9, exact (m < 8).
  const __m512i subnormal =
      _mm512_castps_si512(_mm512_mul_ps(_mm512_cvtepi32_ps(magnitude), _mm512_set1_ps(1.0f / 512.0f)));
  __m512i bits = _mm512_or_si512(
      _mm512_mask_blend_epi32(_mm512_cmplt_epu32_mask(magnitude, _mm512_set1_epi32(8)), normal, subnormal), sign);
  // 0x7f / 0xff: the table's NaN, unsigned.
  bits = _mm512_mask_blend_epi32(_mm512_cmpeq_epi32_mask(magnitude, _mm512_set1_epi32(0x7f)), bits,
                                 _mm512_set1_epi32(static_cast<int>(
                                     std::bit_cast<uint32_t>(std::numeric_limits<float>::quiet_NaN()))));
  return _mm512_castsi512_ps(bits);
}

DSFLASH_AVX512 void window_row_avx512(const uint8_t* codes, const uint8_t* scales, int64_t n, float* out) {
  for (int64_t i = 0; i < n; i += 32) {
    const __m512 scale = _mm512_set1_ps(e8m0_to_f32(scales[i / 32]));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(e4m3_x16(codes + i), scale));
    _mm512_storeu_ps(out + i + 16, _mm512_mul_ps(e4m3_x16(codes + i + 16), scale));
  }
}

DSFLASH_AVX512 void compressed_row_avx512(const uint8_t* packed, const uint8_t* scales, int64_t n, float* out) {
  const __m512 table = _mm512_loadu_ps(e2m1_value_table());
  const float* e4m3 = e4m3_value_table();
  const __m128i low_nibble = _mm_set1_epi8(0x0f);
  for (int64_t i = 0; i < n; i += 16) {
    // 8 bytes = 16 codes, low nibble first: interleave the low and high nibbles into 16 indices.
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(packed + i / 2));
    const __m128i low = _mm_and_si128(bytes, low_nibble);
    const __m128i high = _mm_and_si128(_mm_srli_epi16(bytes, 4), low_nibble);
    const __m512i index = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(low, high));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_permutexvar_ps(index, table), _mm512_set1_ps(e4m3[scales[i / 16]])));
  }
}

}  // namespace

const KvDequantKernels& reference_kv_dequant() {
  static const KvDequantKernels kernels{"reference", window_row_reference, compressed_row_reference};
  return kernels;
}

const KvDequantKernels* avx512_kv_dequant() {
  static const KvDequantKernels kernels{"avx512", window_row_avx512, compressed_row_avx512};
  return __builtin_cpu_supports("avx512f") ? &kernels : nullptr;
}

}  // namespace dsflash
