// Presets and config.json writers for make-tiny (see tiny_config.h).
#include "tiny/tiny_config.h"

#include <nlohmann/json.hpp>

namespace dsflash::tiny {

namespace {

using ordered_json = nlohmann::ordered_json;

// A double that holds a whole number is written as an integer (the release writes "factor": 16).
ordered_json number(double value) {
  if (value == static_cast<double>(static_cast<int64_t>(value))) return static_cast<int64_t>(value);
  return value;
}

// What every preset shares with the released model (spec/config_v41_flash.json): routing, clamps, norms,
// YaRN, mHC, the Engram n-gram orders and pad id.
ModelConfig released_defaults() {
  ModelConfig c;
  c.n_shared_experts = 1;
  c.score_func = "sqrtsoftplus";
  c.gate_temp = 1.0;
  c.norm_topk_prob = true;
  c.route_scale = 1.5;
  c.swiglu_limit = 10.0;
  c.norm_eps = 1e-20;
  c.compress_rope_theta = 160000.0;
  c.original_seq_len = 65536;
  c.rope_theta = 10000.0;
  c.rope_factor = 16;
  c.beta_fast = 32;
  c.beta_slow = 1;
  c.hc_mult = 4;
  c.hc_sinkhorn_iters = 20;
  c.hc_eps = 1e-6;
  c.engram_max_ngram_size = 4;
  c.engram_pad_id = 2;
  c.dspark_block_size = 5;
  c.max_position_embeddings = 1048576;
  c.dtype = "fp8";
  c.expert_dtype = "fp4";
  c.weight_block_size = 32;
  return c;
}

// goldens/tiny-a/checkpoint/config.json, field for field.
Preset tiny_preset() {
  Preset p;
  p.name = "tiny";
  p.description = "goldens tiny-a shape: 12 layers with every role, Engram on L1 (SWA) and L4 (KV source), 1 DSpark stage";
  ModelConfig c = released_defaults();
  c.vocab_size = 2048;
  c.dim = 128;
  c.moe_inter_dim = 64;
  c.n_layers = 12;
  c.n_mtp_layers = 1;
  c.n_heads = 4;
  c.n_routed_experts = 8;
  c.n_activated_experts = 3;
  c.q_lora_rank = 64;
  c.head_dim = 128;
  c.rope_head_dim = 32;
  c.o_groups = 2;
  c.o_lora_rank = 64;
  c.window_size = 8;
  c.compress_ratios = {0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 0};
  c.kv_source_layers = {2, 4, 6};
  c.index_source_layers = {2, 4, 6, 8, 10};
  c.index_n_heads = 8;
  c.index_head_dim = 64;
  c.index_topk = 8;
  c.candidate_source_layer = 6;
  c.candidate_topk_blocks = 2;
  c.candidate_block_size = 8;
  c.engram_layer_ids = {1, 4};
  c.engram_vocab_size = 300;
  c.engram_n_heads = 2;
  c.engram_head_dim = 32;
  c.dspark_noise_token_id = 2047;
  c.dspark_target_layer_ids = {9, 10, 11};
  c.dspark_markov_rank = 32;
  c.dspark_n_routed_experts = 4;
  c.dspark_n_activated_experts = 1;
  p.config = std::move(c);
  p.max_shard_bytes = 2 << 20;  // several shards, so the index path is exercised
  return p;
}

// Real per-layer widths on 8 layers split 4/4 into CED encoder and decoder (roles in the body); 1 DSpark stage.
Preset wide_preset() {
  Preset p;
  p.name = "wide";
  p.description = "real per-layer widths (dim 5120, 64x512 heads, q_lora 1280, 8x1024 o_groups, MoE 2304) on 8 layers "
                  "split 4/4 into CED encoder/decoder like the released 20/20, 8 experts top-6";
  ModelConfig c = released_defaults();
  c.vocab_size = 4096;
  c.dim = 5120;
  c.moe_inter_dim = 2304;
  // 8 layers in the released roles' proportions, so CED prefill (encoder on every token, decoder only on the
  // window) saves what it saves on the real model (spec/MODEL.md §5): encoder L0 SWA, L1 SWA + Engram, L2 ratio-2
  // KV source (Full) + Engram (like the released L14), L3 Reuse; decoder from the last KV source L4 (ratio-1 KV
  // source, candidate pool), L5 Reuse, L6 Reindex (candidate-restricted), L7 Reuse; then one DSpark layer.
  c.n_layers = 8;
  c.n_mtp_layers = 1;
  c.n_heads = 64;
  c.n_routed_experts = 8;
  c.n_activated_experts = 6;
  c.q_lora_rank = 1280;
  c.head_dim = 512;
  c.rope_head_dim = 64;
  c.o_groups = 8;
  c.o_lora_rank = 1024;
  c.window_size = 128;
  c.compress_ratios = {0, 0, 2, 2, 1, 1, 1, 1, 0};
  c.kv_source_layers = {2, 4};
  c.index_source_layers = {2, 4, 6};
  c.index_n_heads = 32;
  c.index_head_dim = 128;
  c.index_topk = 512;
  c.candidate_source_layer = 4;
  c.candidate_topk_blocks = 2048;
  c.candidate_block_size = 8;
  c.engram_layer_ids = {1, 2};
  c.engram_vocab_size = 1000;
  c.engram_n_heads = 8;
  c.engram_head_dim = 256;
  c.dspark_noise_token_id = 4095;
  c.dspark_target_layer_ids = {5, 6, 7};
  c.dspark_markov_rank = 256;
  c.dspark_n_routed_experts = 4;
  c.dspark_n_activated_experts = 3;
  p.config = std::move(c);
  p.max_shard_bytes = int64_t{1} << 30;
  return p;
}

// The released 40-layer role layout with the real KV-relevant dims; everything else narrow.
Preset real_kv_preset() {
  Preset p;
  p.name = "real-kv";
  p.description = "the released 40 layer roles and KV dims (head_dim 512, index_head_dim 128, window 128): "
                  "890 global KV bytes/token; narrow elsewhere";
  ModelConfig c = released_defaults();
  c.vocab_size = 4096;
  c.dim = 256;
  c.moe_inter_dim = 128;
  c.n_layers = 40;
  c.n_mtp_layers = 3;
  c.n_heads = 2;
  c.n_routed_experts = 4;
  c.n_activated_experts = 2;
  c.q_lora_rank = 64;
  c.head_dim = 512;
  c.rope_head_dim = 64;
  c.o_groups = 2;
  c.o_lora_rank = 64;
  c.window_size = 128;
  c.compress_ratios.assign(2, 0);
  c.compress_ratios.insert(c.compress_ratios.end(), 18, 2);
  c.compress_ratios.insert(c.compress_ratios.end(), 20, 1);
  c.compress_ratios.insert(c.compress_ratios.end(), 3, 0);
  c.kv_source_layers = {2, 8, 14, 20};
  c.index_source_layers = {2, 8, 14, 20, 24, 28, 32, 36};
  c.index_n_heads = 4;
  c.index_head_dim = 128;
  c.index_topk = 512;
  c.candidate_source_layer = 20;
  c.candidate_topk_blocks = 2048;
  c.candidate_block_size = 8;
  c.engram_layer_ids = {1, 14};
  c.engram_vocab_size = 300;
  c.engram_n_heads = 2;
  c.engram_head_dim = 32;
  c.dspark_noise_token_id = 4095;
  c.dspark_target_layer_ids = {37, 38, 39};
  c.dspark_markov_rank = 32;
  c.dspark_n_routed_experts = 4;
  c.dspark_n_activated_experts = 1;
  p.config = std::move(c);
  p.max_shard_bytes = 16 << 20;
  return p;
}

}  // namespace

std::vector<std::string> preset_names() { return {"tiny", "wide", "real-kv"}; }

Result<Preset> preset(const std::string& name) {
  Preset p;
  if (name == "tiny") {
    p = tiny_preset();
  } else if (name == "wide") {
    p = wide_preset();
  } else if (name == "real-kv") {
    p = real_kv_preset();
  } else {
    return Status::Error("unknown make-tiny preset '" + name + "' (known: tiny, wide, real-kv)");
  }
  p.config.derive_roles();
  return p;
}

std::string root_config_json(const ModelConfig& c) {
  ordered_json root;
  root["architectures"] = {"DeepseekV41ForCausalLM"};
  root["model_type"] = "deepseek_v41";
  root["dtype"] = "bfloat16";
  root["bos_token_id"] = c.bos_token_id;
  root["eos_token_id"] = c.eos_token_id;
  root["pad_token_id"] = c.pad_token_id;
  ordered_json quant;
  quant["quant_method"] = c.dtype == "fp8" ? "fp8" : "none";
  quant["activation_scheme"] = "dynamic";
  quant["weight_block_size"] = {c.weight_block_size, c.weight_block_size};
  quant["scale_fmt"] = "ue8m0";
  if (c.expert_dtype.empty()) {
    quant["expert_dtype"] = nullptr;
  } else {
    quant["expert_dtype"] = c.expert_dtype;
  }
  root["quantization_config"] = quant;
  if (c.image_token_id >= 0) root["image_token_id"] = c.image_token_id;

  ordered_json t;
  t["model_type"] = "deepseek_v41_text";
  t["vocab_size"] = c.vocab_size;
  t["hidden_size"] = c.dim;
  t["moe_intermediate_size"] = c.moe_inter_dim;
  t["num_hidden_layers"] = c.n_layers;
  t["num_attention_heads"] = c.n_heads;
  t["num_key_value_heads"] = 1;
  t["head_dim"] = c.head_dim;
  t["qk_rope_head_dim"] = c.rope_head_dim;
  t["q_lora_rank"] = c.q_lora_rank;
  t["o_lora_rank"] = c.o_lora_rank;
  t["o_groups"] = c.o_groups;
  t["hidden_act"] = "silu";
  t["swiglu_limit"] = c.swiglu_limit;
  t["rms_norm_eps"] = c.norm_eps;
  t["attention_bias"] = false;
  t["attention_dropout"] = 0.0;
  t["initializer_range"] = 0.02;
  t["use_cache"] = true;
  t["tie_word_embeddings"] = false;
  t["max_position_embeddings"] = c.max_position_embeddings;
  t["rope_theta"] = c.rope_theta;
  if (c.original_seq_len > 0) {
    ordered_json yarn;
    yarn["rope_type"] = "yarn";
    yarn["factor"] = number(c.rope_factor);
    yarn["beta_fast"] = c.beta_fast;
    yarn["beta_slow"] = c.beta_slow;
    yarn["original_max_position_embeddings"] = c.original_seq_len;
    t["rope_scaling"] = yarn;
  }
  t["num_nextn_predict_layers"] = c.n_mtp_layers;
  t["n_routed_experts"] = c.n_routed_experts;
  t["n_shared_experts"] = c.n_shared_experts;
  t["num_experts_per_tok"] = c.n_activated_experts;
  t["scoring_func"] = c.score_func;
  if (c.gate_temp != 1.0) t["gate_temp"] = c.gate_temp;
  t["norm_topk_prob"] = c.norm_topk_prob;
  t["routed_scaling_factor"] = c.route_scale;
  t["sliding_window"] = c.window_size;
  t["compress_ratios"] = c.compress_ratios;
  t["compress_rope_theta"] = c.compress_rope_theta;
  t["kv_source_layer_ids"] = c.kv_source_layers;
  t["index_source_layer_ids"] = c.index_source_layers;
  t["index_n_heads"] = c.index_n_heads;
  t["index_head_dim"] = c.index_head_dim;
  t["index_topk"] = c.index_topk;
  t["candidate_source_layer_id"] = c.candidate_source_layer;
  t["candidate_topk_blocks"] = c.candidate_topk_blocks;
  t["candidate_block_size"] = c.candidate_block_size;
  t["hc_mult"] = c.hc_mult;
  t["hc_sinkhorn_iters"] = c.hc_sinkhorn_iters;
  t["hc_eps"] = c.hc_eps;
  t["engram_layer_ids"] = c.engram_layer_ids;
  t["engram_num_embeddings"] = c.engram_num_embeddings;
  t["engram_max_ngram_size"] = c.engram_max_ngram_size;
  t["engram_vocab_size"] = c.engram_vocab_size;
  t["engram_n_heads"] = c.engram_n_heads;
  t["engram_head_dim"] = c.engram_head_dim;
  t["engram_pad_token_id"] = c.engram_pad_id;
  t["engram_compressed_vocab_size"] = c.engram_compressed_vocab_size;
  t["dspark_block_size"] = c.dspark_block_size;
  t["dspark_noise_token_id"] = c.dspark_noise_token_id;
  t["dspark_target_layer_ids"] = c.dspark_target_layer_ids;
  t["dspark_markov_rank"] = c.dspark_markov_rank;
  t["dspark_n_routed_experts"] = c.dspark_n_routed_experts;
  t["dspark_num_experts_per_tok"] = c.dspark_n_activated_experts;
  t["topk_method"] = "noaux_tc";
  root["text_config"] = t;
  return root.dump(2) + "\n";
}

std::string flat_config_json(const ModelConfig& c) {
  ordered_json f;
  f["dtype"] = c.dtype;
  if (c.expert_dtype.empty()) {
    f["expert_dtype"] = nullptr;
  } else {
    f["expert_dtype"] = c.expert_dtype;
  }
  f["vocab_size"] = c.vocab_size;
  f["dim"] = c.dim;
  f["moe_inter_dim"] = c.moe_inter_dim;
  f["n_layers"] = c.n_layers;
  f["n_mtp_layers"] = c.n_mtp_layers;
  f["n_heads"] = c.n_heads;
  f["n_routed_experts"] = c.n_routed_experts;
  f["n_shared_experts"] = c.n_shared_experts;
  f["n_activated_experts"] = c.n_activated_experts;
  f["score_func"] = c.score_func;
  f["gate_temp"] = c.gate_temp;
  f["norm_topk_prob"] = c.norm_topk_prob;
  f["route_scale"] = c.route_scale;
  f["swiglu_limit"] = c.swiglu_limit;
  f["q_lora_rank"] = c.q_lora_rank;
  f["head_dim"] = c.head_dim;
  f["rope_head_dim"] = c.rope_head_dim;
  f["norm_eps"] = c.norm_eps;
  f["o_groups"] = c.o_groups;
  f["o_lora_rank"] = c.o_lora_rank;
  f["window_size"] = c.window_size;
  f["compress_ratios"] = c.compress_ratios;
  f["kv_source_layers"] = c.kv_source_layers;
  f["index_source_layers"] = c.index_source_layers;
  f["compress_rope_theta"] = c.compress_rope_theta;
  f["original_seq_len"] = c.original_seq_len;
  f["rope_theta"] = c.rope_theta;
  f["rope_factor"] = number(c.rope_factor);
  f["beta_fast"] = c.beta_fast;
  f["beta_slow"] = c.beta_slow;
  f["index_n_heads"] = c.index_n_heads;
  f["index_head_dim"] = c.index_head_dim;
  f["index_topk"] = c.index_topk;
  f["candidate_source_layer"] = c.candidate_source_layer;
  f["candidate_topk_blocks"] = c.candidate_topk_blocks;
  f["candidate_block_size"] = c.candidate_block_size;
  f["hc_mult"] = c.hc_mult;
  f["hc_sinkhorn_iters"] = c.hc_sinkhorn_iters;
  f["hc_eps"] = c.hc_eps;
  f["engram_layer_ids"] = c.engram_layer_ids;
  f["engram_num_embeddings"] = c.engram_num_embeddings;
  f["engram_max_ngram_size"] = c.engram_max_ngram_size;
  f["engram_vocab_size"] = c.engram_vocab_size;
  f["engram_n_heads"] = c.engram_n_heads;
  f["engram_head_dim"] = c.engram_head_dim;
  f["engram_pad_id"] = c.engram_pad_id;
  f["engram_compressed_vocab_size"] = c.engram_compressed_vocab_size;
  if (c.image_token_id >= 0) f["image_token_id"] = c.image_token_id;
  f["dspark_block_size"] = c.dspark_block_size;
  f["dspark_noise_token_id"] = c.dspark_noise_token_id;
  f["dspark_target_layer_ids"] = c.dspark_target_layer_ids;
  f["dspark_markov_rank"] = c.dspark_markov_rank;
  f["dspark_n_routed_experts"] = c.dspark_n_routed_experts;
  f["dspark_n_activated_experts"] = c.dspark_n_activated_experts;
  return f.dump(2) + "\n";
}

double global_kv_bytes_per_token(const ModelConfig& c) {
  double bytes = 0;
  for (int layer : c.kv_source_layers) {
    const int ratio = c.compress_ratio(layer);
    if (ratio <= 0) continue;
    const double main_entry = static_cast<double>(c.head_dim) / 2 + static_cast<double>(c.head_dim) / 16;
    const double index_entry = static_cast<double>(c.index_head_dim) / 2 + static_cast<double>(c.index_head_dim) / 32;
    bytes += (main_entry + index_entry) / ratio;
  }
  return bytes;
}

}  // namespace dsflash::tiny
