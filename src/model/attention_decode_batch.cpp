// AttentionLayer::forward_decode_batch (declared in attention.h): the single-token decode path of forward()
// for several sequences at once, with the projections batched (rows = batch) so that a decode step reads each
// attention weight once. Per-row numerics are those of forward() with num_tokens = 1 (the linear kernels'
// rows are independent), which the engine tests check bit for bit. Owned by the engine engineer.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "formats/formats.h"
#include "formats/quant.h"
#include "kernels/rmsnorm.h"
#include "kernels/sparse_attention.h"
#include "model/attention.h"
#include "model/attention_state.h"
#include "model/linear_ops.h"

namespace dsflash {
Status AttentionLayer::forward_decode_batch(const float* x, int64_t batch, const int64_t* positions,
                                            AttentionState* const* states, Csa2Shared* const* shared,
                                            const ComputeContext& ctx, float* out) {
  const std::string where = "attention layer " + std::to_string(layer_) + " batched decode";
  if (x == nullptr || out == nullptr || positions == nullptr || states == nullptr || shared == nullptr || batch <= 0) {
    return Status::Error(where + ": bad arguments");
  }
  if (ctx.linear == nullptr) return Status::Error(where + ": ComputeContext has no linear kernels");
  for (int64_t b = 0; b < batch; ++b) {
    const AttentionState* state = states[b];
    if (state == nullptr || shared[b] == nullptr || positions[b] <= 0) {
      return Status::Error(where + ": row " + std::to_string(b) + " has no state or a position <= 0 (decode follows a prefill)");
    }
    if (layer_ >= state->num_layers() || state->window(layer_).window() != window_ ||
        state->window(layer_).head_dim() != head_dim_) {
      return Status::Error(where + ": row " + std::to_string(b) + ": the attention state was not made for this model");
    }
    if (shared[b]->start_pos != positions[b] || shared[b]->num_tokens != 1) {
      return Status::Error(where + ": row " + std::to_string(b) + ": Csa2Shared was not reset for this step");
    }
  }
  const int64_t d = head_dim_, h_n = heads_, rd = rope_dim_;
  const size_t half = static_cast<size_t>(rd / 2);
  std::vector<float> cos_t(static_cast<size_t>(batch) * half), sin_t(static_cast<size_t>(batch) * half);
  for (int64_t b = 0; b < batch; ++b) rope_.angles(positions[b], &cos_t[b * half], &sin_t[b * half]);

  // q path for all rows: qr = q_norm(wq_a(x)) [B, q_lora]; q = rope(wq_b(qr)) [B, H, D].
  std::vector<float> qr(static_cast<size_t>(batch * q_lora_));
  fp8_linear_bf16(x, batch, wq_a_, qr.data(), ctx);
  rmsnorm_bf16(qr.data(), batch, q_lora_, q_norm_, eps_, qr.data(), ctx.pool);
  std::vector<float> q(static_cast<size_t>(batch * h_n * d));
  fp8_linear_bf16(qr.data(), batch, wq_b_, q.data(), ctx);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < h_n; ++h) rope_.rotate(&q[static_cast<size_t>((b * h_n + h) * d + d - rd)], &cos_t[b * half], &sin_t[b * half]);
  }
  // The latent K = V for all rows, FP8 window-ring bytes.
  std::vector<float> kv(static_cast<size_t>(batch * d));
  fp8_linear_bf16(x, batch, wkv_, kv.data(), ctx);
  rmsnorm_bf16(kv.data(), batch, d, kv_norm_, eps_, kv.data(), ctx.pool);
  for (int64_t b = 0; b < batch; ++b) rope_.rotate(&kv[static_cast<size_t>(b * d + d - rd)], &cos_t[b * half], &sin_t[b * half]);
  std::vector<uint8_t> kv_codes(static_cast<size_t>(batch * d)), kv_scales(static_cast<size_t>(batch * d / 32));
  act_quant_block32(kv.data(), batch * d, kv_codes.data(), kv_scales.data());

  // Per sequence: ring write, window list (ring order, oldest first), compressed branch, sparse attention.
  const SparseAttentionKernels& attention = ctx.reference ? reference_sparse_attention() : best_sparse_attention();
  const float scale = static_cast<float>(std::pow(static_cast<double>(d), -0.5));
  const int64_t win = window_;
  std::vector<float> o(static_cast<size_t>(batch * h_n * d));
  std::vector<float> window_rows(static_cast<size_t>(win * d));
  std::vector<float> compressed_rows;
  std::vector<const float*> list;
  for (int64_t b = 0; b < batch; ++b) {
    AttentionState& state = *states[b];
    Csa2Shared& sh = *shared[b];
    const int64_t pos = positions[b];
    const std::string row_where = where + ", row " + std::to_string(b);
    // Sparse attention (the row gathers and the kernel); the compressor and the indexer open their own phases.
    ProfileScope attention_scope(ctx.profile, ProfilePhase::kAttention);
    WindowRing& ring = state.window(layer_);
    ring.write(pos, &kv_codes[static_cast<size_t>(b * d)], &kv_scales[static_cast<size_t>(b * d / 32)]);
    list.assign(static_cast<size_t>(win), nullptr);
    const int64_t oldest = pos % win + 1;
    for (int64_t i = 0; i < win; ++i) {
      const int slot = static_cast<int>((oldest + i) % win);
      const int64_t p = ring.slot_position(slot);
      if (p < 0 || p > pos || p <= pos - win || p < sh.window_floor) continue;
      float* row = &window_rows[static_cast<size_t>(i * d)];
      ring.read_slot(slot, row);
      list[static_cast<size_t>(i)] = row;
    }
    const float* x_row = x + b * dim_;
    const CompressedKv* compressed = nullptr;
    int64_t topk_width = 0;
    if (ratio_ > 0) {
      const int64_t compress_len = (pos + 1) / ratio_;
      if (kv_source_) {
        const CompressedKv* own = state.compressed(layer_);
        if (own == nullptr || own->num_entries() != pos / ratio_) {
          return Status::Error(row_where + ": compressed KV holds " + std::to_string(own ? own->num_entries() : -1) +
                               " entries at position " + std::to_string(pos) + ", expected " + std::to_string(pos / ratio_));
        }
        ProfileScope compressor_scope(ctx.profile, ProfilePhase::kOther);
        std::vector<float> latents;
        std::vector<int64_t> groups;
        Status st = run_compressor(x_row, 1, pos, state, ctx, &latents, &groups);
        if (!st.ok()) return st.with_context(row_where);
        st = store_entries(latents, groups, state, ctx);
        if (!st.ok()) return st.with_context(row_where);
      }
      compressed = state.compressed(kv_source_layer_);
      if (compressed == nullptr || compressed->num_entries() < compress_len) {
        return Status::Error(row_where + ": KV source L" + std::to_string(kv_source_layer_) + " holds " +
                             std::to_string(compressed ? compressed->num_entries() : 0) + " entries, " +
                             std::to_string(compress_len) + " are visible");
      }
      if (index_source_) {
        if (compress_len == 0) {
          sh.topk_layer = layer_;
          sh.topk_width = 0;
          sh.topk.clear();
        } else {
          Status st = run_indexer(x_row, &qr[static_cast<size_t>(b * q_lora_)], 1, pos, state, sh, ctx, nullptr);
          if (!st.ok()) return st.with_context(row_where);
        }
      } else if (sh.topk_layer != index_source_layer_ || static_cast<int64_t>(sh.topk.size()) != sh.topk_width) {
        return Status::Error(row_where + ": Reuse layer needs the top-k of index source L" +
                             std::to_string(index_source_layer_) + " from this step (found L" +
                             std::to_string(sh.topk_layer) + ")");
      }
      topk_width = sh.topk_width;
    }
    compressed_rows.assign(static_cast<size_t>(topk_width * d), 0.0f);
    list.resize(static_cast<size_t>(win + topk_width), nullptr);
    for (int64_t i = 0; i < topk_width; ++i) {
      const int32_t p = sh.topk[static_cast<size_t>(i)];
      if (p < 0) continue;
      compressed->read_kv(p, &compressed_rows[static_cast<size_t>(i * d)]);
      list[static_cast<size_t>(win + i)] = &compressed_rows[static_cast<size_t>(i * d)];
    }
    SparseAttentionArgs args;
    args.q = &q[static_cast<size_t>(b * h_n * d)];
    args.rows = list.data();
    args.sink = sink_.data();
    args.out = &o[static_cast<size_t>(b * h_n * d)];
    args.num_queries = 1;
    args.num_entries = win + topk_width;
    args.heads = static_cast<int>(h_n);
    args.dim = d;
    args.scale = scale;
    attention.attend(args, ctx.pool);
  }

  // Inverse query rotation, grouped wo_a (bf16) and wo_b (FP8), all rows at once.
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < h_n; ++h) {
      rope_.rotate(&o[static_cast<size_t>((b * h_n + h) * d + d - rd)], &cos_t[b * half], &sin_t[b * half], true);
    }
  }
  const int64_t group_in = h_n * d / groups_;
  std::vector<float> group_x(static_cast<size_t>(batch * group_in)), group_y(static_cast<size_t>(batch * o_lora_));
  std::vector<float> oa(static_cast<size_t>(batch * groups_ * o_lora_));
  for (int g = 0; g < groups_; ++g) {
    for (int64_t b = 0; b < batch; ++b) {
      std::memcpy(&group_x[static_cast<size_t>(b * group_in)], &o[static_cast<size_t>(b * h_n * d + g * group_in)],
                  static_cast<size_t>(group_in) * sizeof(float));
    }
    const Bf16Weight w{wo_a_.data() + static_cast<size_t>(g) * static_cast<size_t>(o_lora_ * group_in), o_lora_, group_in};
    {
      ProfileScope scope(ctx.profile, ProfilePhase::kLinear);
      ctx.linear->bf16_gemm(group_x.data(), batch, w, group_y.data(), ctx.pool);
    }
    round_to_bf16_inplace(group_y.data(), batch * o_lora_);
    for (int64_t b = 0; b < batch; ++b) {
      std::memcpy(&oa[static_cast<size_t>(b * groups_ * o_lora_ + g * o_lora_)], &group_y[static_cast<size_t>(b * o_lora_)],
                  static_cast<size_t>(o_lora_) * sizeof(float));
    }
  }
  fp8_linear_bf16(oa.data(), batch, wo_b_, out, ctx);
  return Status::Ok();
}

}  // namespace dsflash
