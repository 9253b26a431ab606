// The compressed branch of attention (spec/MODEL.md §4.4-§4.5), AttentionLayer's members that follow model.py's
// Compressor and Indexer step by step: the projections forward() runs over all rows of a call, the compressor and
// the compressed-entry store of KV sources, the indexer's scores, candidate pool and top-k of index sources, and
// the per-segment branch that ties them together. The rest of the layer is in attention.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "core/thread_pool.h"
#include "formats/formats.h"
#include "formats/quant.h"
#include "kernels/index_score.h"
#include "kernels/torch_exp.h"
#include "model/attention.h"
#include "model/csa2.h"
#include "model/linear_ops.h"

namespace dsflash {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();
constexpr int64_t kKeyBlock = 256;   // indexer keys per kernel call, at least (the call prepares q once per call)

// Indexer scores of a tile of tile_n queries (q [tile_n, heads, dim], weights [tile_n, heads]) against `count` stored
// key rows of `source`: key c is the source's entry columns[c] (columns nullptr: entry c); scores[t * stride + c].
// Blocks of keys split over the pool: kKeyBlock keys, or more (up to 16x, in steps of 16) on long rows so the
// kernel's per-call preparation of q is spread over more keys while every thread still gets >= 4 blocks. Keys are
// scored independently, so the blocking never changes a score.
void score_key_rows(const CompressedKv& source, const int32_t* columns, int64_t count, const float* q,
                    const float* weights, int64_t tile_n, int heads, int64_t dim, float* scores, int64_t stride,
                    const ComputeContext& ctx) {
  const int64_t threads = ctx.pool != nullptr ? ctx.pool->num_threads() : 1;
  const int64_t key_block = std::clamp<int64_t>((count / (4 * threads) + 15) / 16 * 16, kKeyBlock, 16 * kKeyBlock);
  auto score_blocks = [&](int64_t kb_begin, int64_t kb_end, int thread) {
    ThreadScratch scratch(ctx.pool, thread);
    const std::span<const uint8_t*> key_rows = scratch.take<const uint8_t*>(static_cast<size_t>(key_block));
    for (int64_t kb = kb_begin; kb < kb_end; ++kb) {
      const int64_t c0 = kb * key_block, c1 = std::min(count, c0 + key_block);
      if (columns != nullptr) {
        for (int64_t c = c0; c < c1; ++c) key_rows[static_cast<size_t>(c - c0)] = source.index_key_row(columns[c]);
      } else {
        source.index_key_rows(c0, c1 - c0, key_rows.data());
      }
      IndexScoreRowsArgs args;
      args.q = q;
      args.weights = weights;
      args.key_rows = key_rows.data();
      args.scores = scores + c0;
      args.num_queries = tile_n;
      args.num_keys = c1 - c0;
      args.score_stride = stride;
      args.heads = heads;
      args.dim = dim;
      args.scratch = &scratch.arena();
      ctx.backend->index_scores_rows(args);
    }
  };
  const int64_t key_blocks = (count + key_block - 1) / key_block;
  if (ctx.pool != nullptr && key_blocks > 1) {
    ctx.pool->parallel_for(key_blocks, score_blocks);
  } else {
    score_blocks(0, key_blocks, 0);
  }
}

// The entries j < width in the candidate pool of some query of a tile (masks [tile_n, width] bytes, nonzero =
// pooled), ascending, into columns [width]; returns their count. 64 entries at a time, OR-ed over the tile, so the
// mostly empty pools of a long context cost one pass over their bytes.
int64_t pooled_columns(const uint8_t* masks, int64_t tile_n, int64_t width, int32_t* columns) {
  constexpr int64_t kSpan = 64;
  int64_t count = 0;
  for (int64_t j0 = 0; j0 < width; j0 += kSpan) {
    const int64_t n = std::min(kSpan, width - j0);
    uint8_t any[kSpan] = {};
    for (int64_t t = 0; t < tile_n; ++t) {
      const uint8_t* mask = masks + t * width + j0;
      for (int64_t j = 0; j < n; ++j) any[j] |= mask[j];
    }
    uint64_t words[kSpan / 8];
    std::memcpy(words, any, sizeof(words));
    uint64_t seen = 0;
    for (uint64_t w : words) seen |= w;
    if (seen == 0) continue;
    for (int64_t j = 0; j < n; ++j) {
      if (any[j] != 0) columns[count++] = static_cast<int32_t>(j0 + j);
    }
  }
  return count;
}

// out [blocks]: the maximum of each block of `block` scores of row [width] (the last block ragged), from -inf with
// std::max (a NaN score never wins). Ranges of blocks split over the pool when it is given (each block's maximum is
// its own, so any split gives the same values).
void block_maxima(const float* row, int64_t width, int64_t block, int64_t blocks, float* out, ThreadPool* pool) {
  auto run = [&](int64_t b_begin, int64_t b_end, int) {
    for (int64_t b = b_begin; b < b_end; ++b) {
      const int64_t j0 = b * block, j1 = std::min(width, j0 + block);
      float m = kNegInf;
      for (int64_t j = j0; j < j1; ++j) m = std::max(m, row[j]);
      out[b] = m;
    }
  };
  constexpr int64_t kGrain = 4096;  // blocks per range: the pool's hand-off is worth it only on long rows
  if (pool != nullptr && blocks >= 2 * kGrain) {
    pool->parallel_for(blocks, run, kGrain);
  } else {
    run(0, blocks, 0);
  }
}

}  // namespace

// Compressor (spec §4.4; model.py Compressor.forward): the latents (normalised, bf16 values, before RoPE and FP4)
// of the groups completed in this call, and their group indices.
void AttentionLayer::project_compressor(const float* x, int64_t rows, const ComputeContext& ctx, float* kv,
                                        float* score) const {
  if (ratio_ == 1) {
    bf16_linear(x, rows, compressor_wkv_, kv, ctx, true);  // the bf16 weight with a bf16 output
    return;
  }
  // kv, score = wkv(x.float()), wgate(x.float()): fp32 weights, fp32 outputs (no rounding).
  bf16_linear(x, rows, compressor_wkv_, kv, ctx, false);
  bf16_linear(x, rows, compressor_wgate_, score, ctx, false);
}

Status AttentionLayer::run_compressor(const float* kv, const float* score, int64_t num_tokens, int64_t start_pos,
                                      SequenceState& state, const ComputeContext& ctx, std::span<float>* latents,
                                      std::span<int64_t>* groups) {
  const int64_t d = head_dim_;
  Arena& frame = ctx.workspace->frame();  // the caller's scope holds latents and groups
  // Groups completed in [start_pos, end_pos): those whose last position p has (p + 1) % ratio == 0.
  const int64_t end_pos = start_pos + num_tokens;
  const int64_t completed = end_pos / ratio_ - start_pos / ratio_;
  *latents = frame.take<float>(static_cast<size_t>(completed * d));  // [completed, head_dim]
  *groups = frame.take<int64_t>(static_cast<size_t>(completed));
  if (ratio_ == 1) {
    // One token per group: latent = norm(wkv(x)).
    ctx.backend->rmsnorm_bf16(kv, num_tokens, d, compressor_norm_, eps_, latents->data(), ctx.pool);
    for (int64_t t = 0; t < num_tokens; ++t) (*groups)[static_cast<size_t>(t)] = start_pos + t;
    return Status::Ok();
  }
  CompressorTail* tail = state.tail(layer_);
  if (tail == nullptr || tail->ratio != ratio_ || tail->head_dim != d) {
    return Status::Error("attention layer " + std::to_string(layer_) + ": the state has no ratio-" +
                         std::to_string(ratio_) + " compressor tail for this layer");
  }
  ArenaScope scope(frame);  // latents and groups were taken before: they outlive this scope
  const std::span<const float*> slot_kv = frame.take<const float*>(static_cast<size_t>(ratio_));
  const std::span<const float*> slot_score = frame.take<const float*>(static_cast<size_t>(ratio_));
  const std::span<float> e = frame.take<float>(static_cast<size_t>(ratio_));
  int64_t emitted = 0;
  for (int64_t p = start_pos; p < end_pos; ++p) {
    if ((p + 1) % ratio_ != 0) continue;
    const int64_t group = p / ratio_;
    for (int i = 0; i < ratio_; ++i) {
      const int64_t pos = group * ratio_ + i;
      const bool fresh = pos >= start_pos;
      slot_kv[static_cast<size_t>(i)] = fresh ? &kv[static_cast<size_t>((pos - start_pos) * d)] : &tail->kv[static_cast<size_t>(i * d)];
      slot_score[static_cast<size_t>(i)] =
          fresh ? &score[static_cast<size_t>((pos - start_pos) * d)] : &tail->score[static_cast<size_t>(i * d)];
    }
    for (int64_t c = 0; c < d; ++c) {
      // softmax over the group per channel (torch CPU, non-last dim, vectorised along the channels: SLEEF exp):
      // max, exp(s - max), sum from 0, e / sum; then (kv * w).sum(dim) from 0 in slot order.
      float m = slot_score[0][c];
      for (int i = 1; i < ratio_; ++i) m = std::max(m, slot_score[static_cast<size_t>(i)][c]);
      float sum = 0.0f;
      for (int i = 0; i < ratio_; ++i) {
        e[static_cast<size_t>(i)] = sleef_expf_u10(slot_score[static_cast<size_t>(i)][c] - m);
        sum += e[static_cast<size_t>(i)];
      }
      float acc = 0.0f;
      for (int i = 0; i < ratio_; ++i) {
        const float w = e[static_cast<size_t>(i)] / sum;
        const float product = slot_kv[static_cast<size_t>(i)][c] * w;
        acc += product;
      }
      (*latents)[static_cast<size_t>(emitted * d + c)] = round_to_bf16(acc);  // kv.to(bf16) before the norm
    }
    (*groups)[static_cast<size_t>(emitted++)] = group;
  }
  // The pending part: model.py's prefill (start_pos 0) stores only the trailing partial group; a step after
  // prefill stores its token whether or not the group completes.
  const int64_t first_stored = start_pos == 0 ? end_pos - end_pos % ratio_ : start_pos;
  for (int64_t p = first_stored; p < end_pos; ++p) {
    tail->store(p, &kv[static_cast<size_t>((p - start_pos) * d)], &score[static_cast<size_t>((p - start_pos) * d)]);
  }
  if (emitted > 0) {
    ctx.backend->rmsnorm_bf16(latents->data(), emitted, d, compressor_norm_, eps_, latents->data(), ctx.pool);
  }
  return Status::Ok();
}

// Indexer keys and main KV entries of the emitted groups (model.py Indexer keys, then Attention._compress_kv):
//   key = MXFP4(rope(k_norm(wk(latent)))), kv = FP4-e4m3(rope(latent)), RoPE at the group's first position.
Status AttentionLayer::store_entries(std::span<const float> latents, std::span<const int64_t> groups,
                                     SequenceState& state, const ComputeContext& ctx) {
  CompressedKv* kv = state.compressed(layer_);
  if (kv == nullptr) {
    return Status::Error("attention layer " + std::to_string(layer_) + ": the state has no compressed KV for this layer");
  }
  const int64_t n = static_cast<int64_t>(groups.size());
  if (n == 0) return Status::Ok();
  const int64_t d = head_dim_, id = index_head_dim_;
  Arena& frame = ctx.workspace->frame();
  ArenaScope scope(frame);
  const std::span<float> keys = frame.take<float>(static_cast<size_t>(n * id));  // [n, index_head_dim]
  bf16_linear(latents.data(), n, index_wk_, keys.data(), ctx, true);
  ctx.backend->rmsnorm_bf16(keys.data(), n, id, index_k_norm_, eps_, keys.data(), ctx.pool);
  const std::span<float> row = frame.take<float>(static_cast<size_t>(d));
  const std::span<uint8_t> kv_packed = frame.take<uint8_t>(static_cast<size_t>(d / 2));   // e2m1 pairs
  const std::span<uint8_t> kv_scales = frame.take<uint8_t>(static_cast<size_t>(d / 16));  // e4m3 per 16
  const std::span<uint8_t> key_packed = frame.take<uint8_t>(static_cast<size_t>(id / 2));
  const std::span<uint8_t> key_scales = frame.take<uint8_t>(static_cast<size_t>(id / 32));
  for (int64_t i = 0; i < n; ++i) {
    if (groups[static_cast<size_t>(i)] != kv->num_entries()) {
      return Status::Error("attention layer " + std::to_string(layer_) + ": compressed KV holds " +
                           std::to_string(kv->num_entries()) + " entries, cannot append group " +
                           std::to_string(groups[static_cast<size_t>(i)]) + " (state out of step with start_pos)");
    }
    const int64_t position = groups[static_cast<size_t>(i)] * ratio_;
    float* key = &keys[static_cast<size_t>(i * id)];
    rope_.rotate(*ctx.backend, key + id - rope_dim_, position);
    fp4_quant_ue8m0_block32(key, id, key_packed.data(), key_scales.data());
    std::memcpy(row.data(), &latents[static_cast<size_t>(i * d)], static_cast<size_t>(d) * sizeof(float));
    rope_.rotate(*ctx.backend, row.data() + d - rope_dim_, position);
    fp4_quant_e4m3_block16(row.data(), d, kv_packed.data(), kv_scales.data());
    const Status appended = kv->append(kv_packed.data(), kv_scales.data(), key_packed.data(), key_scales.data());
    if (!appended.ok()) return appended.with_context("attention layer " + std::to_string(layer_));
  }
  return Status::Ok();
}

// Indexer queries and top-k (spec §4.5; model.py Indexer.forward after the key update and
// select_candidate_blocks). Publishes the top-k (and on the candidate source the pool) into `shared`.
void AttentionLayer::project_index_queries(const float* x, const float* qr, int64_t rows, const float* cos,
                                           const float* sin, const ComputeContext& ctx, float* index_q,
                                           float* index_weights) const {
  const int ih = index_heads_;
  const int64_t id = index_head_dim_;
  const size_t half = static_cast<size_t>(rope_dim_ / 2);
  fp8_linear_bf16(qr, rows, index_wq_b_, index_q, ctx);
  for (int64_t t = 0; t < rows; ++t) {
    rope_.rotate(*ctx.backend, &index_q[t * ih * id + id - rope_dim_], ih, id, &cos[t * half], &sin[t * half]);
  }
  fake_quant_fp4_ue8m0_block32(index_q, rows * ih * id);
  bf16_linear(x, rows, index_weights_proj_, index_weights, ctx, true);
  const float weight_scale =
      static_cast<float>(std::pow(static_cast<double>(id), -0.5) * std::pow(static_cast<double>(ih), -0.5));
  for (int64_t i = 0; i < rows * ih; ++i) index_weights[i] = round_to_bf16(index_weights[i] * weight_scale);
}

Status AttentionLayer::run_indexer(const float* index_q, const float* index_weights, int64_t num_tokens,
                                   int64_t start_pos, const SequenceState& state, Csa2Shared& shared,
                                   const ComputeContext& ctx, AttentionTrace* trace) {
  ProfileScope profile_scope(ctx.profile, ProfilePhase::kIndexer);  // its projections charge kLinear
  const int64_t end_pos = start_pos + num_tokens;
  const int64_t width = end_pos / ratio_;  // compressed positions of the call's last query
  const int ih = index_heads_;
  const int64_t id = index_head_dim_;
  const CompressedKv* source = state.compressed(kv_source_layer_);
  if (source == nullptr || source->num_entries() < width) {
    return Status::Error("attention layer " + std::to_string(layer_) + ": KV source L" +
                         std::to_string(kv_source_layer_) + " holds " +
                         std::to_string(source ? source->num_entries() : 0) + " entries, the indexer needs " +
                         std::to_string(width));
  }
  if (candidate_restricted_ && (shared.candidate_layer < 0 || shared.candidate_width != width ||
                                static_cast<int64_t>(shared.candidates.size()) != num_tokens * width)) {
    return Status::Error("attention layer " + std::to_string(layer_) +
                         ": Reindex layer needs the candidate pool of this call (run the candidate source first)");
  }
  Arena& frame = ctx.workspace->frame();
  ArenaScope frame_scope(frame);

  const int64_t k = std::min<int64_t>(index_topk_, width);
  const int64_t blocks = candidate_source_ ? (width + candidate_block_size_ - 1) / candidate_block_size_ : 0;
  // Published through `shared` (step memory): [tokens, k] and, on the candidate source, the pool [tokens, width].
  const std::span<int32_t> topk = shared.new_topk(static_cast<size_t>(num_tokens * k));
  std::span<uint8_t> pool_mask;
  if (candidate_source_) {
    pool_mask = shared.new_candidates(static_cast<size_t>(num_tokens * width));
    std::fill(pool_mask.begin(), pool_mask.end(), uint8_t{0});
  }
  if (trace != nullptr) {
    trace->index_width = width;
    trace->index_scores.assign(static_cast<size_t>(num_tokens * width), 0.0f);
    trace->topk_width = k;
    if (candidate_source_) {
      trace->candidate_blocks = blocks;
      trace->candidate_block_scores.assign(static_cast<size_t>(num_tokens * blocks), 0.0f);
    }
  }
  const std::span<float> scores =
      frame.take<float>(static_cast<size_t>(std::min(kQueryTile, num_tokens) * width));  // [tile, width]
  for (int64_t tile = 0; tile < num_tokens; tile += kQueryTile) {
    const int64_t tile_n = std::min(kQueryTile, num_tokens - tile);
    const float* tile_q = &index_q[tile * ih * id];
    const float* tile_w = &index_weights[tile * ih];
    // score[t][j] = bf16( Σ_h bf16( relu(bf16(q_h · k_j)) * w_h ) ), the head sum in torch's cascade order
    // (kernels/index_score.h); threads split the key blocks.
    if (candidate_restricted_) {
      // Reindex: only keys in the query's candidate pool can rank (the rest are -inf), so only the tile's pooled
      // columns are scored (gathered, same kernel, same bits) and each query's own pool is scattered into its row.
      ArenaScope columns_scope(frame);
      const uint8_t* masks = &shared.candidates[static_cast<size_t>(tile * width)];  // [tile_n, width]
      const std::span<int32_t> columns = frame.take<int32_t>(static_cast<size_t>(width));  // pooled j, ascending
      const int64_t num_columns = pooled_columns(masks, tile_n, width, columns.data());
      const std::span<float> pooled_scores =
          frame.take<float>(static_cast<size_t>(std::max<int64_t>(1, tile_n * num_columns)));  // [tile, columns]
      score_key_rows(*source, columns.data(), num_columns, tile_q, tile_w, tile_n, ih, id, pooled_scores.data(),
                     num_columns, ctx);
      for (int64_t t = 0; t < tile_n; ++t) {
        float* row = &scores[static_cast<size_t>(t * width)];
        const uint8_t* mask = masks + t * width;
        std::fill(row, row + width, kNegInf);
        for (int64_t c = 0; c < num_columns; ++c) {
          const int32_t j = columns[static_cast<size_t>(c)];
          if (mask[j] != 0) row[j] = pooled_scores[static_cast<size_t>(t * num_columns + c)];
        }
      }
    } else {
      score_key_rows(*source, nullptr, width, tile_q, tile_w, tile_n, ih, id, scores.data(), width, ctx);
    }
    // Per query: visibility, candidate pool (source), top-k. With fewer queries than threads (batch-1 decode) the
    // queries run one after another and each splits its long rows over the pool instead: block maxima by ranges,
    // the top-k by chunks (the same values and indices for any thread count).
    const bool split_rows = ctx.pool != nullptr && tile_n < ctx.pool->num_threads();
    ThreadPool* row_pool = split_rows ? ctx.pool : nullptr;
    auto select = [&](int64_t t_begin, int64_t t_end, int thread) {
      ThreadScratch scratch(ctx.pool, thread);
      const std::span<float> block_scores = scratch.take<float>(static_cast<size_t>(blocks));
      const std::span<int32_t> chosen = scratch.take<int32_t>(
          static_cast<size_t>(std::max<int64_t>(k, std::min<int64_t>(candidate_blocks_, blocks))));
      for (int64_t t = t_begin; t < t_end; ++t) {
        const int64_t query = tile + t;
        float* row = &scores[static_cast<size_t>(t * width)];
        const int64_t visible = (start_pos + query + 1) / ratio_;
        for (int64_t j = visible; j < width; ++j) row[j] = kNegInf;
        if (candidate_source_) {
          block_maxima(row, width, candidate_block_size_, blocks, block_scores.data(), row_pool);
          // the block holding the newest visible position is pinned in (python floor division: none if visible == 0)
          if (visible > 0) block_scores[static_cast<size_t>((visible - 1) / candidate_block_size_)] = kPosInf;
          const int64_t kb = std::min<int64_t>(candidate_blocks_, blocks);
          ctx.backend->topk_select(block_scores.data(), blocks, kb, chosen.data(), row_pool, &scratch.arena());
          uint8_t* mask = &pool_mask[static_cast<size_t>(query * width)];
          for (int64_t i = 0; i < kb; ++i) {
            const int64_t bi = chosen[static_cast<size_t>(i)];
            if (!(block_scores[static_cast<size_t>(bi)] > kNegInf)) continue;
            const int64_t j0 = bi * candidate_block_size_, j1 = std::min(width, j0 + candidate_block_size_);
            for (int64_t j = j0; j < j1; ++j) mask[j] = 1;
          }
          if (trace != nullptr) {
            std::copy(block_scores.begin(), block_scores.end(),
                      trace->candidate_block_scores.begin() + query * blocks);
          }
        }
        if (trace != nullptr) std::copy(row, row + width, trace->index_scores.begin() + query * width);
        int32_t* out = &topk[static_cast<size_t>(query * k)];
        ctx.backend->topk_select(row, width, k, out, row_pool, &scratch.arena());
        std::sort(out, out + k);
        for (int64_t i = 0; i < k; ++i) {
          if (out[i] >= visible) out[i] = -1;
        }
      }
    };
    if (ctx.pool != nullptr && tile_n > 1 && !split_rows) {
      ctx.pool->parallel_for(tile_n, select);
    } else {
      select(0, tile_n, 0);
    }
  }
  shared.topk_layer = layer_;
  shared.topk_width = k;
  shared.topk = topk;
  if (candidate_source_) {
    shared.candidate_layer = layer_;
    shared.candidate_width = width;
    shared.candidates = pool_mask;
    if (trace != nullptr) trace->candidates.assign(pool_mask.begin(), pool_mask.end());
  }
  if (trace != nullptr) trace->index_topk.assign(topk.begin(), topk.end());
  return Status::Ok();
}

Result<int64_t> AttentionLayer::stored_rows(const SequenceState& state, int64_t start_pos, int64_t num_tokens) const {
  const CompressedKv* own = state.compressed(layer_);
  if (own == nullptr || own->num_entries() < start_pos / ratio_) {
    return Status::Error("compressed KV holds " + std::to_string(own ? own->num_entries() : -1) +
                         " entries at start_pos " + std::to_string(start_pos) + ", expected " +
                         std::to_string(start_pos / ratio_));
  }
  // A replayed cached prefix ends on a group boundary; its global KV is reused as it is.
  return std::clamp<int64_t>(own->num_entries() * ratio_ - start_pos, 0, num_tokens);
}

Status AttentionLayer::compress_rows(const float* kv, const float* score, int64_t num_tokens, int64_t start_pos,
                                     SequenceState& state, const ComputeContext& ctx, AttentionTrace* trace) {
  if (num_tokens == 0) return Status::Ok();
  ArenaScope scope(ctx.workspace->frame());
  std::span<float> latents;
  std::span<int64_t> groups;
  Status st = run_compressor(kv, score, num_tokens, start_pos, state, ctx, &latents, &groups);
  if (!st.ok()) return st;
  st = store_entries(latents, groups, state, ctx);
  if (!st.ok()) return st;
  if (trace != nullptr) {
    trace->compressor_latent.assign(latents.begin(), latents.end());
    trace->compressor_groups.assign(groups.begin(), groups.end());
  }
  return Status::Ok();
}

Status AttentionLayer::compressed_branch(const AttentionSegment& segment, const SegmentRows& rows,
                                         const ComputeContext& ctx, CompressedBranch* out) {
  auto where = [this] { return "attention layer " + std::to_string(layer_); };  // error paths only
  SequenceState& state = *segment.state;
  Csa2Shared& shared = *segment.shared;
  AttentionTrace* trace = segment.trace;
  const int64_t start_pos = segment.start_pos, t_n = segment.num_tokens;
  const int64_t end_pos = start_pos + t_n;
  *out = CompressedBranch{};
  if (ratio_ > 0) {
    const int64_t compress_len = end_pos / ratio_;
    if (kv_source_) {
      Status st = compress_rows(rows.compressor_kv, rows.compressor_score, rows.compressor_rows,
                                end_pos - rows.compressor_rows, state, ctx, trace);
      if (!st.ok()) return st.with_context(where());
    }
    const CompressedKv* compressed = state.compressed(kv_source_layer_);
    if (compressed == nullptr || compressed->num_entries() < compress_len) {
      return Status::Error(where() + ": KV source L" + std::to_string(kv_source_layer_) + " holds " +
                           std::to_string(compressed ? compressed->num_entries() : 0) + " entries, " +
                           std::to_string(compress_len) + " are visible at end position " + std::to_string(end_pos));
    }
    if (index_source_) {
      if (compress_len == 0) {
        shared.topk_layer = layer_;
        shared.topk_width = 0;
        shared.topk = {};
      } else {
        Status st = run_indexer(rows.index_q, rows.index_weights, t_n, start_pos, state, shared, ctx, trace);
        if (!st.ok()) return st;
      }
    } else if (shared.topk_layer != index_source_layer_ ||
               static_cast<int64_t>(shared.topk.size()) != t_n * shared.topk_width) {
      return Status::Error(where() + ": Reuse layer needs the top-k of index source L" +
                           std::to_string(index_source_layer_) + " from this call (found L" +
                           std::to_string(shared.topk_layer) + ")");
    }
    *out = CompressedBranch{compressed, shared.topk_width};
  }
  return Status::Ok();
}

}  // namespace dsflash
