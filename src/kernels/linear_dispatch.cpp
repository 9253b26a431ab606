// Choice of the linear kernel set for this CPU (once, at first use) and the shape checks.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>

#include "kernels/linear.h"
#include "kernels/linear_impl.h"

namespace dsflash {

namespace {
std::string shape_text(int64_t a, int64_t b) {
  std::string text = "[";
  text += std::to_string(a);
  text += ", ";
  text += std::to_string(b);
  text += "]";
  return text;
}
}  // namespace

namespace {
// Runs tile(t) for every tile of a tile-major weight with `out` outputs, over the pool when there is one, split
// over the NUMA nodes as the kernels split the tiles (ThreadPool::parallel_for_nodes): the copy's writes place
// each node's tiles in its own memory (first touch).
template <class Tile>
void for_each_tile(int64_t out, ThreadPool* pool, const Tile& tile) {
  auto tiles = [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t) tile(t);
  };
  const int64_t num_tiles = out / kTileMajorOutputs;
  if (pool != nullptr) pool->parallel_for_nodes(num_tiles, tiles);
  else tiles(0, num_tiles, 0);
}

// The copies go over a tile 64 vectors (4 KB) at a time, which stay in L1 while they take the 16 rows in turn, each
// row's bytes read in runs. (Row by row over the whole tile, and with their old checks / nibble loops, the FP8
// copies were 2.3-3.1x and the MXFP4 ones 1.3x slower: bench_linear repack/.)
constexpr int64_t kRepackChunkVectors = 64;
}  // namespace

bool repack_fp8_tile_major(const uint8_t* row_major, int64_t out, int64_t in, uint8_t* tile_major, ThreadPool* pool,
                           uint8_t* plain_code_blocks) {
  std::atomic<bool> nan_codes = false;
  const int64_t kb = in / 32, block_bytes = 32 * kTileMajorOutputs;  // a tile's block: 512 consecutive bytes
  for_each_tile(out, pool, [&](int64_t t) {
    const uint8_t* rows = row_major + t * kTileMajorOutputs * in;
    uint8_t* tile = tile_major + t * kTileMajorOutputs * in;
    // A row's 4 codes of vector v go to its lane, k%4 = 0,1 at +0,+1 and 2,3 at +8,+9.
    for (int64_t v0 = 0; v0 < in / 4; v0 += kRepackChunkVectors) {
      const int64_t v1 = std::min(in / 4, v0 + kRepackChunkVectors);
      for (int64_t i = 0; i < kTileMajorOutputs; ++i) {
        const uint8_t* row = rows + i * in;
        uint8_t* lane = tile + 16 * (i / 4) + 2 * (i % 4);
        for (int64_t v = v0; v < v1; ++v) {
          std::memcpy(lane + v * kTileMajorVectorBytes, row + 4 * v, 2);
          std::memcpy(lane + v * kTileMajorVectorBytes + 8, row + 4 * v + 2, 2);
        }
      }
    }
    // The tile just written is still in cache. Each block in one pass without early exits, so that it vectorises
    // (typical weights, with no NaN and few subnormal codes, never took the exits of byte-by-byte loops).
    bool any_nan = false;
    for (int64_t b = 0; b < kb; ++b) {
      const uint8_t* block = tile + b * block_bytes;
      uint8_t nan = 0, odd = 0;  // (bool accumulators keep GCC 12 from vectorising)
      for (int64_t j = 0; j < block_bytes; ++j) {
        nan |= (block[j] & 0x7f) == 0x7f;
        odd |= fp8_code_is_subnormal_or_nan(block[j]);
      }
      any_nan = any_nan || nan != 0;
      if (plain_code_blocks != nullptr) plain_code_blocks[t * kb + b] = odd != 0 ? 0 : 1;
    }
    if (any_nan) nan_codes.store(true, std::memory_order_relaxed);
  });
  return nan_codes.load();
}

namespace {
// One tile: 16 row-major rows of packed codes from `rows` -> the tile's tile-major bytes.
void repack_fp4_tile(const uint8_t* rows, int64_t in, uint8_t* tile) {
  const int64_t row_bytes = in / 2;
  for (int64_t v0 = 0; v0 < in / 8; v0 += kRepackChunkVectors) {
    const int64_t v1 = std::min(in / 8, v0 + kRepackChunkVectors);
    for (int64_t i = 0; i < kTileMajorOutputs; ++i) {
      const uint8_t* row = rows + i * row_bytes;
      for (int64_t v = v0; v < v1; ++v) {
        // Bytes 4v..4v+3 hold k = 8v + 2q (low nibble) and 8v + 2q + 1 (high nibble), q = 0..3; word s of lane
        // i gets the codes of k%2 == s, nibble q = k%8 / 2: the low (high) nibbles of the 4 bytes, in byte order.
        uint32_t bytes;
        std::memcpy(&bytes, row + 4 * v, 4);
        auto nibbles_in_order = [](uint32_t n) {  // n: a nibble in the low half of each byte
          const uint32_t pairs = n | n >> 4;     // bytes 0 and 2 now hold nibbles (0, 1) and (2, 3)
          return static_cast<uint16_t>((pairs & 0xff) | (pairs >> 8 & 0xff00));
        };
        const uint16_t words[2] = {nibbles_in_order(bytes & 0x0f0f0f0fu), nibbles_in_order(bytes >> 4 & 0x0f0f0f0fu)};
        std::memcpy(tile + v * kTileMajorVectorBytes + 4 * i, words, 4);
      }
    }
  }
}

// One tile's scales: 16 row-major rows of kb scales from `rows` -> [kb, 16] (fp4_scale_index within the tile).
void repack_fp4_tile_scales(const uint8_t* rows, int64_t kb, uint8_t* tile) {
  for (int64_t i = 0; i < kTileMajorOutputs; ++i)
    for (int64_t b = 0; b < kb; ++b) tile[kTileMajorOutputs * b + i] = rows[i * kb + b];
}

}  // namespace

void repack_fp4_tile_major(const uint8_t* row_major, int64_t out, int64_t in, uint8_t* tile_major, ThreadPool* pool) {
  const int64_t tile_bytes = kTileMajorOutputs * (in / 2);
  for_each_tile(out, pool,
                [&](int64_t t) { repack_fp4_tile(row_major + t * tile_bytes, in, tile_major + t * tile_bytes); });
}

void repack_fp4_scales_tile_major(const uint8_t* row_major, int64_t out, int64_t in, uint8_t* tile_major,
                                  ThreadPool* pool) {
  const int64_t tile_scales = kTileMajorOutputs * (in / 32);
  for_each_tile(out, pool, [&](int64_t t) {
    repack_fp4_tile_scales(row_major + t * tile_scales, in / 32, tile_major + t * tile_scales);
  });
}

void repack_fp4_pair_tile_major(const Fp4Weight& a, const Fp4Weight& b, uint8_t* packed, uint8_t* scales,
                                ThreadPool* pool) {
  const int64_t tile_bytes = kTileMajorOutputs * (a.in / 2), tile_scales = kTileMajorOutputs * (a.in / 32);
  for_each_tile(2 * a.out, pool, [&](int64_t t) {
    const Fp4Weight& from = t % 2 == 0 ? a : b;
    repack_fp4_tile(from.packed + t / 2 * tile_bytes, a.in, packed + t * tile_bytes);
    repack_fp4_tile_scales(from.scales + t / 2 * tile_scales, a.in / 32, scales + t * tile_scales);
  });
}

const uint8_t* fp8_block_codes(const Fp8Weight& w, int64_t o, int64_t b, uint8_t (&scratch)[32]) {
  if (!w.tile_major) return w.codes + o * w.in + 32 * b;
  for (int j = 0; j < 32; ++j) scratch[j] = w.codes[fp8_tile_major_offset(o, 32 * b + j, w.in)];
  return scratch;
}

const uint8_t* fp4_block_packed(const Fp4Weight& w, int64_t o, int64_t b, uint8_t (&scratch)[16]) {
  if (!w.tile_major) return w.packed + o * (w.in / 2) + 16 * b;
  auto code = [&](int64_t k) {
    const NibbleOffset at = fp4_tile_major_offset(o, k, w.in);
    return (w.packed[at.byte] >> at.shift) & 0xf;
  };
  for (int j = 0; j < 16; ++j) scratch[j] = static_cast<uint8_t>(code(32 * b + 2 * j) | code(32 * b + 2 * j + 1) << 4);
  return scratch;
}

namespace {
// The weight's own preconditions (any activations); `what` names the linear kind in the message.
Status check_fp8_weight(const char* what, const Fp8Weight& w) {
  if (w.in <= 0 || w.in % 32 != 0 || w.out <= 0)
    return Status::Error(std::string(what) + ": weight " + shape_text(w.out, w.in) +
                         ": in must be a positive multiple of 32");
  if (!w.codes || !w.scales) return Status::Error(std::string(what) + ": null data pointer");
  if (w.tile_major && !tile_major_possible(w.out, w.in))
    return Status::Error(std::string(what) + ": weight " + shape_text(w.out, w.in) + " cannot be tile-major");
  return Status::Ok();
}
}  // namespace

Status check_fp8_linear(const Fp8Activations& x, const Fp8Weight& w) {
  if (x.k != w.in)
    return Status::Error("fp8 linear: activations " + shape_text(x.rows, x.k) + " do not match weight " +
                         shape_text(w.out, w.in) + " (k != in)");
  if (x.rows > 0 && (!x.codes || !x.scales)) return Status::Error("fp8 linear: null data pointer");
  return check_fp8_weight("fp8 linear", w);
}

Status check_fp8_as_bf16_linear(int64_t x_k, const Fp8Weight& w) {
  if (x_k != w.in)
    return Status::Error("fp8-as-bf16 linear: activation width " + std::to_string(x_k) + " does not match weight " +
                         shape_text(w.out, w.in));
  return check_fp8_weight("fp8-as-bf16 linear", w);
}

Status check_fp8_as_bf16_grouped_linear(int64_t x_k, int64_t groups, const Fp8Weight& w) {
  if (groups <= 0 || w.out % groups != 0 || (groups > 1 && (w.out / groups) % 32 != 0))
    return Status::Error("fp8-as-bf16 grouped linear: weight " + shape_text(w.out, w.in) + " in " +
                         std::to_string(groups) + " groups: each group must have a multiple of 32 outputs");
  if (x_k != groups * w.in)
    return Status::Error("fp8-as-bf16 grouped linear: activation width " + std::to_string(x_k) + " is not " +
                         std::to_string(groups) + " groups of the weight's " + std::to_string(w.in) + " inputs");
  return check_fp8_weight("fp8-as-bf16 grouped linear", w);
}

Status check_fp4_linear(const Fp8Activations& x, const Fp4Weight& w) {
  if (x.k != w.in)
    return Status::Error("fp4 linear: activations " + shape_text(x.rows, x.k) + " do not match weight " +
                         shape_text(w.out, w.in) + " (k != in)");
  if (w.in <= 0 || w.in % 32 != 0 || w.out <= 0)
    return Status::Error("fp4 linear: weight " + shape_text(w.out, w.in) + ": in must be a positive multiple of 32");
  if (!w.packed || !w.scales || (x.rows > 0 && (!x.codes || !x.scales)))
    return Status::Error("fp4 linear: null data pointer");
  if (w.tile_major && !tile_major_possible(w.out, w.in))
    return Status::Error("fp4 linear: weight " + shape_text(w.out, w.in) + " cannot be tile-major");
  return Status::Ok();
}

Status check_bf16_linear(int64_t x_k, const Bf16Weight& w) {
  if (x_k != w.in)
    return Status::Error("bf16 linear: activation width " + std::to_string(x_k) + " does not match weight " +
                         shape_text(w.out, w.in));
  if (w.in <= 0 || w.out <= 0) return Status::Error("bf16 linear: empty weight " + shape_text(w.out, w.in));
  if (!w.data) return Status::Error("bf16 linear: null data pointer");
  return Status::Ok();
}

namespace linear_impl {
std::vector<const LinearKernels*> available_kernels() {
  std::vector<const LinearKernels*> all;
  if (const LinearKernels* k = avx512_kernels()) {
    all.push_back(k);
    // The same table multiplying the other way (same bits; tests and benchmarks run both).
    const RowsMultiply other = fastest_rows_multiply() == RowsMultiply::kFp32Fma ? RowsMultiply::kBf16Dot
                                                                                   : RowsMultiply::kFp32Fma;
    all.push_back(avx512_kernels_multiplying(other));
  }
  if (const LinearKernels* k = amx_kernels()) all.push_back(k);  // by name only: slower one-row decode
  // The default where the CPU lacks AVX512-BF16, by name only where it has it.
  if (const LinearKernels* k = avx512_no_bf16::kernels()) all.push_back(k);
  // The default where the CPU lacks VBMI too, by name only where it has it.
  if (const LinearKernels* k = avx512_no_vbmi::kernels()) all.push_back(k);
  // ... and VNNI too.
  if (const LinearKernels* k = avx512_no_vnni::kernels()) all.push_back(k);
  if (const LinearKernels* k = avx2_kernels()) all.push_back(k);
  all.push_back(&reference_linear_kernels());
  return all;
}
}  // namespace linear_impl

// Chosen once from cpuid (each ISA file checks its own features) and, for AVX-512, a short timing.
const LinearKernels& best_linear_kernels() {
  static const LinearKernels& best = *linear_impl::available_kernels().front();
  return best;
}

}  // namespace dsflash
