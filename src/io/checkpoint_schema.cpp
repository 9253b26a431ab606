// The complete tensor list of a checkpoint for a config (spec/CHECKPOINT.md; model.py constructors).
// On spec/config_v41_flash.json this gives the pinned 96,085 tensors / 510,286,023,000 payload bytes.
#include <algorithm>
#include <string>

#include "io/checkpoint.h"

namespace dsflash {

namespace {

class SchemaBuilder {
 public:
  SchemaBuilder(const ModelConfig& c, const StorageConventions& conv) : c_(c), conv_(conv) {}

  std::vector<ExpectedTensor> build() {
    const int64_t d = c_.dim, V = c_.vocab_size;
    add("embed.weight", DType::kBF16, {V, d});
    add("head.weight", DType::kBF16, {V, d});  // bf16 in the checkpoint, used in fp32
    add("norm.weight", DType::kBF16, {d});
    if (c_.vision_enabled()) vision();
    for (int l = 0; l < c_.n_layers; ++l) block("layers." + std::to_string(l), l);
    for (int s = 0; s < c_.dspark_stages(); ++s) dspark_stage(s);
    return std::move(out_);
  }

 private:
  void add(std::string name, DType dtype, std::vector<int64_t> shape) {
    out_.push_back({std::move(name), dtype, std::move(shape)});
  }

  // A Linear with the checkpoint's default dtype: FP8 weight [out, in] + e8m0 scale per 32x32 block, or bf16.
  void dense(const std::string& p, int64_t out, int64_t in) {
    if (c_.dtype == "fp8") {
      add(p + ".weight", DType::kF8_E4M3, {out, in});
      add(p + ".scale", DType::kF8_E8M0, {(out + 31) / 32, (in + 31) / 32});
    } else {
      add(p + ".weight", DType::kBF16, {out, in});
    }
  }

  // A routed expert Linear: MXFP4 (packed e2m1 + e8m0 scale per 32 along K) when expert_dtype is fp4.
  void expert(const std::string& p, int64_t out, int64_t in) {
    if (c_.expert_dtype != "fp4") {
      dense(p, out, in);
      return;
    }
    if (conv_.packed_experts == DType::kF4) {
      add(p + ".weight", DType::kF4, {out, in});
    } else {
      add(p + ".weight", conv_.packed_experts, {out, in / 2});
    }
    add(p + ".scale", DType::kF8_E8M0, {out, in / 32});
  }

  void vision() {
    const int64_t d = c_.dim, vd = c_.vision_dim, inter = c_.vision_inter_dim;
    const int64_t ds = c_.vision_downsample_ratio, patch = c_.vision_patch_size;
    for (const char* n : {"image_start", "image_end", "image_newline"}) add(n, DType::kBF16, {d});
    add("aligner.w1.weight", DType::kBF16, {d, vd * ds * ds});
    add("aligner.w1.bias", DType::kBF16, {d});
    add("aligner.w2.weight", DType::kBF16, {d, d});
    add("aligner.w2.bias", DType::kBF16, {d});
    add("vision.patch_embed.proj.weight", DType::kBF16, {vd, 3 * patch * patch});
    add("vision.patch_embed.proj.bias", DType::kBF16, {vd});
    add("vision.norm.weight", DType::kBF16, {vd});
    for (int b = 0; b < c_.vision_n_layers; ++b) {
      const std::string p = "vision.blocks." + std::to_string(b);
      add(p + ".attn.wqkv.weight", DType::kBF16, {3 * vd, vd});
      add(p + ".attn.wqkv.bias", DType::kBF16, {3 * vd});
      add(p + ".attn.wo.weight", DType::kBF16, {vd, vd});
      add(p + ".attn.wo.bias", DType::kBF16, {vd});
      add(p + ".mlp.w1.weight", DType::kBF16, {2 * inter, vd});  // gate || up
      add(p + ".mlp.w2.weight", DType::kBF16, {vd, inter});
      add(p + ".norm1.weight", DType::kBF16, {vd});
      add(p + ".norm2.weight", DType::kBF16, {vd});
    }
  }

  void block(const std::string& p, int layer) {
    const int64_t d = c_.dim, hd = c_.head_dim, hc = c_.hc_mult;
    // From the config lists, not c_.roles, so a config without derived roles gives the same list.
    const bool backbone = layer < c_.n_layers;
    const bool kv_source = backbone && std::ranges::count(c_.kv_source_layers, layer) > 0;
    const bool index_source = backbone && std::ranges::count(c_.index_source_layers, layer) > 0;
    const std::string a = p + ".attn";
    add(a + ".attn_sink", DType::kF32, {c_.n_heads});
    add(a + ".kv_norm.weight", DType::kBF16, {hd});
    add(a + ".q_norm.weight", DType::kBF16, {c_.q_lora_rank});
    dense(a + ".wkv", hd, d);
    // wo_a: block-diagonal over o_groups, stored as one [groups*o_lora, heads*head_dim/groups] FP8 linear.
    const int64_t group_in = c_.o_groups > 0 ? c_.n_heads * hd / c_.o_groups : 0;  // guard unvalidated configs
    dense(a + ".wo_a", c_.o_groups * c_.o_lora_rank, group_in);
    dense(a + ".wo_b", d, c_.o_groups * c_.o_lora_rank);
    dense(a + ".wq_a", c_.q_lora_rank, d);
    dense(a + ".wq_b", c_.n_heads * hd, c_.q_lora_rank);
    add(p + ".attn_norm.weight", DType::kBF16, {d});
    if (kv_source) {
      add(a + ".compressor.norm.weight", DType::kBF16, {hd});
      add(a + ".compressor.wkv.weight", DType::kBF16, {hd, d});
      if (c_.compress_ratio(layer) > 1) add(a + ".compressor.wgate.weight", DType::kBF16, {hd, d});
      add(a + ".indexer.k_norm.weight", DType::kBF16, {c_.index_head_dim});
      add(a + ".indexer.wk.weight", DType::kBF16, {c_.index_head_dim, hd});
    }
    if (index_source) {
      add(a + ".indexer.weights_proj.weight", DType::kBF16, {c_.index_n_heads, d});
      dense(a + ".indexer.wq_b", static_cast<int64_t>(c_.index_n_heads) * c_.index_head_dim, c_.q_lora_rank);
    }
    if (backbone && std::ranges::count(c_.engram_layer_ids, layer) > 0) engram(p, layer);
    const std::string f = p + ".ffn";
    const int64_t experts = c_.routed_experts(layer);
    add(f + ".gate.weight", DType::kBF16, {experts, d});
    add(f + ".gate.bias", DType::kF32, {experts});
    if (c_.vision_enabled()) add(f + ".gate.bias_vl", DType::kF32, {experts});
    for (int64_t e = 0; e < experts; ++e) {
      const std::string r = f + ".experts." + std::to_string(e);
      expert(r + ".w1", c_.moe_inter_dim, d);
      expert(r + ".w2", d, c_.moe_inter_dim);
      expert(r + ".w3", c_.moe_inter_dim, d);
    }
    const std::string s = f + ".shared_experts";
    dense(s + ".w1", c_.moe_inter_dim, d);
    dense(s + ".w2", d, c_.moe_inter_dim);
    dense(s + ".w3", c_.moe_inter_dim, d);
    add(p + ".ffn_norm.weight", DType::kBF16, {d});
    const int64_t mix = (2 + hc) * hc;
    for (const char* site : {"attn", "ffn"}) {
      add(p + ".hc_" + site + "_fn", DType::kF32, {mix, hc * d});
      add(p + ".hc_" + site + "_base", DType::kF32, {mix});
      add(p + ".hc_" + site + "_scale", conv_.hc_scale, {3});
    }
  }

  void engram(const std::string& p, int layer) {
    size_t index = 0;
    while (index < c_.engram_layer_ids.size() && c_.engram_layer_ids[index] != layer) ++index;
    const int64_t rows = index < c_.engram_num_embeddings.size() ? c_.engram_num_embeddings[index] : 0;
    const int64_t ehd = c_.engram_head_dim, hc = c_.hc_mult, d = c_.dim;
    const std::string e = p + ".engram";
    // The table stays FP8 whatever the linear dtype: [rows, head_dim] e4m3 + [rows, head_dim/32] e8m0.
    add(e + ".embed.weight", DType::kF8_E4M3, {rows, ehd});
    add(e + ".embed.scale", DType::kF8_E8M0, {rows, ehd / 32});
    add(e + ".q_weight", DType::kBF16, {hc, d});
    add(e + ".k_weight", DType::kBF16, {hc, d});
    const int64_t hash_cols = static_cast<int64_t>(c_.engram_max_ngram_size - 1) * c_.engram_n_heads;
    dense(e + ".wkv", d * (hc + 1), hash_cols * ehd);
  }

  void dspark_stage(int stage) {
    const std::string p = "mtp." + std::to_string(stage);
    const int64_t d = c_.dim, V = c_.vocab_size, rank = c_.dspark_markov_rank;
    block(p, c_.n_layers + stage);
    if (stage == 0) {
      dense(p + ".main_proj", d, d * static_cast<int64_t>(c_.dspark_target_layer_ids.size()));
      add(p + ".main_norm.weight", DType::kBF16, {d});
    }
    if (stage == c_.n_mtp_layers - 1) {
      add(p + ".norm.weight", DType::kBF16, {d});
      add(p + ".markov_head.embed.weight", DType::kBF16, {V, rank});
      add(p + ".markov_head.head.weight", DType::kBF16, {V, rank});
      add(p + ".confidence_head.proj.weight", DType::kBF16, {1, d + rank});
    }
  }

  const ModelConfig& c_;
  const StorageConventions& conv_;
  std::vector<ExpectedTensor> out_;
};

}  // namespace

size_t ExpectedTensor::num_bytes() const {
  int64_t n = 1;
  for (int64_t x : shape) n *= x;
  return dtype_bytes(dtype, n);
}

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& config) {
  return expected_tensors(config, StorageConventions{});
}

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& config, const StorageConventions& conventions) {
  return SchemaBuilder(config, conventions).build();
}

}  // namespace dsflash
