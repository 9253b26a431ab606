// Decode tables shared by every linear kernel: the stored weight/activation codes as fp32 and as bf16 bits.
// Built once (function-local static) from the codecs of src/formats/formats.h, so the kernels and the
// formats tests agree by construction. e4m3 and e2m1 values are exactly representable in bf16 (at most
// 4 significant bits, exponents 2^-9..2^8), so the bf16 tables lose nothing.
#pragma once

#include <cstdint>

namespace dsflash {

struct LinearDecodeTables {
  float e4m3_f32[256];      // e4m3 "fn" code -> value (0x7f/0xff -> NaN)
  float e2m1_f32[16];       // e2m1 code -> value (bit 3 = sign)
  uint16_t e4m3_bf16[256];  // same values as bf16 bits (exact)
  uint16_t e2m1_bf16[16];
  float e8m0_f32[256];      // ue8m0 code -> 2^(code-127) (0xff -> NaN)
};

const LinearDecodeTables& linear_decode_tables();

// The ue8m0 code of 1.0 (2^0): the unit activation scale of an FP8 weight's bf16 linear.
constexpr uint8_t kE8m0One = 127;

}  // namespace dsflash
