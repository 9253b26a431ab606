// Mixture of experts of one layer (spec/MODEL.md §4.7, model.py Gate / Expert / MoE):
//   s      = sqrt(softplus(x · Wgᵀ))                    fp32, Wg bf16 used in fp32, K-order sums
//   chosen = top-k(s + bias)                            bias only selects; k largest, ties -> lowest index
//   w      = s[chosen] / (Σ s[chosen] + 1e-20) * route_scale
//   expert(x) = w2( bf16( w * silu(min(w1 x, L)) * clamp(w3 x, -L, L) ) )   w1/w3 outputs rounded to bf16
//   y      = Σ_routed (fp32, ascending expert id) + shared(x)  -> bf16
// Routed experts are MXFP4 (or FP8), the shared expert FP8; activations are act_quant'ed before every GEMM.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/function_ref.h"
#include "core/status.h"
#include "io/checkpoint.h"
#include "kernels/linear.h"
#include "model/compute_context.h"
#include "model/grouped_gemm.h"

namespace dsflash {

// One SwiGLU FFN's three linears, FP4 (routed) or FP8 (shared).
struct ExpertWeights {
  bool fp4 = false;
  Fp4Weight w1_fp4, w2_fp4, w3_fp4;
  Fp8Weight w1_fp8, w2_fp8, w3_fp8;
  // MXFP4 w1 and w3 as one tile-major weight, their tiles alternating (repack_fp4_pair_tile_major), made by the
  // load-time copy for kernel tables that read MXFP4 tile-major: one GEMM (one activation preparation, one pass over
  // the pool) gives both. w1_fp4 and w3_fp4 are empty (null bytes) then; gate_up_fp4 is empty otherwise.
  Fp4Weight gate_up_fp4;
};

// Gate output for `num_tokens` tokens: k experts each, in descending biased score (the reference's order).
struct MoeRouting {
  int k = 0;
  std::vector<int32_t> experts;  // [tokens, k]
  std::vector<float> weights;    // [tokens, k] normalised, x route_scale
};

class MoeLayer {
 public:
  // prefix: "layers.{L}.ffn" or "mtp.{S}.ffn"; expert counts from the config for that layer.
  static Result<MoeLayer> bind(const Checkpoint& checkpoint, const std::string& prefix, int layer);

  // x [tokens, dim] bf16 values -> routing.
  void route(const float* x, int64_t num_tokens, const ComputeContext& ctx, MoeRouting* routing) const;
  // The same into experts [tokens, top_k] and weights [tokens, top_k] (scratch from ctx.workspace).
  void route(const float* x, int64_t num_tokens, const ComputeContext& ctx, int32_t* experts, float* weights) const;
  // x [tokens, dim] bf16 values -> out [tokens, dim] bf16 values. out may not alias x.
  // routing_out, when given, receives the gate's choice (for layer tests).
  void forward(const float* x, int64_t num_tokens, const ComputeContext& ctx, float* out,
               MoeRouting* routing_out = nullptr) const;

  // Every FP8 and MXFP4 linear (experts and shared expert), for a load-time rewrite of their bytes.
  void for_each_quantised_linear(FunctionRef<void(Fp8Weight&)> fp8, FunctionRef<void(Fp4Weight&)> fp4) {
    auto visit = [&](ExpertWeights& e) {
      if (e.fp4) {
        for (Fp4Weight* w : {&e.gate_up_fp4, &e.w1_fp4, &e.w2_fp4, &e.w3_fp4})
          if (w->packed != nullptr) fp4(*w);
      } else {
        for (Fp8Weight* w : {&e.w1_fp8, &e.w2_fp8, &e.w3_fp8}) fp8(*w);
      }
    };
    for (ExpertWeights& e : experts_) visit(e);
    if (shared_.w1_fp8.codes != nullptr || shared_.w1_fp4.packed != nullptr) visit(shared_);
  }

  // Every MXFP4 expert (routed ones; the shared expert is FP8), for the load-time pairing of w1 and w3.
  void for_each_fp4_expert(FunctionRef<void(ExpertWeights&)> fn) {
    for (ExpertWeights& e : experts_)
      if (e.fp4) fn(e);
  }

  int num_experts() const { return static_cast<int>(experts_.size()); }
  int top_k() const { return top_k_; }
  // Bytes of weights one token touches: gate + k routed experts + shared expert (decode benchmark).
  int64_t weight_bytes_per_token() const;
  // Of those, the k routed experts' bytes (what a step of several tokens may read more than once over).
  int64_t routed_bytes_per_token() const;

 private:
  // One expert's work in a step: its rows (the token indices routed to it) and its buffers, taken from the step's
  // frame arena by prepare_expert.
  struct ExpertRun {
    const ExpertWeights* expert = nullptr;
    std::span<const int64_t> rows;
    std::span<const float> row_weights;  // empty when not weighted (the shared expert)
    Fp8Activations x;          // the rows' act_quant'ed inputs, gathered: [n, dim]
    float* gate = nullptr;     // w1 x: [n, inter], or with paired weights [n, 2 * inter] holding up too
    float* up = nullptr;       // w3 x
    int64_t gate_up_stride = 0;
    float* hidden = nullptr;   // [n, inter] SwiGLU outputs
    uint8_t* h_codes = nullptr;   // act_quant'ed hidden: [n, inter] e4m3
    uint8_t* h_scales = nullptr;  // [n, inter / 32] ue8m0
    float* out = nullptr;      // w2 h: [n, dim]
    Fp8Activations h(int64_t inter) const { return {h_codes, h_scales, static_cast<int64_t>(rows.size()), inter}; }
  };
  ExpertRun prepare_expert(const ExpertWeights& expert, const uint8_t* codes, const uint8_t* scales,
                           std::span<const int64_t> rows, std::span<const float> row_weights, Arena& frame) const;
  // The expert's gate/up GEMMs (1 paired or 2) into items (room for 2); its down GEMM.
  static int gate_up_items(const ExpertRun& run, GroupedGemmItem* items);
  GroupedGemmItem down_item(const ExpertRun& run) const;
  void swiglu_quant(const ExpertRun& run, const ComputeContext& ctx) const;  // hidden, h
  void add_output(const ExpertRun& run, const ComputeContext& ctx, float* y) const;  // y[rows] += bf16(out)
  // Adds w_e * expert(x rows) for one expert into y.
  void run_expert(const ExpertRun& run, const ComputeContext& ctx, float* y) const;
  // Adds every run's output into y, in the runs' order: their GEMMs as two grouped jobs (model/grouped_gemm.h) and
  // their SwiGLUs as one, where one expert after another runs about four pool jobs each. Same bits.
  void run_grouped(std::span<const ExpertRun> runs, const ComputeContext& ctx, float* y) const;
  // Up to this many expert rows (tokens x (top-k + 1): decode, batched decode, short prefill chunks) the experts run
  // grouped; their buffers, held together, are then at most ~28 MB at V4.1's dims (about 56 KB per row).
  static constexpr int64_t kGroupedMaxRows = 512;

  int64_t dim_ = 0;
  int64_t inter_dim_ = 0;
  int top_k_ = 0;
  float route_scale_ = 1.0f;
  float swiglu_limit_ = 0.0f;
  bool norm_topk_prob_ = true;
  float gate_temp_ = 1.0f;
  enum class ScoreFunc { kSqrtSoftplus, kSigmoid, kSoftmax };
  ScoreFunc score_func_ = ScoreFunc::kSqrtSoftplus;
  Bf16Weight gate_{};
  const float* bias_ = nullptr;  // [experts] selection bias
  std::vector<ExpertWeights> experts_;
  ExpertWeights shared_;
};

}  // namespace dsflash
