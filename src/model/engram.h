// The Engram module of one layer (spec/MODEL.md §4.8; official model.py `Engram`,
// `ParallelEngramEmbedding`): hash ids -> dequantised FP8 table rows -> wkv (FP8 linear) -> one key per
// hc stream + one shared value -> per-stream sigmoid gate -> streams += gate * value.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/function_ref.h"
#include "core/status.h"
#include "io/checkpoint.h"
#include "kernels/linear.h"
#include "model/compute_context.h"
#include "model/engram_hash.h"

namespace dsflash {

class Engram {
 public:
  // Finds a tensor by its checkpoint name (nullptr: missing). Lets tests bind from a bare SafetensorsFile.
  using TensorLookup = std::function<const TensorView*(const std::string&)>;

  // Binds layers.{layer}.engram.{embed.weight, embed.scale, wkv.weight, wkv.scale, q_weight, k_weight}:
  //   embed.weight F8_E4M3 [rows, head_dim], embed.scale F8_E8M0 [rows, head_dim/32],
  //   wkv.weight F8_E4M3 [(hc+1)*dim, C*head_dim], wkv.scale F8_E8M0 [ceil/32, ceil/32],
  //   q_weight, k_weight BF16 [hc, dim].  rows = layout.num_rows of this layer.
  // Errors name the tensor, the expected and found dtype/shape, and `origin`.
  static Result<Engram> bind(const Checkpoint& checkpoint, int layer, const EngramHashLayout& layout);
  static Result<Engram> bind(const TensorLookup& find, const std::string& origin, const ModelConfig& config,
                             int layer, const EngramHashLayout& layout);

  int layer() const { return layer_; }
  int layer_hash_index() const { return layer_hash_index_; }  // this layer's block in the hasher output

  // streams: [num_tokens, hc, dim] fp32 holding bf16 values, updated in place (the block's input streams).
  // hash_ids: the NgramHasher output for these tokens, [num_tokens, num_engram_layers, C]; this layer reads
  //   its own block. Ids outside [0, rows) read a zero row (as ParallelEngramEmbedding masks them).
  // dead: optional [num_tokens], nonzero = image-span token: gate 0, the stream passes through unchanged.
  // Numerics (model.py): rows = e4m3 * ue8m0 in fp32 -> bf16; wkv = act_quant + FP8 GEMM -> bf16;
  //   per stream k: dot = Σ_d h·(q_w·k_w)·key_k (fp32) · rsqrt(mean h² + eps) · rsqrt(mean key_k² + eps) · dim^-½;
  //   gate = sigmoid(sign(dot)·sqrt(max(|dot|, 1e-6))); h = bf16(h + gate·value) (fp32 arithmetic).
  Status forward(float* streams, int64_t num_tokens, const int64_t* hash_ids, const ComputeContext& ctx,
                 const uint8_t* dead = nullptr) const;

  // Its FP8 linear (wkv), for a load-time rewrite of its bytes (ModelWeights::to_tile_major).
  void for_each_fp8_linear(FunctionRef<void(Fp8Weight&)> fn) {
    if (wkv_.codes != nullptr) fn(wkv_);
  }

 private:
  // forward() on at most a block of tokens (bounded scratch).
  void forward_block(float* streams, int64_t num_tokens, const int64_t* hash_ids, const ComputeContext& ctx,
                     const uint8_t* dead) const;

  int layer_ = 0;
  int layer_hash_index_ = 0;
  int num_hash_layers_ = 0;
  int columns_ = 0;      // C = (max_ngram-1) * n_heads
  int64_t head_dim_ = 0; // engram_head_dim
  int64_t dim_ = 0;
  int hc_ = 0;
  double eps_ = 0;
  int64_t rows_ = 0;
  const uint8_t* table_codes_ = nullptr;   // [rows, head_dim] e4m3
  const uint8_t* table_scales_ = nullptr;  // [rows, head_dim/32] ue8m0
  Fp8Weight wkv_;                          // [(hc+1)*dim, C*head_dim]
  std::vector<float> gate_weight_;         // [hc, dim] fp32 q_weight * k_weight
};

}  // namespace dsflash
