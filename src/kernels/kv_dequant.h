// Dequantisation of the KV rows that sparse attention reads (spec/MODEL.md §4.3, kv/state_storage.h), from their
// cache bytes to fp32. The scalar oracles are formats/quant.h's: every value is the table value of its code times
// its block's scale, one fp32 multiply, so a vector version gives the same bits.
#pragma once

#include <cstdint>

namespace dsflash {

// A window row: codes [n] e4m3, scales [n / 32] ue8m0 -> out [n] (dequant_e4m3_ue8m0, block 32); n % 32 == 0.
using WindowRowDequant = void (*)(const uint8_t* codes, const uint8_t* scales, int64_t n, float* out);
// A compressed row: packed [n / 2] e2m1 (low nibble first), scales [n / 16] e4m3 -> out [n] (dequant_e2m1_e4m3,
// block 16); n % 16 == 0.
using CompressedRowDequant = void (*)(const uint8_t* packed, const uint8_t* scales, int64_t n, float* out);

struct KvDequantKernels {
  const char* name;
  WindowRowDequant window_row;
  CompressedRowDequant compressed_row;
};

// The scalar oracles (formats/quant.h).
const KvDequantKernels& reference_kv_dequant();
// 16 values per zmm: e4m3 decoded with integer operations (normal: exponent rebias; subnormal: an exact
// int-to-float conversion times 2^-9; NaN codes: the oracle's quiet NaN), e2m1 by a 16-entry vpermps table.
// nullptr when the CPU lacks AVX-512 F.
const KvDequantKernels* avx512_kv_dequant();

}  // namespace dsflash
