#include "model/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/thread_pool.h"
#include "formats/formats.h"
#include "model/grouped_gemm.h"
#include "model/weight_binding.h"

namespace dsflash {
namespace {

// fn(row, begin, end) over the elements [0, rows * cols) of a row-major [rows, cols] array, in ranges of whole
// `grain` elements on ctx's pool (the pool cuts them into a few chunks per thread), each range cut at row ends
// (begin, end: flat indices within row `row`). For element-wise work whose rows are few (one in decode): the
// threads share a row where its work outweighs a dispatch (grain).
template <class Fn>
void for_each_element_range(const ComputeContext& ctx, int64_t rows, int64_t cols, int64_t grain, const Fn& fn) {
  parallel_rows(ctx, rows * cols, [&](int64_t begin, int64_t end) {
    while (begin < end) {
      const int64_t row = begin / cols, row_end = std::min(end, (row + 1) * cols);
      fn(row, begin, row_end);
      begin = row_end;
    }
  }, grain);
}


Result<ExpertWeights> bind_expert(const Checkpoint& checkpoint, const std::string& prefix, int64_t dim,
                                  int64_t inter, bool fp4) {
  ExpertWeights e;
  e.fp4 = fp4;
  if (fp4) {
    auto w1 = bind_fp4_linear(checkpoint, prefix + ".w1", inter, dim);
    if (!w1.ok()) return w1.status();
    auto w2 = bind_fp4_linear(checkpoint, prefix + ".w2", dim, inter);
    if (!w2.ok()) return w2.status();
    auto w3 = bind_fp4_linear(checkpoint, prefix + ".w3", inter, dim);
    if (!w3.ok()) return w3.status();
    e.w1_fp4 = *w1;
    e.w2_fp4 = *w2;
    e.w3_fp4 = *w3;
  } else {
    auto w1 = bind_fp8_linear(checkpoint, prefix + ".w1", inter, dim);
    if (!w1.ok()) return w1.status();
    auto w2 = bind_fp8_linear(checkpoint, prefix + ".w2", dim, inter);
    if (!w2.ok()) return w2.status();
    auto w3 = bind_fp8_linear(checkpoint, prefix + ".w3", inter, dim);
    if (!w3.ok()) return w3.status();
    e.w1_fp8 = *w1;
    e.w2_fp8 = *w2;
    e.w3_fp8 = *w3;
  }
  return e;
}

int64_t expert_bytes(const ExpertWeights& e, int64_t dim, int64_t inter) {
  const int64_t elements = 3 * dim * inter;
  if (e.fp4) return elements / 2 + elements / 32;
  return elements + 3 * ((dim + 31) / 32) * ((inter + 31) / 32);
}

}  // namespace

Result<MoeLayer> MoeLayer::bind(const Checkpoint& checkpoint, const std::string& prefix, int layer) {
  const ModelConfig& config = checkpoint.config();
  MoeLayer moe;
  moe.dim_ = config.dim;
  moe.inter_dim_ = config.moe_inter_dim;
  moe.top_k_ = config.activated_experts(layer);
  moe.route_scale_ = static_cast<float>(config.route_scale);
  moe.swiglu_limit_ = static_cast<float>(config.swiglu_limit);
  moe.norm_topk_prob_ = config.norm_topk_prob;
  moe.gate_temp_ = static_cast<float>(config.gate_temp);
  const int num_experts = config.routed_experts(layer);
  if (moe.top_k_ <= 0 || moe.top_k_ > num_experts) {
    return Status::Error(prefix + ": activated experts " + std::to_string(moe.top_k_) + " not in [1, " +
                         std::to_string(num_experts) + "]");
  }
  if (config.score_func != "sqrtsoftplus" && config.score_func != "sigmoid" && config.score_func != "softmax") {
    return Status::Error("config score_func \"" + config.score_func + "\" is not supported");
  }
  moe.score_func_ = config.score_func == "sigmoid"   ? ScoreFunc::kSigmoid
                    : config.score_func == "softmax" ? ScoreFunc::kSoftmax
                                                     : ScoreFunc::kSqrtSoftplus;
  if (config.n_shared_experts != 1) {
    return Status::Error("config n_shared_experts = " + std::to_string(config.n_shared_experts) +
                         ", the reference supports exactly 1");
  }
  auto gate = bind_bf16_matrix(checkpoint, prefix + ".gate.weight", num_experts, moe.dim_);
  if (!gate.ok()) return gate.status();
  moe.gate_ = *gate;
  auto bias = bind_f32(checkpoint, prefix + ".gate.bias", {num_experts});
  if (!bias.ok()) return bias.status();
  moe.bias_ = *bias;
  const bool fp4 = config.expert_dtype == "fp4";
  moe.experts_.reserve(static_cast<size_t>(num_experts));
  for (int e = 0; e < num_experts; ++e) {
    auto expert = bind_expert(checkpoint, prefix + ".experts." + std::to_string(e), moe.dim_, moe.inter_dim_, fp4);
    if (!expert.ok()) return expert.status();
    moe.experts_.push_back(*expert);
  }
  auto shared = bind_expert(checkpoint, prefix + ".shared_experts", moe.dim_, moe.inter_dim_, false);
  if (!shared.ok()) return shared.status();
  moe.shared_ = *shared;
  return moe;
}

void MoeLayer::route(const float* x, int64_t num_tokens, const ComputeContext& ctx, MoeRouting* routing) const {
  routing->k = top_k_;
  routing->experts.assign(static_cast<size_t>(num_tokens * top_k_), 0);
  routing->weights.assign(static_cast<size_t>(num_tokens * top_k_), 0.0f);
  route(x, num_tokens, ctx, routing->experts.data(), routing->weights.data());
}

void MoeLayer::route(const float* x, int64_t num_tokens, const ComputeContext& ctx, int32_t* experts,
                     float* weights) const {
  Workspace private_workspace;
  Arena& frame = (ctx.workspace != nullptr ? *ctx.workspace : private_workspace).frame();
  ArenaScope scope(frame);
  const int num_experts = this->num_experts();
  const std::span<float> scores = frame.take<float>(static_cast<size_t>(num_tokens * num_experts));  // [tokens, E]
  {
    ProfileScope profile_scope(ctx.profile, ProfilePhase::kLinear);
    ctx.backend->bf16_gemm(x, num_tokens, gate_, scores.data(), ctx.pool);
  }
  const std::span<float> biased = frame.take<float>(static_cast<size_t>(num_experts));
  for (int64_t t = 0; t < num_tokens; ++t) {
    float* s = scores.data() + t * num_experts;
    for (int e = 0; e < num_experts; ++e) s[e] = s[e] / gate_temp_;
    // softmax / sigmoid / sqrt(softplus) with torch's softplus threshold 20
    if (score_func_ == ScoreFunc::kSoftmax) {
      float max_value = s[0];
      for (int e = 1; e < num_experts; ++e) max_value = std::max(max_value, s[e]);
      float sum = 0.0f;
      for (int e = 0; e < num_experts; ++e) {
        s[e] = std::exp(s[e] - max_value);
        sum += s[e];
      }
      for (int e = 0; e < num_experts; ++e) s[e] = s[e] / sum;
    } else {
      for (int e = 0; e < num_experts; ++e) {
        if (score_func_ == ScoreFunc::kSigmoid) {
          s[e] = 1.0f / (1.0f + std::exp(-s[e]));
        } else {
          const float softplus = s[e] > 20.0f ? s[e] : std::log1p(std::exp(s[e]));
          s[e] = std::sqrt(softplus);
        }
      }
    }
    for (int e = 0; e < num_experts; ++e) biased[static_cast<size_t>(e)] = s[e] + bias_[e];
    int32_t* chosen = experts + t * top_k_;
    float* w = weights + t * top_k_;
    ctx.backend->topk_select(biased.data(), num_experts, top_k_, chosen, nullptr, nullptr);
    for (int i = 0; i < top_k_; ++i) w[i] = s[chosen[i]];
    if (norm_topk_prob_ && top_k_ > 1) {
      float sum = 0.0f;
      for (int i = 0; i < top_k_; ++i) sum += w[i];
      const float den = sum + 1e-20f;
      for (int i = 0; i < top_k_; ++i) w[i] = w[i] / den;
    }
    for (int i = 0; i < top_k_; ++i) w[i] = w[i] * route_scale_;
  }
}

MoeLayer::ExpertRun MoeLayer::prepare_expert(const ExpertWeights& expert, const uint8_t* codes,
                                             const uint8_t* scales, std::span<const int64_t> rows,
                                             std::span<const float> row_weights, Arena& frame) const {
  const int64_t n = static_cast<int64_t>(rows.size());
  const int64_t blocks = dim_ / 32;
  ExpertRun run;
  run.expert = &expert;
  run.rows = rows;
  run.row_weights = row_weights;
  // gather the routed rows' FP8 activations: codes [n, dim], scales [n, dim/32]
  const std::span<uint8_t> row_codes = frame.take<uint8_t>(static_cast<size_t>(n * dim_));
  const std::span<uint8_t> row_scales = frame.take<uint8_t>(static_cast<size_t>(n * blocks));
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(row_codes.data() + i * dim_, codes + rows[static_cast<size_t>(i)] * dim_, static_cast<size_t>(dim_));
    std::memcpy(row_scales.data() + i * blocks, scales + rows[static_cast<size_t>(i)] * blocks,
                static_cast<size_t>(blocks));
  }
  run.x = Fp8Activations{row_codes.data(), row_scales.data(), n, dim_};
  // w1 x and w3 x: [n, inter] each, or [n, 2 * inter] from the paired weight (gate_up_fp4: w1's output c at
  // fp4_pair_column(c), w3's 16 columns further).
  const bool paired = expert.gate_up_fp4.packed != nullptr;
  run.gate = frame.take<float>(static_cast<size_t>(2 * n * inter_dim_)).data();
  run.up = paired ? run.gate + kTileMajorOutputs : run.gate + n * inter_dim_;
  run.gate_up_stride = paired ? 2 * inter_dim_ : inter_dim_;  // row stride of gate and up
  run.hidden = frame.take<float>(static_cast<size_t>(n * inter_dim_)).data();
  run.h_codes = frame.take<uint8_t>(static_cast<size_t>(n * inter_dim_)).data();
  run.h_scales = frame.take<uint8_t>(static_cast<size_t>(n * inter_dim_ / 32)).data();
  run.out = frame.take<float>(static_cast<size_t>(n * dim_)).data();  // [n, dim]
  return run;
}

int MoeLayer::gate_up_items(const ExpertRun& run, GroupedGemmItem* items) {
  const ExpertWeights& e = *run.expert;
  if (e.gate_up_fp4.packed != nullptr) {
    items[0] = GroupedGemmItem{run.x, nullptr, &e.gate_up_fp4, run.gate};
    return 1;
  }
  if (e.fp4) {
    items[0] = GroupedGemmItem{run.x, nullptr, &e.w1_fp4, run.gate};
    items[1] = GroupedGemmItem{run.x, nullptr, &e.w3_fp4, run.up};
  } else {
    items[0] = GroupedGemmItem{run.x, &e.w1_fp8, nullptr, run.gate};
    items[1] = GroupedGemmItem{run.x, &e.w3_fp8, nullptr, run.up};
  }
  return 2;
}

GroupedGemmItem MoeLayer::down_item(const ExpertRun& run) const {
  const ExpertWeights& e = *run.expert;
  return GroupedGemmItem{run.h(inter_dim_), e.fp4 ? nullptr : &e.w2_fp8, e.fp4 ? &e.w2_fp4 : nullptr, run.out};
}

void MoeLayer::swiglu_quant(const ExpertRun& run, const ComputeContext& ctx) const {
  // hidden [n, inter] = SwiGLU (kernels/swiglu.h: bf16 GEMM outputs, fp32 with the clamps and the routed
  // weight, bf16). Element-wise, so any split over the pool gives the same bits: ranges of elements, so that one
  // token's row (decode) is shared by the threads too.
  const bool paired = run.expert->gate_up_fp4.packed != nullptr;
  const int64_t n = static_cast<int64_t>(run.rows.size());
  for_each_element_range(ctx, n, inter_dim_, 64, [&](int64_t i, int64_t begin, int64_t end) {
    const float w = run.row_weights.empty() ? 1.0f : run.row_weights[static_cast<size_t>(i)];
    // Columns [c, c_end) of row i; paired, gate and up are contiguous within one 16-output tile only.
    for (int64_t c = begin - i * inter_dim_, c_end = end - i * inter_dim_; c < c_end;) {
      const int64_t span = paired ? std::min(c_end, (c / kTileMajorOutputs + 1) * kTileMajorOutputs) - c : c_end - c;
      const int64_t at = i * run.gate_up_stride + (paired ? fp4_pair_column(c) : c);
      ctx.backend->swiglu(&run.gate[at], &run.up[at], span, swiglu_limit_, w, &run.hidden[i * inter_dim_ + c]);
      c += span;
    }
  });
  ctx.backend->act_quant(run.hidden, n, inter_dim_, run.h_codes, run.h_scales, ctx.pool);
}

void MoeLayer::add_output(const ExpertRun& run, const ComputeContext& ctx, float* y) const {
  // Each token appears once among an expert's rows, so the rows' sums into y are independent (element-wise).
  // One row (5120) stays on one thread: ~4 us there, ~8 us split over two (the dispatch outweighs it).
  const int64_t n = static_cast<int64_t>(run.rows.size());
  for_each_element_range(ctx, n, dim_, 8192, [&](int64_t i, int64_t begin, int64_t end) {
    float* dst = y + run.rows[static_cast<size_t>(i)] * dim_;
    const float* src = run.out + i * dim_;
    for (int64_t c = begin - i * dim_; c < end - i * dim_; ++c) dst[c] += round_to_bf16(src[c]);
  });
}

void MoeLayer::run_expert(const ExpertRun& run, const ComputeContext& ctx, float* y) const {
  // One GEMM per call (grouped_gemm of one item: the backend's call on the whole weight).
  GroupedGemmItem items[2];
  for (int i = 0, count = gate_up_items(run, items); i < count; ++i) grouped_gemm({&items[i], 1}, ctx);
  swiglu_quant(run, ctx);
  const GroupedGemmItem down = down_item(run);
  grouped_gemm({&down, 1}, ctx);
  add_output(run, ctx, y);
}

void MoeLayer::run_grouped(std::span<const ExpertRun> runs, const ComputeContext& ctx, float* y) const {
  Arena& frame = ctx.workspace->frame();
  ArenaScope scope(frame);
  const std::span<GroupedGemmItem> items = frame.take<GroupedGemmItem>(2 * runs.size());
  size_t count = 0;
  for (const ExpertRun& run : runs) count += static_cast<size_t>(gate_up_items(run, items.data() + count));
  grouped_gemm(items.first(count), ctx);
  // One expert's SwiGLU and quantisation per item: inside the job their pool calls run inline.
  parallel_rows(ctx, static_cast<int64_t>(runs.size()), [&](int64_t begin, int64_t end) {
    for (int64_t e = begin; e < end; ++e) swiglu_quant(runs[static_cast<size_t>(e)], ctx);
  });
  for (size_t e = 0; e < runs.size(); ++e) items[e] = down_item(runs[e]);
  grouped_gemm(items.first(runs.size()), ctx);
  for (const ExpertRun& run : runs) add_output(run, ctx, y);  // in the runs' order: the reference's sum order
}

void MoeLayer::forward(const float* x, int64_t num_tokens, const ComputeContext& ctx, float* out,
                       MoeRouting* routing_out) const {
  if (ctx.workspace == nullptr) {
    Workspace private_workspace;
    ComputeContext with_workspace = ctx;
    with_workspace.workspace = &private_workspace;
    forward(x, num_tokens, with_workspace, out, routing_out);
    return;
  }
  Arena& frame = ctx.workspace->frame();
  ArenaScope scope(frame);
  const size_t routed = static_cast<size_t>(num_tokens * top_k_);
  const std::span<int32_t> chosen = frame.take<int32_t>(routed);  // [tokens, top_k]
  const std::span<float> weights = frame.take<float>(routed);     // [tokens, top_k]
  route(x, num_tokens, ctx, chosen.data(), weights.data());
  if (routing_out != nullptr) {
    routing_out->k = top_k_;
    routing_out->experts.assign(chosen.begin(), chosen.end());
    routing_out->weights.assign(weights.begin(), weights.end());
  }

  // One act_quant of the input serves every expert and the shared expert (it is per row, per 32).
  const std::span<uint8_t> codes = frame.take<uint8_t>(static_cast<size_t>(num_tokens * dim_));        // e4m3
  const std::span<uint8_t> scales = frame.take<uint8_t>(static_cast<size_t>(num_tokens * dim_ / 32));  // ue8m0
  ctx.backend->act_quant(x, num_tokens, dim_, codes.data(), scales.data(), ctx.pool);

  const std::span<float> y = frame.take_filled<float>(static_cast<size_t>(num_tokens * dim_), 0.0f);  // fp32 sum
  // Routed experts in ascending id, as the reference loops (the fp32 sum order of y); each expert's rows in token
  // order: a counting sort of the (token, slot) pairs by expert into rows / row_weights [tokens * top_k].
  const size_t num_experts = experts_.size();
  const std::span<int64_t> first = frame.take_filled<int64_t>(num_experts + 1, 0);  // expert e: [first[e], first[e+1])
  for (int32_t e : chosen) ++first[static_cast<size_t>(e) + 1];
  for (size_t e = 0; e < num_experts; ++e) first[e + 1] += first[e];
  const std::span<int64_t> fill = frame.take<int64_t>(num_experts);
  std::copy(first.begin(), first.begin() + static_cast<std::ptrdiff_t>(num_experts), fill.begin());
  const std::span<int64_t> rows = frame.take<int64_t>(routed);
  const std::span<float> row_weights = frame.take<float>(routed);
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int i = 0; i < top_k_; ++i) {
      const size_t slot = static_cast<size_t>(t * top_k_ + i);
      const auto e = static_cast<size_t>(chosen[slot]);
      const auto at = static_cast<size_t>(fill[e]++);
      rows[at] = t;
      row_weights[at] = weights[slot];
    }
  }
  // Decode-sized steps on several threads run every expert grouped (run_grouped), their buffers taken together;
  // others run one expert after another, each GEMM split over the pool on its own and each expert's buffers given
  // back before the next (a prefill's are large). Either way the routed experts in ascending id, then the shared one.
  const bool grouped =
      ctx.pool != nullptr && ctx.pool->num_threads() > 1 && num_tokens * (top_k_ + 1) <= kGroupedMaxRows;
  const std::span<ExpertRun> runs = frame.take<ExpertRun>(grouped ? num_experts + 1 : 0);
  size_t num_runs = 0;
  for (size_t e = 0; e < num_experts; ++e) {
    const auto begin = static_cast<size_t>(first[e]), end = static_cast<size_t>(first[e + 1]);
    if (begin == end) continue;
    if (ctx.profile != nullptr) ctx.profile->routed_expert_bytes += expert_bytes(experts_[e], dim_, inter_dim_);
    const std::span<const int64_t> expert_rows = std::span<const int64_t>(rows).subspan(begin, end - begin);
    const std::span<const float> expert_weights = std::span<const float>(row_weights).subspan(begin, end - begin);
    if (grouped) {
      runs[num_runs++] = prepare_expert(experts_[e], codes.data(), scales.data(), expert_rows, expert_weights, frame);
      continue;
    }
    ArenaScope expert_scope(frame);
    run_expert(prepare_expert(experts_[e], codes.data(), scales.data(), expert_rows, expert_weights, frame), ctx,
               y.data());
  }
  const std::span<int64_t> all_rows = frame.take<int64_t>(static_cast<size_t>(num_tokens));
  for (int64_t t = 0; t < num_tokens; ++t) all_rows[static_cast<size_t>(t)] = t;
  const ExpertRun shared = prepare_expert(shared_, codes.data(), scales.data(), all_rows, {}, frame);
  if (grouped) {
    runs[num_runs++] = shared;
    run_grouped(runs.first(num_runs), ctx, y.data());
  } else {
    run_expert(shared, ctx, y.data());
  }
  for (int64_t i = 0; i < num_tokens * dim_; ++i) out[i] = round_to_bf16(y[static_cast<size_t>(i)]);
}

int64_t MoeLayer::routed_bytes_per_token() const {
  return experts_.empty() ? 0 : top_k_ * expert_bytes(experts_.front(), dim_, inter_dim_);
}

int64_t MoeLayer::weight_bytes_per_token() const {
  int64_t bytes = gate_.out * gate_.in * 2 + gate_.out * 4;
  bytes += routed_bytes_per_token();
  bytes += expert_bytes(shared_, dim_, inter_dim_);
  return bytes;
}

}  // namespace dsflash
