// Block quantisers with the official rounding (spec/MODEL.md §4.9). Inputs are fp32 values (usually
// bf16-representable activations); every division by a non-power-of-two scale is IEEE `x / s` (for ue8m0 scales
// x * 2^-k is the same correctly rounded value). n need not be a multiple of the block: a shorter final block is
// quantised on its own (the reference only ever passes whole blocks). NaN or infinity in a block gives a NaN
// scale (ue8m0 0xff / e4m3 0x7f) and a block that dequantises to NaN.
#pragma once

#include <cstdint>

namespace dsflash {

// act_quant: FP8 activations for the FP8/FP4 GEMMs and the window (SWA) cache.
// x [n] (n % 32 == 0) -> codes [n] e4m3, scales [n/32] ue8m0.
// amax = max|x| per 32 clamped >= 1e-4; scale = 2^ceil(log2(amax * fl(1/448))) (the official bit trick);
// code = e4m3(clamp(x/scale, ±448)).
void act_quant_block32(const float* x, int64_t n, uint8_t* codes, uint8_t* scales);

// fp4_act_quant with ue8m0 scales, block 32 (indexer q and k, MXFP4).
// x [n] -> packed [n/2] e2m1 (low nibble = even index), scales [n/32] ue8m0.
// scale = 2^ceil(log2(max(amax, 6*2^-126) / 6)).
void fp4_quant_ue8m0_block32(const float* x, int64_t n, uint8_t* packed, uint8_t* scales);

// fp4_act_quant with e4m3 scales, block 16 (compressed main KV).
// x [n] -> packed [n/2] e2m1, scales [n/16] e4m3. scale = e4m3_rne(max(amax, 6*2^-9) / 6), saturated at 448
// like the CUDA kernel's satfinite cast and vLLM (torch's CPU cast would give NaN for amax > 2784).
void fp4_quant_e4m3_block16(const float* x, int64_t n, uint8_t* packed, uint8_t* scales);

// The ue8m0 code of the power-of-two scale 2^ceil(log2(amax / max_code)), by the official bit trick on
// amax * fl(1/max_code); amax is first floored at `amax_floor`; 0xff (NaN) for a non-finite amax. For block
// shapes the functions above do not cover (the checkpoint's 32x32 FP8 weight tiles).
uint8_t ue8m0_scale_code(float amax, float max_code, float amax_floor);

// The encode step of act_quant for a known power-of-two scale: codes[i] = e4m3(clamp(x[i] * inverse_scale, ±448)).
void encode_e4m3_scaled(const float* x, int64_t n, float inverse_scale, uint8_t* codes);

// Dequantisers (exact: every product is representable in fp32).
void dequant_e4m3_ue8m0(const uint8_t* codes, const uint8_t* scales, int64_t n, int block, float* out);
void dequant_e2m1_ue8m0(const uint8_t* packed, const uint8_t* scales, int64_t n, int block, float* out);
void dequant_e2m1_e4m3(const uint8_t* packed, const uint8_t* scales, int64_t n, int block, float* out);

// Fake quantisation as the reference applies it to cached values: quantise then dequantise in place.
void fake_quant_act_block32(float* x, int64_t n);
void fake_quant_fp4_ue8m0_block32(float* x, int64_t n);
void fake_quant_fp4_e4m3_block16(float* x, int64_t n);

}  // namespace dsflash
