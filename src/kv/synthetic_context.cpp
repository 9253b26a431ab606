#include "kv/synthetic_context.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace dsflash::kv {
namespace {

// splitmix64: a small, fast, seedable generator (benchmark data, not cryptography).
class SplitMix {
 public:
  explicit SplitMix(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  void fill(uint8_t* out, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const uint64_t v = next();
      for (int b = 0; b < 8; ++b) out[i + b] = static_cast<uint8_t>(v >> (8 * b));
    }
    if (i < n) {
      const uint64_t v = next();
      for (int b = 0; i < n; ++i, ++b) out[i] = static_cast<uint8_t>(v >> (8 * b));
    }
  }
  // Uniform in [lo, lo + span).
  uint32_t below(uint32_t span) { return static_cast<uint32_t>(next() % span); }
  // Roughly N(0, 1): the sum of four uniforms, centred and scaled.
  float normal() {
    float s = 0.0f;
    for (int i = 0; i < 4; ++i) s += static_cast<float>(next() >> 40) / static_cast<float>(1ull << 24);
    return (s - 2.0f) * 1.7320508f;
  }

 private:
  uint64_t state_;
};

// e4m3 bits of a positive value 2^(e-7) * (1 + m/8), exponent field e in [3, 6): [2^-4, 2^-1).
uint8_t random_e4m3_scale(SplitMix& rng) {
  return static_cast<uint8_t>(((3 + rng.below(3)) << 3) | rng.below(8));
}

// Any e4m3 byte except the two NaN codes (0x7f, 0xff).
void random_e4m3_codes(SplitMix& rng, uint8_t* out, int64_t n) {
  rng.fill(out, n);
  for (int64_t i = 0; i < n; ++i) {
    if ((out[i] & 0x7f) == 0x7f) out[i] &= 0xfe;
  }
}

}  // namespace

Status fill_synthetic_context(SequenceKv& seq, int64_t depth, uint64_t seed) {
  if (depth < 0) return Status::Error("synthetic context: negative depth " + std::to_string(depth));
  if (seq.num_positions() != 0) {
    return Status::Error("synthetic context: the sequence already holds " + std::to_string(seq.num_positions()) +
                         " positions");
  }
  if (seq.pages().capacity_positions() < depth) {
    return Status::Error("synthetic context: " + std::to_string(depth) + " positions need reserved pages, " +
                         std::to_string(seq.pages().capacity_positions()) + " reserved");
  }
  const KvLayout& layout = seq.layout();
  SplitMix rng(seed);
  const int64_t head_dim = layout.head_dim, index_dim = layout.index_head_dim;
  // One entry's rows: main codes [head_dim/2], main scales [head_dim/16], key codes [index_dim/2], key scales
  // [index_dim/32].
  std::vector<uint8_t> kv_codes(static_cast<size_t>(head_dim / 2)), kv_scales(static_cast<size_t>(head_dim / 16));
  std::vector<uint8_t> key_codes(static_cast<size_t>(index_dim / 2)), key_scales(static_cast<size_t>(index_dim / 32));
  for (int layer = 0; layer < seq.num_layers(); ++layer) {
    CompressedKv* kv = seq.compressed(layer);
    if (kv == nullptr) continue;
    const int64_t entries = depth / kv->ratio();
    for (int64_t e = kv->num_entries(); e < entries; ++e) {
      rng.fill(kv_codes.data(), static_cast<int64_t>(kv_codes.size()));
      for (uint8_t& s : kv_scales) s = random_e4m3_scale(rng);
      rng.fill(key_codes.data(), static_cast<int64_t>(key_codes.size()));
      for (uint8_t& s : key_scales) s = static_cast<uint8_t>(124 + rng.below(4));  // 2^-3 .. 2^0
      const Status s = kv->append(kv_codes.data(), kv_scales.data(), key_codes.data(), key_scales.data());
      if (!s.ok()) return s.with_context("synthetic context, layer " + std::to_string(layer));
    }
    if (CompressorTail* tail = seq.tail(layer)) {
      tail->reset();
      const int64_t pending = depth % tail->ratio;
      for (int64_t slot = 0; slot < pending; ++slot) {
        for (int64_t d = 0; d < tail->head_dim; ++d) {
          tail->kv[static_cast<size_t>(slot * tail->head_dim + d)] = rng.normal();
          tail->score[static_cast<size_t>(slot * tail->head_dim + d)] = rng.normal();
        }
      }
    }
  }
  std::vector<uint8_t> row_codes(static_cast<size_t>(head_dim)), row_scales(static_cast<size_t>(head_dim / 32));
  for (int layer = 0; layer < seq.num_layers(); ++layer) {
    WindowRing& ring = seq.window(layer);
    for (int64_t p = std::max<int64_t>(0, depth - ring.window()); p < depth; ++p) {
      random_e4m3_codes(rng, row_codes.data(), head_dim);
      for (uint8_t& s : row_scales) s = static_cast<uint8_t>(119 + rng.below(3));  // 2^-8 .. 2^-6
      ring.write(p, row_codes.data(), row_scales.data());
    }
  }
  seq.advance(depth);
  return Status::Ok();
}

}  // namespace dsflash::kv
