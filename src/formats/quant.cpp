// Block quantisers with the official rounding (spec/MODEL.md §4.9; reference: the official kernel.py numerics
// act_quant / fp4_act_quant and their use in model.py).
//
// Rules, per block of `block` consecutive elements:
//   amax  = max |x| (NaN anywhere in the block makes amax NaN), floored at a per-format minimum.
//   ue8m0 scale: ratio = amax * fl(1/max_code) in fp32, scale = 2^(ceil(log2 ratio)) by the bit trick
//                "biased exponent + (mantissa != 0)". (For every normal fp32 amax this gives the same code as
//                amax / max_code; checked exhaustively in tests/formats.)
//   e4m3 scale:  scale = e4m3_rne(amax / 6) (true fp32 division, then the e4m3 codec, which saturates at 448).
//   code  = format_rne(clamp(x / scale, ±max_code)).
// A non-finite amax (NaN or infinity in the block) gives a NaN scale (ue8m0 0xff, e4m3 0x7f) and the block
// dequantises to NaN; the official CPU port rejects such blocks with an assertion.
#include "formats/quant.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "formats/encode_inline.h"
#include "formats/formats.h"

namespace dsflash {

namespace {

constexpr float kE4m3Max = 448.0f;
constexpr float kE2m1Max = 6.0f;
constexpr float kActAmaxFloor = 1e-4f;                  // act_quant: amax.clamp_min(1e-4)
constexpr float kFp4Ue8m0AmaxFloor = 6.0f * 0x1p-126f;  // fp4_act_quant ue8m0: clamp_min(6 * 2^-126)
constexpr float kFp4E4m3AmaxFloor = 6.0f * 0x1p-9f;     // fp4_act_quant e4m3: clamp_min(6 * 2^-9)

// max |x| over a block. Integer max over the magnitude bits: the order of non-negative fp32 bit patterns is
// the order of their values, and NaN patterns sort above infinity, so NaN propagates (as torch's amax does).
float block_amax(const float* x, int64_t n) {
  uint32_t max_bits = 0;
  for (int64_t i = 0; i < n; ++i) {
    max_bits = std::max(max_bits, std::bit_cast<uint32_t>(x[i]) & 0x7fffffffu);
  }
  return std::bit_cast<float>(max_bits);
}

// clamp_min that keeps NaN (torch.clamp_min semantics).
float floor_at(float value, float minimum) { return value < minimum ? minimum : value; }

// ceil(log2(ratio)) as a ue8m0 code, the official bit trick: biased exponent + (mantissa != 0).
// Subnormal ratios give code 1 (2^-126); non-finite ratios (and anything that would need 2^128) give 0xff.
uint8_t ue8m0_ceil_code(float ratio) {
  const uint32_t bits = std::bit_cast<uint32_t>(ratio) & 0x7fffffffu;
  const uint32_t code = (bits >> 23) + ((bits & 0x7fffffu) != 0 ? 1u : 0u);
  return code >= 255u ? uint8_t{0xff} : static_cast<uint8_t>(code);
}

// 1 / 2^(code - 127), exact for every finite code (2^-127 .. 2^127 are all representable), NaN for 0xff.
// Multiplying by it equals dividing by the scale bit for bit: both are the correctly rounded x * 2^-k.
float ue8m0_inverse(uint8_t code) {
  if (code == 0xff) return std::numeric_limits<float>::quiet_NaN();
  return e8m0_to_f32(static_cast<uint8_t>(254 - code));
}

// The ue8m0 scale code of one block for a format whose largest magnitude is `max_code`.
uint8_t ue8m0_block_scale(const float* x, int64_t n, float amax_floor, float inverse_max_code) {
  const float amax = floor_at(block_amax(x, n), amax_floor);
  return ue8m0_ceil_code(amax * inverse_max_code);
}

// The reference clamps x / scale to ±max_code before the cast; the encoders saturate at ±max_code themselves
// (and keep NaN), so clamp-then-encode and encode give the same code for every input: the clamp is implied.

// e4m3 codes of x * inverse_scale (inverse_scale a power of two, so this is x / scale exactly).
void encode_e4m3_block(const float* x, int64_t n, float inverse_scale, uint8_t* codes) {
  for (int64_t i = 0; i < n; ++i) codes[i] = encode_e4m3(x[i] * inverse_scale);
}

// Packed e2m1 codes (low nibble = even element) of x * inverse_scale, or of x / scale when `divide`.
// packed points at the byte of x[0]; x[0] is an even element (blocks start at multiples of 16).
template <bool divide>
void encode_e2m1_block(const float* x, int64_t n, float scale_or_inverse, uint8_t* packed) {
  auto scaled = [scale_or_inverse](float v) { return divide ? v / scale_or_inverse : v * scale_or_inverse; };
  const int64_t pairs = n / 2;
  for (int64_t i = 0; i < pairs; ++i) {
    packed[i] = static_cast<uint8_t>(encode_e2m1(scaled(x[2 * i])) | (encode_e2m1(scaled(x[2 * i + 1])) << 4));
  }
  if (n & 1) packed[pairs] = encode_e2m1(scaled(x[n - 1]));  // odd tail: high nibble 0
}

void quant_act_block(const float* x, int64_t n, uint8_t* codes, uint8_t* scale) {
  const uint8_t scale_code = ue8m0_block_scale(x, n, kActAmaxFloor, 1.0f / kE4m3Max);
  encode_e4m3_block(x, n, ue8m0_inverse(scale_code), codes);
  *scale = scale_code;
}

uint8_t get_nibble(const uint8_t* packed, int64_t i) {
  return (i & 1) ? static_cast<uint8_t>(packed[i >> 1] >> 4) : static_cast<uint8_t>(packed[i >> 1] & 0x0f);
}

// x [n] -> packed bytes starting at packed[0] (x[0] is an even element).
void quant_fp4_ue8m0_block(const float* x, int64_t n, uint8_t* packed, uint8_t* scale) {
  const uint8_t scale_code = ue8m0_block_scale(x, n, kFp4Ue8m0AmaxFloor, 1.0f / kE2m1Max);
  encode_e2m1_block<false>(x, n, ue8m0_inverse(scale_code), packed);
  *scale = scale_code;
}

void quant_fp4_e4m3_block(const float* x, int64_t n, uint8_t* packed, uint8_t* scale) {
  const float amax = floor_at(block_amax(x, n), kFp4E4m3AmaxFloor);
  // Non-finite amax -> NaN scale (the codec alone would saturate infinity to 448).
  const uint8_t scale_code = std::isfinite(amax) ? f32_to_e4m3(amax / kE2m1Max) : uint8_t{0x7f};
  // The e4m3 scale is not a power of two: x / scale must be a true IEEE division (spec §4.9).
  encode_e2m1_block<true>(x, n, e4m3_to_f32(scale_code), packed);
  *scale = scale_code;
}

}  // namespace

uint8_t ue8m0_scale_code(float amax, float max_code, float amax_floor) {
  return ue8m0_ceil_code(floor_at(amax, amax_floor) * (1.0f / max_code));
}

void encode_e4m3_scaled(const float* x, int64_t n, float inverse_scale, uint8_t* codes) {
  encode_e4m3_block(x, n, inverse_scale, codes);
}

void act_quant_block32(const float* x, int64_t n, uint8_t* codes, uint8_t* scales) {
  for (int64_t begin = 0, block = 0; begin < n; begin += 32, ++block) {
    quant_act_block(x + begin, std::min<int64_t>(32, n - begin), codes + begin, scales + block);
  }
}

void fp4_quant_ue8m0_block32(const float* x, int64_t n, uint8_t* packed, uint8_t* scales) {
  for (int64_t begin = 0, block = 0; begin < n; begin += 32, ++block) {
    quant_fp4_ue8m0_block(x + begin, std::min<int64_t>(32, n - begin), packed + begin / 2, scales + block);
  }
}

void fp4_quant_e4m3_block16(const float* x, int64_t n, uint8_t* packed, uint8_t* scales) {
  for (int64_t begin = 0, block = 0; begin < n; begin += 16, ++block) {
    quant_fp4_e4m3_block(x + begin, std::min<int64_t>(16, n - begin), packed + begin / 2, scales + block);
  }
}

void dequant_e4m3_ue8m0(const uint8_t* codes, const uint8_t* scales, int64_t n, int block, float* out) {
  const float* values = e4m3_value_table();
  for (int64_t begin = 0; begin < n; begin += block) {
    const float scale = e8m0_to_f32(scales[begin / block]);
    const int64_t end = std::min<int64_t>(n, begin + block);
    for (int64_t i = begin; i < end; ++i) out[i] = values[codes[i]] * scale;
  }
}

namespace {
// n e2m1 codes (packed, low nibble first) times one scale per `block` codes: the scale is decoded once per block
// and each byte gives two values (these rows are read per query in sparse attention, so this loop is hot).
template <class DecodeScale>
void dequant_e2m1_blocks(const uint8_t* packed, const uint8_t* scales, int64_t n, int block, float* out,
                         DecodeScale decode_scale) {
  const float* values = e2m1_value_table();
  for (int64_t begin = 0; begin < n; begin += block) {
    const float scale = decode_scale(scales[begin / block]);
    const int64_t end = std::min<int64_t>(n, begin + block);
    int64_t i = begin;
    if (i & 1) {  // an odd block size: this block starts on a high nibble
      out[i] = values[get_nibble(packed, i)] * scale;
      ++i;
    }
    for (; i + 1 < end; i += 2) {
      const uint8_t byte = packed[i >> 1];
      out[i] = values[byte & 0x0f] * scale;
      out[i + 1] = values[byte >> 4] * scale;
    }
    if (i < end) out[i] = values[get_nibble(packed, i)] * scale;
  }
}
}  // namespace

void dequant_e2m1_ue8m0(const uint8_t* packed, const uint8_t* scales, int64_t n, int block, float* out) {
  dequant_e2m1_blocks(packed, scales, n, block, out, e8m0_to_f32);
}

void dequant_e2m1_e4m3(const uint8_t* packed, const uint8_t* scales, int64_t n, int block, float* out) {
  const float* e4m3 = e4m3_value_table();
  dequant_e2m1_blocks(packed, scales, n, block, out, [e4m3](uint8_t code) { return e4m3[code]; });
}

// Fake quantisation (the reference's `inplace=True` paths): quantise, dequantise, cast back to the caller's
// bf16 (every dequantised value of a reachable scale is already bf16-representable; the cast states it).
void fake_quant_act_block32(float* x, int64_t n) {
  uint8_t codes[32];
  uint8_t scale = 0;
  for (int64_t begin = 0; begin < n; begin += 32) {
    const int64_t len = std::min<int64_t>(32, n - begin);
    quant_act_block(x + begin, len, codes, &scale);
    const float scale_value = e8m0_to_f32(scale);
    for (int64_t i = 0; i < len; ++i) x[begin + i] = round_to_bf16(e4m3_to_f32(codes[i]) * scale_value);
  }
}

void fake_quant_fp4_ue8m0_block32(float* x, int64_t n) {
  uint8_t packed[16] = {};
  uint8_t scale = 0;
  for (int64_t begin = 0; begin < n; begin += 32) {
    const int64_t len = std::min<int64_t>(32, n - begin);
    quant_fp4_ue8m0_block(x + begin, len, packed, &scale);
    const float scale_value = e8m0_to_f32(scale);
    for (int64_t i = 0; i < len; ++i) x[begin + i] = round_to_bf16(e2m1_to_f32(get_nibble(packed, i)) * scale_value);
  }
}

void fake_quant_fp4_e4m3_block16(float* x, int64_t n) {
  uint8_t packed[8] = {};
  uint8_t scale = 0;
  for (int64_t begin = 0; begin < n; begin += 16) {
    const int64_t len = std::min<int64_t>(16, n - begin);
    quant_fp4_e4m3_block(x + begin, len, packed, &scale);
    const float scale_value = e4m3_to_f32(scale);
    for (int64_t i = 0; i < len; ++i) x[begin + i] = round_to_bf16(e2m1_to_f32(get_nibble(packed, i)) * scale_value);
  }
}

}  // namespace dsflash
