// The KV row dequantisation kernels (kernels/kv_dequant.h) against their scalar oracles, memcmp of the outputs:
// every e4m3 code (zeros, subnormals, normals, both NaN codes) under ue8m0 scales from 2^-127 (an fp32 subnormal,
// so products underflow and round) through 2^127 (products overflow to inf) and the NaN scale; every e2m1 code
// under every e4m3 scale code. Through each kernel table and each Backend's entries.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "formats/quant.h"
#include "kernels/backend.h"
#include "kernels/kv_dequant.h"
#include "test_backend_util.h"

namespace dsflash {
namespace {

std::vector<const KvDequantKernels*> every_table() {
  std::vector<const KvDequantKernels*> tables{&reference_kv_dequant()};
  if (const KvDequantKernels* avx512 = avx512_kv_dequant()) tables.push_back(avx512);
  return tables;
}

using test::expect_same_bits;

// Rows of 512: each row holds all 256 codes twice (in a shuffled order), one ue8m0 scale per 32.
TEST(KvDequant, WindowRowsGiveTheOracleBits) {
  constexpr int64_t kDim = 512;
  std::mt19937 rng(3);
  const uint8_t scale_codes[] = {0, 1, 20, 100, 127, 128, 200, 254, 255};
  for (uint8_t scale : scale_codes) {
    std::vector<uint8_t> codes(kDim), scales(kDim / 32);
    for (int64_t i = 0; i < kDim; ++i) codes[static_cast<size_t>(i)] = static_cast<uint8_t>(i % 256);
    std::shuffle(codes.begin(), codes.end(), rng);
    for (size_t b = 0; b < scales.size(); ++b) scales[b] = b % 2 == 0 ? scale : static_cast<uint8_t>(rng() % 256);
    std::vector<float> want(kDim);
    dequant_e4m3_ue8m0(codes.data(), scales.data(), kDim, 32, want.data());
    for (const KvDequantKernels* t : every_table()) {
      std::vector<float> got(kDim);
      t->window_row(codes.data(), scales.data(), kDim, got.data());
      expect_same_bits(got, want, std::string(t->name) + " scale " + std::to_string(scale));
    }
    for (const Backend* b : test::every_backend()) {
      std::vector<float> got(kDim);
      b->dequant_window_row(codes.data(), scales.data(), kDim, got.data());
      expect_same_bits(got, want, std::string(b->name) + " backend, scale " + std::to_string(scale));
    }
  }
}

// Rows of 4096 = 256 blocks of 16: block s has scale code s and holds each e2m1 code once (shuffled).
TEST(KvDequant, CompressedRowsGiveTheOracleBits) {
  constexpr int64_t kDim = 256 * 16;
  std::mt19937 rng(5);
  std::vector<uint8_t> nibbles(kDim);
  for (int64_t i = 0; i < kDim; ++i) nibbles[static_cast<size_t>(i)] = static_cast<uint8_t>(i % 16);
  for (int64_t b = 0; b < kDim / 16; ++b) std::shuffle(nibbles.begin() + b * 16, nibbles.begin() + b * 16 + 16, rng);
  std::vector<uint8_t> packed(kDim / 2), scales(kDim / 16);
  for (int64_t i = 0; i < kDim / 2; ++i) {
    packed[static_cast<size_t>(i)] = static_cast<uint8_t>(nibbles[static_cast<size_t>(2 * i)] | nibbles[static_cast<size_t>(2 * i + 1)] << 4);
  }
  for (size_t s = 0; s < scales.size(); ++s) scales[s] = static_cast<uint8_t>(s);
  // Short rows too (one block of 16, 32 = the smallest head_dim the layouts take).
  for (int64_t n : {int64_t{16}, int64_t{32}, kDim}) {
    std::vector<float> want(static_cast<size_t>(n));
    dequant_e2m1_e4m3(packed.data(), scales.data(), n, 16, want.data());
    for (const KvDequantKernels* t : every_table()) {
      std::vector<float> got(static_cast<size_t>(n));
      t->compressed_row(packed.data(), scales.data(), n, got.data());
      expect_same_bits(got, want, std::string(t->name) + " n " + std::to_string(n));
    }
    for (const Backend* b : test::every_backend()) {
      std::vector<float> got(static_cast<size_t>(n));
      b->dequant_compressed_row(packed.data(), scales.data(), n, got.data());
      expect_same_bits(got, want, std::string(b->name) + " backend, n " + std::to_string(n));
    }
  }
}

}  // namespace
}  // namespace dsflash
