#include "kernels/linear_tables.h"

#include "formats/formats.h"

namespace dsflash {

const LinearDecodeTables& linear_decode_tables() {
  static const LinearDecodeTables tables = [] {
    LinearDecodeTables t{};
    for (int c = 0; c < 256; ++c) {
      t.e4m3_f32[c] = e4m3_to_f32(static_cast<uint8_t>(c));
      t.e4m3_bf16[c] = f32_to_bf16(t.e4m3_f32[c]);
      t.e8m0_f32[c] = e8m0_to_f32(static_cast<uint8_t>(c));
    }
    for (int c = 0; c < 16; ++c) {
      t.e2m1_f32[c] = e2m1_to_f32(static_cast<uint8_t>(c));
      t.e2m1_bf16[c] = f32_to_bf16(t.e2m1_f32[c]);
    }
    return t;
  }();
  return tables;
}

}  // namespace dsflash
