#include "model/model_weights.h"

#include <algorithm>
#include <map>
#include <set>

#include "formats/formats.h"
#include "model/weight_binding.h"
#include "tokenizer/engram_token_map.h"

namespace dsflash {
namespace {

// hc_*_scale: F32 [3] in the spec's schema, BF16 [3] in the golden checkpoints; the reference uses fp32.
Result<std::vector<float>> bind_small_f32(const Checkpoint& checkpoint, const std::string& name, int64_t n) {
  auto found = checkpoint.get(name);
  if (!found.ok()) return found.status();
  const TensorView* t = *found;
  if (t->shape != std::vector<int64_t>{n} || (t->dtype != DType::kF32 && t->dtype != DType::kBF16)) {
    return Status::Error("tensor " + name + " in " + t->file + ": expected F32 or BF16 [" + std::to_string(n) + "]");
  }
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    out[static_cast<size_t>(i)] = t->dtype == DType::kF32 ? t->as<float>()[i] : bf16_to_f32(t->as<uint16_t>()[i]);
  }
  return out;
}

// Attention and Engram tensors read per decode step: all of layers.L.attn.*, and of layers.L.engram.* the wkv
// projection, the gate weights and one table row per hash column (not the whole table).
int64_t attention_and_engram_bytes(const Checkpoint& checkpoint, int layer, int64_t engram_row_bytes) {
  const std::string attn = "layers." + std::to_string(layer) + ".attn.";
  const std::string engram = "layers." + std::to_string(layer) + ".engram.";
  int64_t bytes = 0;
  for (const TensorView* t : checkpoint.all_tensors()) {
    if (t->name.compare(0, attn.size(), attn) == 0) {
      bytes += static_cast<int64_t>(t->num_bytes);
    } else if (t->name.compare(0, engram.size(), engram) == 0) {
      if (t->name == engram + "embed.weight") {
        bytes += engram_row_bytes;
      } else if (t->name != engram + "embed.scale") {
        bytes += static_cast<int64_t>(t->num_bytes);
      }
    }
  }
  return bytes;
}

}  // namespace

Result<BlockWeights> bind_block_weights(const Checkpoint& checkpoint, int layer, const NgramHasher* hasher) {
  const ModelConfig& config = checkpoint.config();
  if (layer < 0 || layer >= config.total_layers()) {
    return Status::Error("block " + std::to_string(layer) + ": no such layer (model has " +
                         std::to_string(config.total_layers()) + ")");
  }
  const bool backbone = layer < config.n_layers;
  const int mix = (2 + config.hc_mult) * config.hc_mult;
  const int64_t hc_dim = config.hc_mult * config.dim;
  BlockWeights b;
  b.layer = layer;
  const std::string p = backbone ? "layers." + std::to_string(layer) + "." : "mtp." + std::to_string(layer - config.n_layers) + ".";
  for (auto [site, scale, name] : {std::tuple{&b.hc_attn, &b.hc_attn_scale, std::string("hc_attn")},
                                   std::tuple{&b.hc_ffn, &b.hc_ffn_scale, std::string("hc_ffn")}}) {
    auto fn = bind_f32(checkpoint, p + name + "_fn", {mix, hc_dim});
    if (!fn.ok()) return fn.status();
    auto base = bind_f32(checkpoint, p + name + "_base", {mix});
    if (!base.ok()) return base.status();
    auto s = bind_small_f32(checkpoint, p + name + "_scale", 3);
    if (!s.ok()) return s.status();
    *scale = std::move(*s);
    *site = HcSiteWeights{*fn, *base, scale->data()};  // the vector's buffer survives moves of the block
  }
  auto attn_norm = bind_bf16_vector(checkpoint, p + "attn_norm.weight", config.dim);
  if (!attn_norm.ok()) return attn_norm.status();
  b.attn_norm = *attn_norm;
  auto ffn_norm = bind_bf16_vector(checkpoint, p + "ffn_norm.weight", config.dim);
  if (!ffn_norm.ok()) return ffn_norm.status();
  b.ffn_norm = *ffn_norm;
  auto attention = AttentionLayer::bind(checkpoint, layer);
  if (!attention.ok()) return attention.status();
  b.attention = std::move(*attention);
  auto moe = MoeLayer::bind(checkpoint, p + "ffn", layer);
  if (!moe.ok()) return moe.status();
  b.moe.emplace(std::move(*moe));
  if (backbone && config.roles.at(static_cast<size_t>(layer)).engram) {
    if (hasher == nullptr) return Status::Error("layer " + std::to_string(layer) + " has Engram but no hasher");
    auto engram = Engram::bind(checkpoint, layer, hasher->layout());
    if (!engram.ok()) return engram.status();
    b.engram.emplace(std::move(*engram));
  }
  return b;
}

namespace {
// Every FP8 / MXFP4 linear of the blocks (attention, MoE and Engram), then the extra FP8 ones.
void for_each_quantised_linear(std::vector<BlockWeights>& blocks, const std::vector<Fp8Weight*>& extra,
                               FunctionRef<void(Fp8Weight&)> fp8, FunctionRef<void(Fp4Weight&)> fp4) {
  for (BlockWeights& block : blocks) {
    if (block.attention) block.attention->for_each_fp8_linear(fp8);
    if (block.moe) block.moe->for_each_quantised_linear(fp8, fp4);
    if (block.engram) block.engram->for_each_fp8_linear(fp8);
  }
  for (Fp8Weight* w : extra)
    if (w->codes != nullptr) fp8(*w);
}
}  // namespace

Result<int64_t> ModelWeights::to_tile_major(const Checkpoint& checkpoint, TileMajorFormats formats,
                                            ThreadPool* pool) {
  return copy_to_tile_major(blocks_, {}, formats, checkpoint, pool, tile_major_weights_);
}

Result<int64_t> copy_to_tile_major(std::vector<BlockWeights>& blocks, const std::vector<Fp8Weight*>& extra,
                                   TileMajorFormats formats, const Checkpoint& checkpoint, ThreadPool* pool,
                                   HugePageBuffer& buffer) {
  // Pass 1: the distinct eligible tensors (one bound twice is copied once), each at a cache-line offset.
  struct Source {
    int64_t offset = 0;  // in the buffer
    bool copied = false;
    bool nan_codes = true;  // FP8: whether the copy found a NaN code
    int64_t plain_offset = -1;  // FP8: its plain_code_blocks flags, in the buffer
  };
  std::map<const uint8_t*, Source> sources;  // by the checkpoint bytes
  int64_t total = 0;
  // row_bytes: in (FP8 codes), in / 2 (packed FP4) or in / 32 (FP4 scales, which move with their codes).
  auto plan = [&](const uint8_t* bytes, int64_t out, int64_t in, int64_t row_bytes, bool tile_major) {
    if (tile_major || bytes == nullptr || !tile_major_possible(out, in) || sources.contains(bytes)) return;
    sources[bytes].offset = total;
    total += (out * row_bytes + 63) / 64 * 64;
  };
  // MXFP4 experts' w1 and w3 (same shape, same activations): one paired copy each (repack_fp4_pair_tile_major),
  // codes then scales, planned under w1's bytes; neither is planned alone below.
  auto pairable = [](const ExpertWeights& e) {
    return e.w1_fp4.packed != nullptr && e.w3_fp4.packed != nullptr && !e.w1_fp4.tile_major &&
           !e.w3_fp4.tile_major && e.w1_fp4.out == e.w3_fp4.out && e.w1_fp4.in == e.w3_fp4.in &&
           tile_major_possible(e.w1_fp4.out, e.w1_fp4.in);
  };
  auto for_each_pair = [&](FunctionRef<void(ExpertWeights&)> fn) {
    if (!formats.fp4) return;
    for (BlockWeights& block : blocks)
      if (block.moe) block.moe->for_each_fp4_expert([&](ExpertWeights& e) {
          if (pairable(e)) fn(e);
        });
  };
  std::map<const uint8_t*, int64_t> pair_scales;  // w1's bytes -> the pair's scales offset
  std::set<const uint8_t*> paired;                 // w1's and w3's bytes
  for_each_pair([&](ExpertWeights& e) {
    const Fp4Weight& w1 = e.w1_fp4;
    if (sources.contains(w1.packed)) return;  // an expert bound twice
    sources[w1.packed].offset = total;
    total += (2 * w1.out * (w1.in / 2) + 63) / 64 * 64;
    pair_scales[w1.packed] = total;
    total += (2 * w1.out * (w1.in / 32) + 63) / 64 * 64;
    paired.insert(w1.packed);
    paired.insert(e.w3_fp4.packed);
  });
  for_each_quantised_linear(
      blocks, extra,
      [&](Fp8Weight& w) {
        if (!formats.fp8 || sources.contains(w.codes)) return;
        plan(w.codes, w.out, w.in, w.in, w.tile_major);
        if (!sources.contains(w.codes)) return;
        sources[w.codes].plain_offset = total;  // then the flags of its blocks
        total += (fp8_plain_code_block_count(w.out, w.in) + 63) / 64 * 64;
      },
      [&](Fp4Weight& w) {
        if (!formats.fp4 || paired.contains(w.packed)) return;
        plan(w.packed, w.out, w.in, w.in / 2, w.tile_major);
        if (sources.contains(w.packed)) plan(w.scales, w.out, w.in, w.in / 32, w.tile_major);  // scales move too
      });
  if (total == 0) return int64_t{0};
  auto allocated = HugePageBuffer::allocate(static_cast<size_t>(total));
  if (!allocated.ok()) return allocated.status();
  buffer = std::move(*allocated);
  // Pass 2: copy each tensor into its place, give its file pages back, point the weights at the copy.
  // copy(from, to, source) writes the tensor's copy, once per tensor. Returns its Source, nullptr when it is not
  // to be copied.
  auto rewrite = [&](const uint8_t*& bytes, int64_t out, int64_t row_bytes, auto copy) -> const Source* {
    auto source = sources.find(bytes);
    if (source == sources.end()) return nullptr;
    uint8_t* to = buffer.data() + source->second.offset;
    if (!source->second.copied) {
      copy(bytes, to, source->second);
      checkpoint.release(bytes, static_cast<size_t>(out * row_bytes));
      source->second.copied = true;
    }
    bytes = to;
    return &source->second;
  };
  int64_t rewritten = 0;
  for_each_pair([&](ExpertWeights& e) {
    Fp4Weight& w1 = e.w1_fp4;
    Fp4Weight& w3 = e.w3_fp4;
    Source& source = sources.at(w1.packed);
    uint8_t* packed = buffer.data() + source.offset;
    uint8_t* scales = buffer.data() + pair_scales.at(w1.packed);
    if (!source.copied) {
      repack_fp4_pair_tile_major(w1, w3, packed, scales, pool);
      for (const Fp4Weight* w : {&w1, &w3}) {
        checkpoint.release(w->packed, static_cast<size_t>(w->out * (w->in / 2)));
        checkpoint.release(w->scales, static_cast<size_t>(w->out * (w->in / 32)));
      }
      source.copied = true;
    }
    e.gate_up_fp4 = Fp4Weight{packed, scales, 2 * w1.out, w1.in, true};
    w1 = Fp4Weight{nullptr, nullptr, w1.out, w1.in, false};
    w3 = Fp4Weight{nullptr, nullptr, w3.out, w3.in, false};
    rewritten += 2;
  });
  for_each_quantised_linear(
      blocks, extra,
      [&](Fp8Weight& w) {
        if (w.tile_major) return;
        const Source* source = rewrite(w.codes, w.out, w.in, [&](const uint8_t* from, uint8_t* to, Source& s) {
          s.nan_codes = repack_fp8_tile_major(from, w.out, w.in, to, pool, buffer.data() + s.plain_offset);
        });
        if (source == nullptr) return;
        w.tile_major = true;
        w.may_hold_nan = source->nan_codes;
        w.plain_code_blocks = buffer.data() + source->plain_offset;
        ++rewritten;
      },
      [&](Fp4Weight& w) {
        if (w.tile_major) return;
        auto packed = [&](const uint8_t* from, uint8_t* to, Source&) {
          repack_fp4_tile_major(from, w.out, w.in, to, pool);
        };
        if (rewrite(w.packed, w.out, w.in / 2, packed) == nullptr) return;
        auto scales = [&](const uint8_t* from, uint8_t* to, Source&) {
          repack_fp4_scales_tile_major(from, w.out, w.in, to, pool);
        };
        rewrite(w.scales, w.out, w.in / 32, scales);  // planned with its codes
        w.tile_major = true;
        ++rewritten;
      });
  return rewritten;
}

Result<std::unique_ptr<ModelWeights>> ModelWeights::bind(const Checkpoint& checkpoint) {
  auto weights = std::unique_ptr<ModelWeights>(new ModelWeights());
  ModelWeights& w = *weights;
  w.config_ = checkpoint.config();
  const ModelConfig& config = w.config_;
  const int64_t dim = config.dim;
  w.hc_shape_.hc = config.hc_mult;
  w.hc_shape_.dim = dim;
  w.hc_shape_.sinkhorn_iters = config.hc_sinkhorn_iters;
  w.hc_shape_.hc_eps = static_cast<float>(config.hc_eps);
  w.hc_shape_.norm_eps = static_cast<float>(config.norm_eps);
  const int mix = w.hc_shape_.mix_count();
  const int64_t hc_dim = config.hc_mult * dim;

  auto embed = bind_bf16_matrix(checkpoint, "embed.weight", config.vocab_size, dim);
  if (!embed.ok()) return embed.status();
  w.embed_ = *embed;
  auto head = bind_bf16_matrix(checkpoint, "head.weight", config.vocab_size, dim);
  if (!head.ok()) return head.status();
  w.head_ = *head;
  auto norm = bind_bf16_vector(checkpoint, "norm.weight", dim);
  if (!norm.ok()) return norm.status();
  w.final_norm_ = *norm;

  if (!config.engram_layer_ids.empty()) {
    const std::string tokenizer = checkpoint.dir() + "/tokenizer.json";
    auto map = EngramTokenMap::from_tokenizer_json(tokenizer, config.vocab_size);
    if (!map.ok()) return map.status().with_context("Engram token map");
    auto hasher = NgramHasher::create(config, map->ids(), map->compressed_vocab_size());
    if (!hasher.ok()) return hasher.status().with_context("Engram hasher from " + tokenizer);
    w.hasher_.emplace(std::move(*hasher));
  }

  int64_t bytes = dim * 2 /* embedding row */ + config.vocab_size * dim * 2 /* head */ + dim * 2;
  w.blocks_.reserve(static_cast<size_t>(config.n_layers));
  for (int layer = 0; layer < config.n_layers; ++layer) {
    auto block = bind_block_weights(checkpoint, layer, w.engram_hasher());
    if (!block.ok()) return block.status();
    w.blocks_.push_back(std::move(*block));
    // Engram: (max_ngram-1) * n_heads rows of head_dim e4m3 + head_dim/32 scales per token.
    const int64_t engram_rows = static_cast<int64_t>(std::max(config.engram_max_ngram_size - 1, 0)) * config.engram_n_heads;
    const int64_t engram_row_bytes = engram_rows * (config.engram_head_dim + config.engram_head_dim / 32);
    bytes += 2 * static_cast<int64_t>(mix) * hc_dim * 4 + w.blocks_.back().moe->weight_bytes_per_token() +
             attention_and_engram_bytes(checkpoint, layer, engram_row_bytes);
    w.decode_routed_bytes_ += w.blocks_.back().moe->routed_bytes_per_token();
  }
  w.decode_weight_bytes_ = bytes;
  return weights;
}

}  // namespace dsflash
