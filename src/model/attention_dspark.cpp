// Attention of the DSpark stages (spec/MODEL.md §4.10; model.py DSparkAttention.forward), step by step with the
// reference's rounding points: the stages' window rings hold only rows computed from main_x (the projection of the
// main model's hidden states), and a draft block of queries attends to the ring plus the block itself
// (non-causal). Same projections, RoPE table (rope_theta, no YaRN: ratio 0) and kernels as AttentionLayer::forward.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "formats/formats.h"
#include "formats/quant.h"
#include "kernels/sparse_attention.h"
#include "model/attention.h"
#include "model/csa2.h"
#include "model/linear_ops.h"

namespace dsflash {
namespace {

// Rows of a call and, per row, the RoPE angles of its absolute position [rows, rope_dim / 2].
struct RowAngles {
  std::vector<float> cos, sin;
};

Status check_segments(const std::string& where, const DSparkAttentionSegment* segments, int64_t num_segments,
                      int layer, int window, int64_t head_dim, int64_t* rows) {
  if (segments == nullptr || num_segments <= 0) return Status::Error(where + ": no segments");
  *rows = 0;
  for (int64_t i = 0; i < num_segments; ++i) {
    const DSparkAttentionSegment& seg = segments[i];
    const std::string seg_where = where + ", segment " + std::to_string(i);
    if (seg.state == nullptr || seg.num_rows <= 0 || seg.first_position < 0) {
      return Status::Error(seg_where + ": bad arguments (num_rows " + std::to_string(seg.num_rows) +
                           ", first_position " + std::to_string(seg.first_position) + ")");
    }
    if (layer >= seg.state->num_layers() || seg.state->window(layer).window() != window ||
        seg.state->window(layer).head_dim() != head_dim) {
      return Status::Error(seg_where + ": the sequence state has no window ring for this DSpark stage");
    }
    *rows += seg.num_rows;
  }
  return Status::Ok();
}

}  // namespace

Status AttentionLayer::dspark_write_context(const float* main_x, const DSparkAttentionSegment* segments,
                                            int64_t num_segments, const ComputeContext& ctx) const {
  const std::string where = "DSpark attention layer " + std::to_string(layer_);
  if (ratio_ != 0) return Status::Error(where + ": not a window-only layer");
  if (main_x == nullptr || ctx.backend == nullptr) return Status::Error(where + ": bad arguments");
  int64_t rows = 0;
  Status st = check_segments(where, segments, num_segments, layer_, window_, head_dim_, &rows);
  if (!st.ok()) return st;
  const int64_t d = head_dim_, rd = rope_dim_;
  // main_kv = act_quant(rope(kv_norm(wkv(main_x)))) [rows, D], RoPE at the row's own position.
  std::vector<float> kv(static_cast<size_t>(rows * d));
  fp8_linear_bf16(main_x, rows, wkv_, kv.data(), ctx);
  ctx.backend->rmsnorm_bf16(kv.data(), rows, d, kv_norm_, eps_, kv.data(), ctx.pool);
  std::vector<float> cos(static_cast<size_t>(rd / 2)), sin(static_cast<size_t>(rd / 2));
  for (int64_t i = 0, row = 0; i < num_segments; ++i) {
    for (int64_t t = 0; t < segments[i].num_rows; ++t, ++row) {
      rope_.angles(segments[i].first_position + t, cos.data(), sin.data());
      rope_.rotate(*ctx.backend, &kv[static_cast<size_t>(row * d + d - rd)], 1, d, cos.data(), sin.data());
    }
  }
  std::vector<uint8_t> codes(static_cast<size_t>(rows * d)), scales(static_cast<size_t>(rows * d / 32));
  ctx.backend->act_quant(kv.data(), rows, d, codes.data(), scales.data(), ctx.pool);
  for (int64_t i = 0, row = 0; i < num_segments; ++i) {
    WindowRing& ring = segments[i].state->window(layer_);
    for (int64_t t = 0; t < segments[i].num_rows; ++t, ++row) {
      ring.write(segments[i].first_position + t, &codes[static_cast<size_t>(row * d)],
                 &scales[static_cast<size_t>(row * d / 32)]);
    }
  }
  return Status::Ok();
}

Status AttentionLayer::dspark_attend_block(const float* x, const DSparkAttentionSegment* segments,
                                           int64_t num_segments, const ComputeContext& ctx, float* out) const {
  const std::string where = "DSpark attention layer " + std::to_string(layer_);
  if (ratio_ != 0) return Status::Error(where + ": not a window-only layer");
  if (x == nullptr || out == nullptr || ctx.backend == nullptr) return Status::Error(where + ": bad arguments");
  int64_t t_n = 0;
  Status st = check_segments(where, segments, num_segments, layer_, window_, head_dim_, &t_n);
  if (!st.ok()) return st;
  const int64_t d = head_dim_, h_n = heads_, rd = rope_dim_;
  const size_t half = static_cast<size_t>(rd / 2);
  RowAngles angles;
  angles.cos.resize(static_cast<size_t>(t_n) * half);
  angles.sin.resize(static_cast<size_t>(t_n) * half);
  for (int64_t i = 0, row = 0; i < num_segments; ++i) {
    for (int64_t t = 0; t < segments[i].num_rows; ++t, ++row) {
      rope_.angles(segments[i].first_position + t, &angles.cos[row * half], &angles.sin[row * half]);
    }
  }
  // q = rope(wq_b(q_norm(wq_a(x)))) [rows, H, D].
  std::vector<float> qr(static_cast<size_t>(t_n * q_lora_));
  fp8_linear_bf16(x, t_n, wq_a_, qr.data(), ctx);
  ctx.backend->rmsnorm_bf16(qr.data(), t_n, q_lora_, q_norm_, eps_, qr.data(), ctx.pool);
  std::vector<float> q(static_cast<size_t>(t_n * h_n * d));
  fp8_linear_bf16(qr.data(), t_n, wq_b_, q.data(), ctx);
  for (int64_t t = 0; t < t_n; ++t) {
    rope_.rotate(*ctx.backend, &q[static_cast<size_t>(t * h_n * d + d - rd)], h_n, d, &angles.cos[t * half],
                 &angles.sin[t * half]);
  }
  // The block's own K = V rows: FP8(rope(kv_norm(wkv(x)))) dequantised (fake-quantised as in model.py).
  std::vector<float> kv(static_cast<size_t>(t_n * d));
  fp8_linear_bf16(x, t_n, wkv_, kv.data(), ctx);
  ctx.backend->rmsnorm_bf16(kv.data(), t_n, d, kv_norm_, eps_, kv.data(), ctx.pool);
  for (int64_t t = 0; t < t_n; ++t) {
    rope_.rotate(*ctx.backend, &kv[static_cast<size_t>(t * d + d - rd)], 1, d, &angles.cos[t * half],
                 &angles.sin[t * half]);
  }
  {
    std::vector<uint8_t> codes(static_cast<size_t>(t_n * d)), scales(static_cast<size_t>(t_n * d / 32));
    ctx.backend->act_quant(kv.data(), t_n, d, codes.data(), scales.data(), ctx.pool);
    dequant_e4m3_ue8m0(codes.data(), scales.data(), t_n * d, 32, kv.data());
  }

  // Per segment: [ring slots 0 .. min(W, e) - 1 ; block rows] (model.py get_dspark_topk_idxs), the same list for
  // every query of the block.
  std::vector<float> o(static_cast<size_t>(t_n * h_n * d));
  const float scale = static_cast<float>(std::pow(static_cast<double>(d), -0.5));
  std::vector<float> ring_rows;
  std::vector<const float*> list;
  for (int64_t i = 0, row = 0; i < num_segments; ++i) {
    const DSparkAttentionSegment& seg = segments[i];
    const WindowRing& ring = seg.state->window(layer_);
    const int64_t e = seg.first_position;
    const int64_t slots = std::min<int64_t>(window_, e);
    const int64_t entries = slots + seg.num_rows;
    ring_rows.resize(static_cast<size_t>(slots * d));
    list.assign(static_cast<size_t>(seg.num_rows * entries), nullptr);
    for (int64_t s = 0; s < slots; ++s) {
      const int64_t pos = ring.slot_position(static_cast<int>(s));
      if (pos < e - window_ || pos >= e) continue;  // empty, or not a context row of this block
      ring.read_slot(static_cast<int>(s), &ring_rows[static_cast<size_t>(s * d)], ctx.backend->dequant_window_row);
      for (int64_t t = 0; t < seg.num_rows; ++t) list[static_cast<size_t>(t * entries + s)] = &ring_rows[static_cast<size_t>(s * d)];
    }
    for (int64_t t = 0; t < seg.num_rows; ++t) {
      for (int64_t j = 0; j < seg.num_rows; ++j) {
        list[static_cast<size_t>(t * entries + slots + j)] = &kv[static_cast<size_t>((row + j) * d)];
      }
    }
    SparseAttentionArgs args;
    args.q = &q[static_cast<size_t>(row * h_n * d)];
    args.rows = list.data();
    args.sink = sink_.data();
    args.out = &o[static_cast<size_t>(row * h_n * d)];
    args.num_queries = seg.num_rows;
    args.num_entries = entries;
    args.heads = static_cast<int>(h_n);
    args.dim = d;
    args.scale = scale;
    {
      ProfileScope profile_scope(ctx.profile, ProfilePhase::kAttention);
      ctx.backend->sparse_attention(args, ctx.pool);
    }
    row += seg.num_rows;
  }

  // Inverse RoPE at the query positions, grouped wo_a (bf16 einsum, bf16 output), wo_b (FP8).
  project_output(o.data(), t_n, angles.cos.data(), angles.sin.data(), ctx, out);
  return Status::Ok();
}

}  // namespace dsflash
