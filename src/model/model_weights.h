// Every weight the backbone forward pass reads, bound from a Checkpoint (views onto the mapped shards; only
// the tiny fp32 hc scales and the Engram hasher tables are owned). Binding checks every dtype and shape, so a
// checkpoint missing a tensor the config needs fails here with the tensor's name, never during a forward.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "core/huge_page_buffer.h"
#include "core/status.h"
#include "io/checkpoint.h"
#include "kernels/hc.h"
#include "kernels/linear.h"
#include "model/attention.h"
#include "model/engram.h"
#include "model/engram_hash.h"
#include "model/moe.h"

namespace dsflash {

// One block (spec/MODEL.md §4.2): mHC sites, norms, attention, MoE, and Engram before it where configured.
struct BlockWeights {
  int layer = 0;
  HcSiteWeights hc_attn;
  HcSiteWeights hc_ffn;
  std::vector<float> hc_attn_scale;  // [3] fp32 (stored F32 or BF16)
  std::vector<float> hc_ffn_scale;   // [3]
  const uint16_t* attn_norm = nullptr;  // [dim] bf16
  const uint16_t* ffn_norm = nullptr;   // [dim] bf16
  std::unique_ptr<AttentionLayer> attention;
  std::optional<MoeLayer> moe;
  std::optional<Engram> engram;
};

// Binds one block's weights: layers.{layer}.* for layer < n_layers, mtp.{layer - n_layers}.* for the DSpark
// stages (model/dspark.h). `hasher` is needed where the layer has Engram (backbone only).
Result<BlockWeights> bind_block_weights(const Checkpoint& checkpoint, int layer, const NgramHasher* hasher);

// Copies the FP8 / MXFP4 linears of `blocks` (attention, MoE, Engram) and `extra` whose format is in `formats` and
// whose shapes allow it (with their FP4 scales) into tile-major order (kernels/linear.h) in `buffer`, a huge-page
// allocation of their total size, gives the file pages of the originals back (Checkpoint::release) and points the
// weights at the copies. The copies run on `pool` (nullptr: this thread), split over NUMA nodes as the kernels read
// them. An MXFP4 expert's w1 and w3 become one weight, their tiles alternating (ExpertWeights::gate_up_fp4), which
// one GEMM runs. Returns how many linears are tile-major now. Used by ModelWeights::to_tile_major and by the DSpark
// stages.
Result<int64_t> copy_to_tile_major(std::vector<BlockWeights>& blocks, const std::vector<Fp8Weight*>& extra,
                                   TileMajorFormats formats, const Checkpoint& checkpoint, ThreadPool* pool,
                                   HugePageBuffer& buffer);

class ModelWeights {
 public:
  // Binds the backbone (embed, layers 0..n_layers-1, norm, head) and, when the config has Engram layers,
  // the hasher built from the checkpoint's tokenizer.json. DSpark stages are bound separately (DSpark::bind,
  // model/dspark.h; not needed for target-model decoding).
  static Result<std::unique_ptr<ModelWeights>> bind(const Checkpoint& checkpoint);

  const ModelConfig& config() const { return config_; }
  const HcShape& hc_shape() const { return hc_shape_; }
  const Bf16Weight& embed() const { return embed_; }
  const Bf16Weight& head() const { return head_; }
  const uint16_t* final_norm() const { return final_norm_; }
  const std::vector<BlockWeights>& blocks() const { return blocks_; }
  const NgramHasher* engram_hasher() const { return hasher_ ? &*hasher_ : nullptr; }

  // Copies every linear of `formats` (FP8, MXFP4) whose shape allows it (with its FP4 scales) into tile-major order
  // (kernels/linear.h) in a huge-page buffer of its own, gives the file pages of the originals back
  // (Checkpoint::release) and points the weights at the copies: for kernel tables that prefer that order
  // (LinearKernels::prefers_tile_major). Every table reads both orders (the same bits where block sums are exact).
  // The copies run on `pool` (nullptr: this thread); on a real checkpoint they are hundreds of GB. Returns how many
  // linears are tile-major now.
  Result<int64_t> to_tile_major(const Checkpoint& checkpoint, TileMajorFormats formats, ThreadPool* pool);
  // The rewritten weights' memory (empty when none), e.g. to lock it in RAM.
  const HugePageBuffer& tile_major_weights() const { return tile_major_weights_; }

  // Bytes of weights one decode step reads (embedding row, hc, norms, attention, gate + routed top-k + shared
  // expert, head); attention counted by its tensor sizes.
  int64_t decode_weight_bytes() const { return decode_weight_bytes_; }
  // Of those, the routed experts' (top-k per layer): a batched step reads the dense rest once and each distinct
  // routed expert once (StepProfile::routed_expert_bytes).
  int64_t decode_routed_bytes() const { return decode_routed_bytes_; }

 private:
  ModelConfig config_;
  HcShape hc_shape_;
  Bf16Weight embed_{};
  Bf16Weight head_{};
  const uint16_t* final_norm_ = nullptr;
  std::vector<BlockWeights> blocks_;
  std::optional<NgramHasher> hasher_;
  int64_t decode_weight_bytes_ = 0;
  int64_t decode_routed_bytes_ = 0;
  HugePageBuffer tile_major_weights_;  // [Σ tile-major linears' bytes], 64-byte aligned each
};

}  // namespace dsflash
