// Random weights in the official storage formats (see tiny_weights.h).
#include "tiny/tiny_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "formats/formats.h"
#include "formats/quant.h"

namespace dsflash::tiny {

namespace {

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// "layers.7.attn.wq_a.weight" -> "attn.wq_a.weight"; "mtp.0.norm.weight" -> "norm.weight"; globals unchanged.
std::string local_name(const std::string& name) {
  for (const char* prefix : {"layers.", "mtp."}) {
    const size_t len = std::strlen(prefix);
    if (name.compare(0, len, prefix) == 0) {
      const size_t dot = name.find('.', len);
      if (dot != std::string::npos) return name.substr(dot + 1);
    }
  }
  return name;
}

uint64_t fnv1a(const std::string& text) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 0x100000001b3ull;
  }
  return hash;
}

// SplitMix64: one 64-bit draw per value, fast and with a per-tensor stream (seed, name).
class Rng {
 public:
  explicit Rng(uint64_t state) : state_(state) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Approximately N(0, 1): the sum of four 16-bit uniforms (Irwin-Hall), centred and scaled to unit variance.
  // Bounded at ±3.46: weights without the rare huge outliers a true normal has, which is all a test model needs.
  float normal() {
    const uint64_t bits = next();
    const float sum = static_cast<float>((bits & 0xffff) + ((bits >> 16) & 0xffff) + ((bits >> 32) & 0xffff) +
                                         (bits >> 48)) *
                      (1.0f / 65536.0f);
    return (sum - 2.0f) * 1.7320508f;  // variance of the sum is 4/12
  }
  float uniform(float low, float high) {
    return low + (high - low) * static_cast<float>(next() >> 40) * (1.0f / 16777216.0f);
  }

 private:
  uint64_t state_;
};

// How one tensor's values are drawn.
struct Init {
  enum class Kind { kNormal, kUniform } kind = Kind::kNormal;
  float a = 0;  // normal: mean; uniform: low
  float b = 1;  // normal: std;  uniform: high
};

int64_t logical_in_features(const ExpectedTensor& t) {
  const int64_t in = t.shape.back();
  return (t.dtype == DType::kI8 || t.dtype == DType::kU8) ? in * 2 : in;  // packed e2m1 stored as bytes
}

// The gain of a residual branch's output projection (goldens MANIFEST.md "Sensitivity": branch_gains).
float branch_gain(const std::string& local) {
  if (local == "attn.wo_b.weight") return 0.12f;
  if ((contains(local, "ffn.experts.") || contains(local, "ffn.shared_experts.")) && ends_with(local, ".w2.weight")) {
    return 0.05f;
  }
  return 1.0f;
}

Init init_for(const ExpectedTensor& t) {
  const std::string local = local_name(t.name);
  if (ends_with(local, "norm.weight") || local == "engram.q_weight" || local == "engram.k_weight") {
    return {Init::Kind::kNormal, 1.0f, 0.1f};
  }
  if (local == "attn.attn_sink") return {Init::Kind::kNormal, 0.5f, 0.5f};
  if (ends_with(local, "_fn") && contains(local, "hc_")) {
    return {Init::Kind::kNormal, 0.0f, 1.0f / std::sqrt(static_cast<float>(t.shape.back()))};
  }
  if (ends_with(local, "_base") && contains(local, "hc_")) return {Init::Kind::kNormal, 0.0f, 0.5f};
  if (ends_with(local, "_scale") && contains(local, "hc_")) return {Init::Kind::kUniform, 0.5f, 1.0f};
  if (local == "ffn.gate.bias" || local == "ffn.gate.bias_vl") return {Init::Kind::kUniform, -0.3f, 0.3f};
  if (local == "embed.weight" || local == "markov_head.embed.weight" || local == "engram.embed.weight") {
    return {Init::Kind::kNormal, 0.0f, 1.0f};
  }
  if (t.shape.size() == 2) {
    const float std = branch_gain(local) / std::sqrt(static_cast<float>(logical_in_features(t)));
    return {Init::Kind::kNormal, 0.0f, std};
  }
  return {Init::Kind::kNormal, 0.0f, 0.02f};  // remaining vectors (biases)
}

int64_t element_count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

WeightGenerator::WeightGenerator(const ModelConfig& config, const std::vector<ExpectedTensor>& schema, uint64_t seed)
    : config_(config), seed_(seed) {
  for (const auto& t : schema) by_name_[t.name] = &t;
}

// fp32 values of a tensor, logical shape [rows, cols] (packed experts: cols = logical K).
static std::vector<float> draw_values(const ExpectedTensor& t, const ModelConfig& config, uint64_t seed) {
  Rng rng(seed ^ fnv1a(t.name));
  const Init init = init_for(t);
  int64_t n = element_count(t.shape);
  if (t.dtype == DType::kI8 || t.dtype == DType::kU8) n *= 2;
  std::vector<float> values(static_cast<size_t>(n));
  if (init.kind == Init::Kind::kUniform) {
    for (auto& v : values) v = rng.uniform(init.a, init.b);
  } else {
    for (auto& v : values) v = init.a + init.b * rng.normal();
  }
  // Engram wkv [dim*(hc+1), in]: the last `dim` rows make the value added to the streams (a residual branch).
  if (ends_with(t.name, "engram.wkv.weight")) {
    const int64_t in = t.shape.back();
    const int64_t first_value_row = config.dim * config.hc_mult;
    for (int64_t r = first_value_row; r < t.shape[0]; ++r) {
      for (int64_t k = 0; k < in; ++k) values[static_cast<size_t>(r * in + k)] *= 0.12f;
    }
  }
  return values;
}

Result<std::vector<uint8_t>> WeightGenerator::quantised_weight(const ExpectedTensor& t) {
  const std::string scale_name = t.name.substr(0, t.name.size() - std::strlen(".weight")) + ".scale";
  const auto scale_it = by_name_.find(scale_name);
  if (scale_it == by_name_.end()) return Status::Error(t.name + ": quantised weight without " + scale_name);
  const ExpectedTensor& scale = *scale_it->second;
  if (t.shape.size() != 2) return Status::Error(t.name + ": quantised weight is not 2-D");
  const std::vector<float> values = draw_values(t, config_, seed_);
  const int64_t rows = t.shape[0];
  const int64_t cols = logical_in_features(t);
  std::vector<uint8_t> bytes(dtype_bytes(t.dtype, element_count(t.shape)));
  std::vector<uint8_t> scales(scale.num_bytes());

  if (t.dtype == DType::kF4 || t.dtype == DType::kI8 || t.dtype == DType::kU8) {
    // MXFP4 routed expert: each row is K-major, ue8m0 per 32 along K; [rows, cols/2] bytes, [rows, cols/32] scales.
    if (cols % 32 != 0 || element_count(scale.shape) != rows * cols / 32) {
      return Status::Error(t.name + ": MXFP4 shape " + std::to_string(rows) + "x" + std::to_string(cols) +
                           " does not match its scale " + scale_name);
    }
    for (int64_t r = 0; r < rows; ++r) {
      fp4_quant_ue8m0_block32(&values[static_cast<size_t>(r * cols)], cols, &bytes[static_cast<size_t>(r * cols / 2)],
                              &scales[static_cast<size_t>(r * cols / 32)]);
    }
  } else if (t.dtype == DType::kF8_E4M3 && ends_with(t.name, "engram.embed.weight")) {
    // Engram table: e4m3 with one ue8m0 scale per row and 32 columns (act_quant's rule).
    if (cols % 32 != 0 || element_count(scale.shape) != rows * cols / 32) {
      return Status::Error(t.name + ": table shape does not match " + scale_name);
    }
    for (int64_t r = 0; r < rows; ++r) {
      act_quant_block32(&values[static_cast<size_t>(r * cols)], cols, &bytes[static_cast<size_t>(r * cols)],
                        &scales[static_cast<size_t>(r * cols / 32)]);
    }
  } else if (t.dtype == DType::kF8_E4M3) {
    // FP8 linear: one power-of-two ue8m0 scale per 32x32 tile, [ceil(rows/32), ceil(cols/32)].
    const int64_t tile_rows = (rows + 31) / 32, tile_cols = (cols + 31) / 32;
    if (element_count(scale.shape) != tile_rows * tile_cols) {
      return Status::Error(t.name + ": FP8 scale " + scale_name + " is not [ceil(out/32), ceil(in/32)]");
    }
    for (int64_t tr = 0; tr < tile_rows; ++tr) {
      for (int64_t tc = 0; tc < tile_cols; ++tc) {
        const int64_t r_end = std::min(rows, (tr + 1) * 32), c_end = std::min(cols, (tc + 1) * 32);
        float amax = 0.0f;
        for (int64_t r = tr * 32; r < r_end; ++r) {
          for (int64_t c = tc * 32; c < c_end; ++c) amax = std::max(amax, std::fabs(values[static_cast<size_t>(r * cols + c)]));
        }
        const uint8_t code = ue8m0_scale_code(amax, 448.0f, 1e-4f);
        scales[static_cast<size_t>(tr * tile_cols + tc)] = code;
        const float inverse = e8m0_to_f32(static_cast<uint8_t>(254 - code));  // exact 1 / 2^(code-127)
        for (int64_t r = tr * 32; r < r_end; ++r) {
          const size_t at = static_cast<size_t>(r * cols + tc * 32);
          encode_e4m3_scaled(&values[at], c_end - tc * 32, inverse, &bytes[at]);
        }
      }
    }
  } else {
    return Status::Error(t.name + ": dtype " + dtype_name(t.dtype) + " is not a quantised weight format");
  }
  pending_scales_[scale_name] = std::move(scales);
  return bytes;
}

Result<std::vector<uint8_t>> WeightGenerator::generate(const ExpectedTensor& t) {
  switch (t.dtype) {
    case DType::kF8_E8M0: {
      auto it = pending_scales_.find(t.name);
      if (it == pending_scales_.end()) {
        // The weight has not been made yet: make it now (its bytes are recomputed when it is asked for).
        const std::string weight_name = t.name.substr(0, t.name.size() - std::strlen(".scale")) + ".weight";
        const auto weight = by_name_.find(weight_name);
        if (!ends_with(t.name, ".scale") || weight == by_name_.end()) {
          return Status::Error(t.name + ": an e8m0 scale without a matching " + weight_name);
        }
        auto made = quantised_weight(*weight->second);
        if (!made.ok()) return made.status();
        it = pending_scales_.find(t.name);
      }
      std::vector<uint8_t> bytes = std::move(it->second);
      pending_scales_.erase(it);
      if (bytes.size() != t.num_bytes()) return Status::Error(t.name + ": scale size mismatch");
      return bytes;
    }
    case DType::kF8_E4M3:
    case DType::kF4:
    case DType::kI8:
    case DType::kU8:
      return quantised_weight(t);
    case DType::kBF16: {
      const std::vector<float> values = draw_values(t, config_, seed_);
      std::vector<uint8_t> bytes(values.size() * 2);
      for (size_t i = 0; i < values.size(); ++i) {
        const uint16_t bits = f32_to_bf16(values[i]);
        bytes[2 * i] = static_cast<uint8_t>(bits & 0xff);
        bytes[2 * i + 1] = static_cast<uint8_t>(bits >> 8);
      }
      return bytes;
    }
    case DType::kF32: {
      const std::vector<float> values = draw_values(t, config_, seed_);
      std::vector<uint8_t> bytes(values.size() * 4);
      std::memcpy(bytes.data(), values.data(), bytes.size());  // little-endian host (x86-64, AArch64)
      return bytes;
    }
    default:
      return Status::Error(t.name + ": make-tiny does not generate dtype " + dtype_name(t.dtype));
  }
}

}  // namespace dsflash::tiny
