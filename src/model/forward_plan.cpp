#include "model/forward_plan.h"

#include <algorithm>
#include <string>

#include "formats/formats.h"
#include "kernels/hc.h"
#include "kernels/rmsnorm.h"

namespace dsflash {

const char* prefill_mode_name(PrefillMode mode) {
  return mode == PrefillMode::kExact ? "exact" : "bounded-replay";
}

int64_t replay_start(const ModelConfig& config, const PrefillOptions& options, int64_t prompt_length) {
  if (options.mode == PrefillMode::kExact && !options.truncate_decoder_window) return 0;
  const int64_t replay = options.replay_tokens > 0 ? options.replay_tokens : config.window_size;
  return std::max<int64_t>(0, prompt_length - replay);
}

namespace {

// The residual streams of some rows of a call and the pre-mix each row's next attention collapses with.
struct Streams {
  int64_t start_pos = 0;   // absolute position of row 0
  int64_t num_tokens = 0;
  std::vector<float> h;        // [tokens, hc, dim] bf16 values
  std::vector<float> pre_mix;  // [tokens, hc] fp32

  // Drops the first `rows` rows.
  void drop_front(int64_t rows, int hc, int64_t dim) {
    h.erase(h.begin(), h.begin() + rows * hc * dim);
    pre_mix.erase(pre_mix.begin(), pre_mix.begin() + rows * hc);
    start_pos += rows;
    num_tokens -= rows;
  }
};

// Scratch of one block over `n` rows.
struct BlockScratch {
  std::vector<float> mid, x, y, a_pre, a_post, a_comb, f_pre, f_post, f_comb;
  void resize(int64_t n, int hc, int64_t dim) {
    mid.resize(static_cast<size_t>(n * hc * dim));
    x.resize(static_cast<size_t>(n * dim));
    y.resize(static_cast<size_t>(n * dim));
    for (auto* v : {&a_pre, &a_post, &f_pre, &f_post}) v->resize(static_cast<size_t>(n * hc));
    for (auto* v : {&a_comb, &f_comb}) v->resize(static_cast<size_t>(n * hc * hc));
  }
};

// Embedding rows copied into every stream; pre-mix one-hot on stream 0 (spec §4.1).
void embed(const ModelWeights& weights, const int32_t* tokens, int64_t n, Streams* s) {
  const int hc = weights.hc_shape().hc;
  const int64_t dim = weights.hc_shape().dim;
  s->num_tokens = n;
  s->h.resize(static_cast<size_t>(n * hc * dim));
  for (int64_t t = 0; t < n; ++t) {
    const uint16_t* row = weights.embed().data + static_cast<int64_t>(tokens[t]) * dim;
    for (int j = 0; j < hc; ++j) {
      float* dst = s->h.data() + (t * hc + j) * dim;
      for (int64_t i = 0; i < dim; ++i) dst[i] = bf16_to_f32(row[i]);
    }
  }
  s->pre_mix.assign(static_cast<size_t>(n * hc), 0.0f);
  for (int64_t t = 0; t < n; ++t) s->pre_mix[static_cast<size_t>(t * hc)] = 1.0f;
}

// The attention input of `block` for every row of `s`: attn_norm(hc_pre(h, pre_mix)) -> x [rows, dim].
void attention_input(const ModelWeights& weights, const BlockWeights& block, const Streams& s,
                     const ComputeContext& ctx, float* x) {
  const HcShape& shape = weights.hc_shape();
  hc_pre(s.h.data(), s.num_tokens, shape.hc, shape.dim, s.pre_mix.data(), x);
  rmsnorm_bf16(x, s.num_tokens, shape.dim, block.attn_norm, shape.norm_eps, x, ctx.pool);
}

// The FFN half of a block after the attention output `y` (as Transformer::forward): updates s.h and s.pre_mix.
void ffn_half(const ModelWeights& weights, const BlockWeights& block, Streams& s, BlockScratch& w,
              const ComputeContext& ctx) {
  const HcShape& shape = weights.hc_shape();
  const int64_t n = s.num_tokens;
  hc_post(w.y.data(), s.h.data(), n, shape.hc, shape.dim, w.a_post.data(), w.a_comb.data(), w.mid.data());
  hc_mixes(w.mid.data(), n, block.hc_ffn, shape, w.f_pre.data(), w.f_post.data(), w.f_comb.data(), ctx.pool);
  hc_pre(w.mid.data(), n, shape.hc, shape.dim, w.a_pre.data(), w.x.data());
  rmsnorm_bf16(w.x.data(), n, shape.dim, block.ffn_norm, shape.norm_eps, w.x.data(), ctx.pool);
  block.moe->forward(w.x.data(), n, ctx, w.y.data());
  hc_post(w.y.data(), w.mid.data(), n, shape.hc, shape.dim, w.f_post.data(), w.f_comb.data(), s.h.data());
  std::copy(w.f_pre.begin(), w.f_pre.begin() + n * shape.hc, s.pre_mix.begin());
}

// Final collapse, norm and head for rows [first, first + count) of s: logits [count, vocab].
void head_rows(const ModelWeights& weights, const Streams& s, int64_t first, int64_t count, const ComputeContext& ctx,
               std::vector<float>* logits) {
  const HcShape& shape = weights.hc_shape();
  std::vector<float> x(static_cast<size_t>(count * shape.dim));
  hc_pre(s.h.data() + first * shape.hc * shape.dim, count, shape.hc, shape.dim,
         s.pre_mix.data() + first * shape.hc, x.data());
  rmsnorm_bf16(x.data(), count, shape.dim, weights.final_norm(), shape.norm_eps, x.data(), ctx.pool);
  logits->assign(static_cast<size_t>(count * weights.config().vocab_size), 0.0f);
  if (count > 0) {
    ProfileScope scope(ctx.profile, ProfilePhase::kLinear);
    ctx.linear->bf16_gemm(x.data(), count, weights.head(), logits->data(), ctx.pool);
  }
}

Status check_tokens(const ModelConfig& config, const int32_t* tokens, int64_t n, int64_t start_pos) {
  for (int64_t t = 0; t < n; ++t) {
    if (tokens[t] < 0 || tokens[t] >= config.vocab_size) {
      return Status::Error("token id " + std::to_string(tokens[t]) + " at input index " + std::to_string(t) +
                           " is outside the vocabulary [0, " + std::to_string(config.vocab_size) + ")");
    }
  }
  if (start_pos + n > config.max_position_embeddings) {
    return Status::Error("context of " + std::to_string(start_pos + n) + " positions exceeds max_position_embeddings " +
                         std::to_string(config.max_position_embeddings));
  }
  return Status::Ok();
}

}  // namespace

Status ForwardPlan::prefill(const int32_t* tokens, int64_t num_tokens, int64_t prompt_length, SequenceState& seq,
                            const ComputeContext& ctx, const PrefillOptions& options, LogitsRows rows,
                            ChunkLogits* logits) const {
  const ModelConfig& config = weights_.config();
  const HcShape& shape = weights_.hc_shape();
  const int64_t start_pos = seq.num_positions();
  if (num_tokens <= 0) return Status::Error("prefill: no tokens to process");
  if (start_pos + num_tokens > prompt_length) {
    return Status::Error("prefill: chunk [" + std::to_string(start_pos) + ", " + std::to_string(start_pos + num_tokens) +
                         ") runs past the prompt length " + std::to_string(prompt_length));
  }
  Status s = check_tokens(config, tokens, num_tokens, start_pos);
  if (!s.ok()) return s;
  if (options.replay_tokens < 0) return Status::Error("prefill: replay_tokens must be >= 0");
  s = seq.attention().reserve_positions(start_pos + num_tokens);
  if (!s.ok()) return s.with_context("prefill");

  const int decoder_start = config.ced_decoder_start();
  const int64_t floor = replay_start(config, options, prompt_length);
  // First position the decoder computes in this chunk.
  const bool replay = options.mode == PrefillMode::kBoundedReplay && decoder_start < config.n_layers;
  const int64_t decoder_first = replay ? std::min(std::max(start_pos, floor), start_pos + num_tokens) : start_pos;

  // Engram ids of the whole chunk (advances the n-gram history): [tokens, engram layers, columns].
  std::vector<int64_t> hash_ids;
  int64_t hash_row = 0;
  if (const NgramHasher* hasher = weights_.engram_hasher()) {
    hash_row = static_cast<int64_t>(hasher->num_layers()) * hasher->columns();
    hash_ids.resize(static_cast<size_t>(num_tokens * hash_row));
    s = hasher->hash(tokens, num_tokens, start_pos, &seq.engram(), hash_ids.data());
    if (!s.ok()) return s.with_context("Engram hashing");
  }

  Streams streams;
  streams.start_pos = start_pos;
  embed(weights_, tokens, num_tokens, &streams);
  BlockScratch w;
  w.resize(num_tokens, shape.hc, shape.dim);
  Csa2Shared shared;
  shared.reset(start_pos, num_tokens);

  for (const BlockWeights& block : weights_.blocks()) {
    const std::string where = "layer " + std::to_string(block.layer);
    if (block.layer == decoder_start) {
      // CED split point: rows before decoder_first only feed layer d's global-KV path.
      const int64_t global_only = decoder_first - streams.start_pos;
      if (global_only > 0) {
        std::vector<float> x(static_cast<size_t>(global_only * shape.dim));
        Streams head;
        head.start_pos = streams.start_pos;
        head.num_tokens = global_only;
        head.h.assign(streams.h.begin(), streams.h.begin() + global_only * shape.hc * shape.dim);
        head.pre_mix.assign(streams.pre_mix.begin(), streams.pre_mix.begin() + global_only * shape.hc);
        attention_input(weights_, block, head, ctx, x.data());
        s = block.attention->forward_global_kv(x.data(), global_only, head.start_pos, seq.attention(), ctx);
        if (!s.ok()) return s.with_context(where + " global-KV path");
        streams.drop_front(global_only, shape.hc, shape.dim);
      }
      if (streams.num_tokens == 0) break;
      if (replay) {
        shared.reset(streams.start_pos, streams.num_tokens, floor);  // the decoder's call covers the tail rows only
      } else {
        shared.window_floor = floor;  // exact: same call; the floor is 0 unless truncation was asked for
      }
    }
    const int64_t n = streams.num_tokens;
    const int64_t row0 = streams.start_pos - start_pos;  // row of the chunk this call's row 0 is
    if (block.engram) {
      s = block.engram->forward(streams.h.data(), n, hash_ids.data() + row0 * hash_row, ctx);
      if (!s.ok()) return s.with_context(where + " Engram");
    }
    hc_mixes(streams.h.data(), n, block.hc_attn, shape, w.a_pre.data(), w.a_post.data(), w.a_comb.data(), ctx.pool);
    attention_input(weights_, block, streams, ctx, w.x.data());
    s = block.attention->forward(w.x.data(), n, streams.start_pos, seq.attention(), shared, ctx, w.y.data());
    if (!s.ok()) return s.with_context(where + " attention");
    ffn_half(weights_, block, streams, w, ctx);
  }
  seq.advance(num_tokens);

  if (logits == nullptr) return Status::Ok();
  logits->logits.clear();
  logits->positions.clear();
  int64_t first = 0, count = 0;
  if (rows == LogitsRows::kAll) {
    count = streams.num_tokens;
  } else if (rows == LogitsRows::kLast && start_pos + num_tokens == prompt_length && streams.num_tokens > 0) {
    first = streams.num_tokens - 1;
    count = 1;
  }
  if (count > 0) head_rows(weights_, streams, first, count, ctx, &logits->logits);
  for (int64_t r = 0; r < count; ++r) logits->positions.push_back(streams.start_pos + first + r);
  return Status::Ok();
}

Status ForwardPlan::decode(const std::vector<int32_t>& tokens, const std::vector<SequenceState*>& seqs,
                           const std::vector<int64_t>& window_floors, const ComputeContext& ctx,
                           std::vector<float>* logits) const {
  const ModelConfig& config = weights_.config();
  const HcShape& shape = weights_.hc_shape();
  const int64_t batch = static_cast<int64_t>(seqs.size());
  if (batch == 0 || static_cast<int64_t>(tokens.size()) != batch ||
      (!window_floors.empty() && static_cast<int64_t>(window_floors.size()) != batch)) {
    return Status::Error("decode: " + std::to_string(tokens.size()) + " tokens, " + std::to_string(seqs.size()) +
                         " sequences, " + std::to_string(window_floors.size()) + " window floors (must agree, > 0)");
  }
  for (int64_t b = 0; b < batch; ++b) {
    if (seqs[static_cast<size_t>(b)] == nullptr) return Status::Error("decode: sequence " + std::to_string(b) + " is null");
    for (int64_t c = 0; c < b; ++c) {
      if (seqs[static_cast<size_t>(c)] == seqs[static_cast<size_t>(b)]) {
        return Status::Error("decode: sequence " + std::to_string(b) + " appears twice in the batch");
      }
    }
    Status s = check_tokens(config, &tokens[static_cast<size_t>(b)], 1, seqs[static_cast<size_t>(b)]->num_positions());
    if (!s.ok()) return s.with_context("decode: batch row " + std::to_string(b));
  }
  for (int64_t b = 0; b < batch; ++b) {
    SequenceState& seq = *seqs[static_cast<size_t>(b)];
    Status s = seq.attention().reserve_positions(seq.num_positions() + 1);
    if (!s.ok()) return s.with_context("decode: batch row " + std::to_string(b));
  }

  std::vector<int64_t> hash_ids;
  int64_t hash_row = 0;
  if (const NgramHasher* hasher = weights_.engram_hasher()) {
    hash_row = static_cast<int64_t>(hasher->num_layers()) * hasher->columns();
    hash_ids.resize(static_cast<size_t>(batch * hash_row));
    for (int64_t b = 0; b < batch; ++b) {
      SequenceState& seq = *seqs[static_cast<size_t>(b)];
      Status s = hasher->hash(&tokens[static_cast<size_t>(b)], 1, seq.num_positions(), &seq.engram(),
                              hash_ids.data() + b * hash_row);
      if (!s.ok()) return s.with_context("Engram hashing, batch row " + std::to_string(b));
    }
  }

  Streams streams;
  embed(weights_, tokens.data(), batch, &streams);
  BlockScratch w;
  w.resize(batch, shape.hc, shape.dim);
  std::vector<Csa2Shared> shared(static_cast<size_t>(batch));
  std::vector<int64_t> positions(static_cast<size_t>(batch));
  std::vector<AttentionState*> states(static_cast<size_t>(batch));
  std::vector<Csa2Shared*> shared_rows(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    const size_t i = static_cast<size_t>(b);
    positions[i] = seqs[i]->num_positions();
    states[i] = &seqs[i]->attention();
    shared[i].reset(positions[i], 1);
    shared_rows[i] = &shared[i];
  }
  const int decoder_start = config.ced_decoder_start();
  for (const BlockWeights& block : weights_.blocks()) {
    const std::string where = "layer " + std::to_string(block.layer);
    if (block.engram) {
      Status s = block.engram->forward(streams.h.data(), batch, hash_ids.data(), ctx);
      if (!s.ok()) return s.with_context(where + " Engram");
    }
    hc_mixes(streams.h.data(), batch, block.hc_attn, shape, w.a_pre.data(), w.a_post.data(), w.a_comb.data(),
             ctx.pool);
    attention_input(weights_, block, streams, ctx, w.x.data());
    const bool decoder = block.layer >= decoder_start;
    for (int64_t b = 0; b < batch; ++b) {
      shared[static_cast<size_t>(b)].window_floor =
          decoder && !window_floors.empty() ? window_floors[static_cast<size_t>(b)] : 0;
    }
    Status s = block.attention->forward_decode_batch(w.x.data(), batch, positions.data(), states.data(),
                                                     shared_rows.data(), ctx, w.y.data());
    if (!s.ok()) return s.with_context(where);
    ffn_half(weights_, block, streams, w, ctx);
  }
  for (SequenceState* seq : seqs) seq->advance(1);
  if (logits != nullptr) head_rows(weights_, streams, 0, batch, ctx, logits);
  return Status::Ok();
}

}  // namespace dsflash
