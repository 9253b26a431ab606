// Scalar oracle of the linear kernels (spec/MODEL.md §4.9 and "Numerics that decide bit-exactness").
//
// What the official CPU port of kernel.py computes (read for these numerics; nothing copied):
//   fp8_gemm: for each 32-wide K block b, in K order:
//       partial = A[:, b] @ W[:, b]^T                (fp32 matmul of the decoded e4m3 values)
//       out    += (partial * sa[:, b]) * sw[o/32, b]  (activation scale first, then weight scale)
//     out starts at 0.0f and is fp32; it is cast to the default dtype (bf16) by the caller.
//   fp4_gemm: the same with e2m1 weights (low nibble = even k) and one ue8m0 scale per (row o, 32 K).
//   So the scale order is (partial * sa) * sw, and we keep exactly that. (Both scales are powers of two, so
//   the two products are exact and the order matters only where partial*sa would leave the normal range.
//   For the same reason a compiler contracting `acc + scaled` into an FMA changes nothing unless the scaled
//   partial is subnormal, which real scales (activation >= 2^-22, partial >= 2^-18) never produce.)
//
// In-block order: every product a*w of an e4m3 activation with an e4m3 (or e2m1) weight is exact in fp32
// (4x4 or 4x2 significant bits); the 32-term sum is exact too whenever the block's products span less than
// 24 bits of magnitude, so for real data the order inside a block rarely matters. Where it does, torch's
// CPU matmul order is a BLAS implementation detail; we define it as sequential k = 0..31 starting from 0.0f
// (fma or mul+add are identical here because the products are exact). Fast kernels may sum a block in any
// order; tests bound that difference.
//
// BF16 linears: model.py's F.linear in bf16 accumulates in fp32 and rounds once; the "fp32" linears run
// x.float() @ w.float(). We define the sum as sequential k order in fp32 with fused multiply-adds
// (acc = fma(x[k], w[o][k], acc), as BLAS sgemm micro-kernels do), written with std::fma so that the
// compiler's contraction setting cannot change it.
#include "kernels/linear.h"

#include <cmath>
#include <vector>

#include "formats/formats.h"
#include "kernels/linear_tables.h"

namespace dsflash {

namespace {

// y [rows, out] = x [rows, k] e4m3 (scales [rows, k/32]) · W [out, k] e4m3 (scales [ceil(out/32), k/32])ᵀ
void fp8_gemm_reference(const Fp8Activations& x, const Fp8Weight& w, float* y, ThreadPool* /*pool*/) {
  const LinearDecodeTables& t = linear_decode_tables();
  const int64_t k = w.in, kblocks = k / 32;
  std::vector<float> a(static_cast<size_t>(k));
  for (int64_t r = 0; r < x.rows; ++r) {
    const uint8_t* acodes = x.codes + r * k;
    const uint8_t* ascales = x.scales + r * kblocks;
    for (int64_t i = 0; i < k; ++i) a[i] = t.e4m3_f32[acodes[i]];
    for (int64_t o = 0; o < w.out; ++o) {
      const uint8_t* wscales = w.scales + (o / 32) * kblocks;
      float acc = 0.0f;
      for (int64_t b = 0; b < kblocks; ++b) {
        uint8_t gathered[32];
        const uint8_t* wcodes = fp8_block_codes(w, o, b, gathered);
        float partial = 0.0f;
        for (int j = 0; j < 32; ++j) partial += a[b * 32 + j] * t.e4m3_f32[wcodes[j]];
        acc += (partial * t.e8m0_f32[ascales[b]]) * t.e8m0_f32[wscales[b]];
      }
      y[r * w.out + o] = acc;
    }
  }
}

// y [rows, out] = x [rows, k] e4m3 · W [out, k] e2m1 (packed [out, k/2], scales [out, k/32] ue8m0)ᵀ
void fp4_gemm_reference(const Fp8Activations& x, const Fp4Weight& w, float* y, ThreadPool* /*pool*/) {
  const LinearDecodeTables& t = linear_decode_tables();
  const int64_t k = w.in, kblocks = k / 32;
  std::vector<float> a(static_cast<size_t>(k));
  for (int64_t r = 0; r < x.rows; ++r) {
    const uint8_t* acodes = x.codes + r * k;
    const uint8_t* ascales = x.scales + r * kblocks;
    for (int64_t i = 0; i < k; ++i) a[i] = t.e4m3_f32[acodes[i]];
    for (int64_t o = 0; o < w.out; ++o) {
      float acc = 0.0f;
      for (int64_t b = 0; b < kblocks; ++b) {
        uint8_t gathered[16];
        const uint8_t* packed = fp4_block_packed(w, o, b, gathered);
        float partial = 0.0f;
        for (int j = 0; j < 32; j += 2) {
          uint8_t byte = packed[j / 2];
          partial += a[b * 32 + j] * t.e2m1_f32[byte & 15];
          partial += a[b * 32 + j + 1] * t.e2m1_f32[byte >> 4];
        }
        acc += (partial * t.e8m0_f32[ascales[b]]) * t.e8m0_f32[w.scales[fp4_scale_index(o, b, kblocks, w.tile_major)]];
      }
      y[r * w.out + o] = acc;
    }
  }
}

// y [rows, out] = x [rows, k] fp32 · W [out, k] bf16ᵀ, Σ in k order in fp32.
void bf16_gemm_reference(const float* x, int64_t rows, const Bf16Weight& w, float* y, ThreadPool* /*pool*/) {
  const int64_t k = w.in;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * k;
    for (int64_t o = 0; o < w.out; ++o) {
      const uint16_t* wr = w.data + o * k;
      float acc = 0.0f;
      for (int64_t i = 0; i < k; ++i) acc = std::fma(xr[i], bf16_to_f32(wr[i]), acc);
      y[r * w.out + o] = acc;
    }
  }
}

// y [rows, out] = x [rows, k] fp32 · bf16(e4m3 W · sw)ᵀ: the BF16 reference above on the dequantised values
// (exact in bf16, so the bits a dequantised copy would hold), Σ in k order in fp32.
void fp8_as_bf16_gemm_reference(const float* x, int64_t rows, const Fp8Weight& w, float* y, ThreadPool* /*pool*/) {
  const LinearDecodeTables& t = linear_decode_tables();
  const int64_t k = w.in, kblocks = k / 32;
  std::vector<float> values(static_cast<size_t>(k));
  for (int64_t o = 0; o < w.out; ++o) {
    for (int64_t b = 0; b < kblocks; ++b) {
      uint8_t gathered[32];
      const uint8_t* codes = fp8_block_codes(w, o, b, gathered);
      const float scale = t.e8m0_f32[w.scales[(o / 32) * kblocks + b]];
      for (int j = 0; j < 32; ++j) values[b * 32 + j] = bf16_to_f32(f32_to_bf16(t.e4m3_f32[codes[j]] * scale));
    }
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * k;
      float acc = 0.0f;
      for (int64_t i = 0; i < k; ++i) acc = std::fma(xr[i], values[i], acc);
      y[r * w.out + o] = acc;
    }
  }
}

}  // namespace

const LinearKernels& reference_linear_kernels() {
  static const LinearKernels kernels{"reference", {}, fp8_gemm_reference, fp4_gemm_reference, bf16_gemm_reference,
                                     fp8_as_bf16_gemm_reference};
  return kernels;
}

}  // namespace dsflash
