// Choice of the linear kernel set for this CPU (once, at first use) and the shape checks.
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

void repack_tile_major(const uint8_t* row_major, int64_t out, int64_t row_bytes, uint8_t* tile_major,
                       ThreadPool* pool) {
  auto tiles = [&](int64_t tile_begin, int64_t tile_end, int) {
    for (int64_t o = tile_begin * kTileMajorOutputs; o < tile_end * kTileMajorOutputs; ++o)
      for (int64_t c = 0; c < row_bytes; c += kTileMajorGroupBytes)
        std::memcpy(tile_major + weight_byte_offset(o, c, row_bytes, true), row_major + o * row_bytes + c,
                    static_cast<size_t>(kTileMajorGroupBytes));
  };
  const int64_t num_tiles = out / kTileMajorOutputs;
  if (pool != nullptr) pool->parallel_for(num_tiles, tiles);
  else tiles(0, num_tiles, 0);
}

Status check_fp8_linear(const Fp8Activations& x, const Fp8Weight& w) {
  if (x.k != w.in)
    return Status::Error("fp8 linear: activations " + shape_text(x.rows, x.k) + " do not match weight " +
                         shape_text(w.out, w.in) + " (k != in)");
  if (w.in <= 0 || w.in % 32 != 0 || w.out <= 0)
    return Status::Error("fp8 linear: weight " + shape_text(w.out, w.in) + ": in must be a positive multiple of 32");
  if (!w.codes || !w.scales || (x.rows > 0 && (!x.codes || !x.scales)))
    return Status::Error("fp8 linear: null data pointer");
  if (w.tile_major && !tile_major_possible(w.out, w.in))
    return Status::Error("fp8 linear: weight " + shape_text(w.out, w.in) + " cannot be tile-major");
  return Status::Ok();
}

Status check_fp4_linear(const Fp8Activations& x, const Fp4Weight& w) {
  if (x.k != w.in)
    return Status::Error("fp4 linear: activations " + shape_text(x.rows, x.k) + " do not match weight " +
                         shape_text(w.out, w.in) + " (k != in)");
  if (w.in <= 0 || w.in % 32 != 0 || w.out <= 0)
    return Status::Error("fp4 linear: weight " + shape_text(w.out, w.in) + ": in must be a positive multiple of 32");
  if (!w.packed || !w.scales || (x.rows > 0 && (!x.codes || !x.scales)))
    return Status::Error("fp4 linear: null data pointer");
  if (w.tile_major && !tile_major_possible(w.out, w.in / 2))
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
  if (const LinearKernels* k = avx512_kernels()) all.push_back(k);
  if (const LinearKernels* k = avx2_kernels()) all.push_back(k);
  all.push_back(&reference_linear_kernels());
  return all;
}
}  // namespace linear_impl

// Chosen once from cpuid (each ISA file checks its own features).
const LinearKernels& best_linear_kernels() {
  static const LinearKernels& best = *linear_impl::available_kernels().front();
  return best;
}

}  // namespace dsflash
