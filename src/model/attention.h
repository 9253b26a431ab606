// Attention of one layer (spec/MODEL.md §4.3-§4.6): q path, the single latent K=V into the FP8 window ring,
// the compressor (KV sources), the indexer (index sources) with CSA2 sharing, sparse attention with the sink,
// inverse RoPE, grouped wo_a then wo_b.
//
// Contract between the "model-attn" engineer (who implements this file, attention.cpp, and the per-sequence
// state in attention_state.h) and the "model" engineer (who runs the layer loop and calls forward()).
#pragma once

#include <cstdint>
#include <memory>

#include "core/status.h"
#include "io/checkpoint.h"
#include "model/compute_context.h"

namespace dsflash {

// Per-sequence attention state of all layers: window rings (FP8 e4m3 + ue8m0, 528 B/row at head_dim 512),
// compressed main KV (FP4 e2m1 + e4m3 scales per 16) and indexer keys (MXFP4) of each KV source, compressor
// tails (fp32 pending half-group). Defined in model/attention_state.h.
class AttentionState;

// Cross-layer CSA2 sharing inside one forward call (latest KV source, latest published top-k indices,
// the candidate pool of the candidate source). Reset at the start of every forward call; layers run in order.
class Csa2Shared;

// Optional recorder of intermediates (index scores/top-k, candidate masks, compressor latents) for layer tests.
struct AttentionTrace;

class AttentionLayer {
 public:
  static Result<std::unique_ptr<AttentionLayer>> bind(const Checkpoint& checkpoint, int layer);
  virtual ~AttentionLayer() = default;

  // x: attention input [num_tokens, dim] (bf16 values in fp32) at absolute positions start_pos..start_pos+num_tokens-1.
  // out: [num_tokens, dim] (bf16 values). Updates `state` (this layer's window ring; on KV sources the compressed
  // caches and compressor tail) and `shared`.
  // compressor_input: for the CED decoder KV source, the compressor reads the same x; kept explicit for replay plans.
  virtual Status forward(const float* x, int64_t num_tokens, int64_t start_pos, AttentionState& state,
                         Csa2Shared& shared, const ComputeContext& ctx, float* out,
                         AttentionTrace* trace = nullptr) = 0;
};

}  // namespace dsflash
