// DSpark (spec/MODEL.md §4.10, model/dspark.h) against the goldens' dspark.* tensors (the `rand` scenario of
// tiny-a: one stage with draft logits; tiny-b: three stages, ids and confidence only):
//   * the main forward's hidden states at the target layers (dspark.main_hidden_prefill, and the first decode
//     step's row of dspark.main_hidden_decode) on the reference kernels, bit for bit;
//   * the stages fed with the recorded hidden states (ring seeding from the prefill rows, then one decode row and
//     one draft per step, as model.py's forward_spec): output_ids, confidence and draft logits, bit for bit on the
//     reference kernels; the fast kernels within a tolerance;
//   * properties: batched drafts = alone, context appended row by row = in one call, errors before any change.
// Decode rows after the first are compared only through the recorded inputs: the `rand` scenario is the official
// variant, whose decode steps read a stale KV source's indexer keys (spec "Decisions for dsflash"), so dsflash's
// own decode hidden states legitimately differ from decode step 1 on.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>

#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/dspark.h"
#include "model/forward.h"
#include "model/golden_tensors.h"
#include "model/test_sequences.h"

namespace dsflash {
namespace {

using namespace dsflash::testing;

// Fast path tolerances. The fast kernels reproduce the reference bit for bit except the matmuls' summation order
// inside a 32-wide K block (FP8) and across lanes (BF16, kernels/linear.h). Measured (AVX-512 and AVX2, tiny-a/b):
// draft logits max |d| 9.5e-7, confidence 4.8e-7, main_hidden_prefill 0, no draft id differs. The draft logits and the confidence are fp32 outputs of a chain of 1-3 blocks whose FP8 activation
// quantisation can turn a one-ulp difference into a jump (goldens MANIFEST.md "Sensitivity": up to 0.31 on logits
// for one ulp of one hidden value); 0.05 absolute is the end-to-end logits tolerance of test_transformer_golden.cpp
// for the same reason, and any real defect moves these outputs by O(0.1-1).
constexpr float kFastLogitsTolerance = 0.05f;
constexpr float kFastConfidenceTolerance = 0.05f;
// Hidden states (bf16 values of RMS ~1): the fast matmuls' order moves a value by an ulp or, through an FP8
// quantisation step, a few; 0.05 is ~6 bf16 ulps at 1 and far below what a defect does.
constexpr float kFastHiddenTolerance = 0.05f;

struct Model {
  std::unique_ptr<Checkpoint> checkpoint;
  std::unique_ptr<ModelWeights> weights;
  std::unique_ptr<DSpark> dspark;
  std::unique_ptr<TestKv> kv;  // sequences for the tests
  kv::SequenceLease open() { return kv->open(); }
};

// Opens a golden checkpoint with its weights and DSpark stages into m (failures are test failures; m.dspark stays
// null then).
void open_model(const std::string& name, Model& m) {
  auto checkpoint = Checkpoint::open(golden_checkpoint_dir(name));
  EXPECT_TRUE(checkpoint.ok()) << checkpoint.status().message();
  if (!checkpoint.ok()) return;
  m.checkpoint = std::make_unique<Checkpoint>(std::move(*checkpoint));
  auto weights = ModelWeights::bind(*m.checkpoint);
  EXPECT_TRUE(weights.ok()) << weights.status().message();
  if (!weights.ok()) return;
  m.weights = std::move(*weights);
  m.kv = std::make_unique<TestKv>(m.checkpoint->config());
  auto dspark = DSpark::bind(*m.checkpoint, *m.weights);
  EXPECT_TRUE(dspark.ok()) << dspark.status().message();
  if (dspark.ok()) m.dspark = std::move(*dspark);
}

Model& model_for(const std::string& name) {
  static std::map<std::string, Model> cache;
  Model& m = cache[name];
  if (!m.checkpoint) open_model(name, m);
  return m;
}

// The recorded DSpark tensors of a scenario.
struct Recorded {
  std::vector<int32_t> prompt, generated;  // [S], [T+1]
  std::vector<float> hidden_prefill;       // [S, width]
  std::vector<float> hidden_decode;        // [T, width]
  std::vector<int64_t> output_ids;         // [T, B+1]
  std::vector<float> confidence;           // [T, B]
  std::vector<float> logits;               // [T, B, V] (tiny-a only)
  int64_t steps() const { return static_cast<int64_t>(generated.size()) - 1; }
};

Recorded load_recorded(const std::string& model) {
  Recorded r;
  auto file = SafetensorsFile::open(golden_output_path(model, "rand"));
  EXPECT_TRUE(file.ok()) << file.status().message();
  if (!file.ok()) return r;
  for (int64_t id : to_i64(file->find("prompt_ids"))) r.prompt.push_back(static_cast<int32_t>(id));
  for (int64_t id : to_i64(file->find("generated_ids"))) r.generated.push_back(static_cast<int32_t>(id));
  r.hidden_prefill = to_f32(file->find("dspark.main_hidden_prefill"));
  r.hidden_decode = to_f32(file->find("dspark.main_hidden_decode"));
  r.output_ids = to_i64(file->find("dspark.output_ids"));
  r.confidence = to_f32(file->find("dspark.confidence"));
  r.logits = to_f32(file->find("dspark.logits"));
  return r;
}

struct DraftRun {
  std::vector<int32_t> output_ids;  // [T, B+1]
  std::vector<float> confidence;    // [T, B]
  std::vector<float> logits;        // [T, B, V]
};

// model.py's loop: forward_spec(generated[0], main_hidden_prefill, 0) seeds the rings; step t appends the decode
// row of position S+t and drafts from generated[t+1].
Result<DraftRun> run_recorded(Model& m, const Recorded& r, const ComputeContext& ctx) {
  kv::SequenceLease seq = m.open();
  const int64_t S = static_cast<int64_t>(r.prompt.size()), width = m.dspark->hidden_width();
  DSparkOutput out;
  DSparkSegment seed{seq.get(), r.hidden_prefill.data(), 0, S, false, 0};
  Status st = m.dspark->forward(&seed, 1, ctx, &out);
  if (!st.ok()) return st;
  DraftRun run;
  for (int64_t t = 0; t < r.steps(); ++t) {
    DSparkSegment step{seq.get(), &r.hidden_decode[static_cast<size_t>(t * width)], S + t, 1, true,
                       r.generated[static_cast<size_t>(t + 1)]};
    st = m.dspark->forward(&step, 1, ctx, &out);
    if (!st.ok()) return st;
    if (out.drafts.size() != 1 || out.drafts[0].first_position != S + t + 1) {
      return Status::Error("unexpected draft layout");
    }
    run.output_ids.insert(run.output_ids.end(), out.output_ids.begin(), out.output_ids.end());
    run.confidence.insert(run.confidence.end(), out.confidence.begin(), out.confidence.end());
    run.logits.insert(run.logits.end(), out.logits.begin(), out.logits.end());
  }
  return run;
}

ComputeContext reference_ctx() { return ComputeContext::for_backend(reference_backend()); }

class DSparkGolden : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!goldens_present()) GTEST_SKIP() << "goldens not found under " << goldens_dir();
  }
};

// The golden's own semantics: drafts are greedy on the biased logits, output_ids[t][0] is the main model's pick.
TEST(DSparkGoldenData, DraftsAreGreedyOnTheBiasedLogits) {
  if (!goldens_present()) GTEST_SKIP();
  const Recorded r = load_recorded("tiny-a");
  ASSERT_FALSE(r.logits.empty());
  const int64_t T = r.steps(), B = static_cast<int64_t>(r.confidence.size()) / T;
  const int64_t V = static_cast<int64_t>(r.logits.size()) / (T * B);
  for (int64_t t = 0; t < T; ++t) {
    EXPECT_EQ(r.output_ids[static_cast<size_t>(t * (B + 1))], r.generated[static_cast<size_t>(t + 1)]);
    for (int64_t i = 0; i < B; ++i) {
      const float* row = &r.logits[static_cast<size_t>((t * B + i) * V)];
      int64_t best = 0;
      for (int64_t v = 1; v < V; ++v) best = row[v] > row[best] ? v : best;
      EXPECT_EQ(r.output_ids[static_cast<size_t>(t * (B + 1) + i + 1)], best) << "step " << t << " position " << i;
    }
  }
}

// dspark.main_hidden_prefill and the first decode row from the main forward (RowOptions::dspark_hidden).
TEST_P(DSparkGolden, MainHiddenFromTheForwardBitForBit) {
  const std::string name = GetParam();
  Model& m = model_for(name);
  ASSERT_TRUE(m.dspark);
  const Recorded r = load_recorded(name);
  ASSERT_FALSE(r.hidden_prefill.empty());
  const ComputeContext ctx = reference_ctx();
  kv::SequenceLease seq = m.open();
  const int64_t S = static_cast<int64_t>(r.prompt.size()), width = m.dspark->hidden_width();
  RowOptions options;
  options.dspark_hidden = true;
  options.logits = LogitsRows::kLast;
  ForwardBatch batch;
  batch.add(*seq, r.prompt.data(), S, options);
  ForwardOutput out;
  Status st = forward(*m.weights, batch, ctx, &out);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(out.dspark_rows.size(), static_cast<size_t>(S));
  EXPECT_EQ(out.dspark_rows.back().position, S - 1);
  const int64_t bad_prefill = count_mismatches(out.dspark_hidden, r.hidden_prefill);
  std::printf("[%s] main_hidden_prefill [%lld, %lld]: %lld elements differ\n", name.c_str(),
              static_cast<long long>(S), static_cast<long long>(width), static_cast<long long>(bad_prefill));
  EXPECT_EQ(bad_prefill, 0);

  // Decode step 0 (position S) completes a ratio-2 group, so the official variant reads its own keys there.
  batch.clear();
  batch.add(*seq, &r.generated[0], 1, options);
  st = forward(*m.weights, batch, ctx, &out);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(out.dspark_rows.size(), 1u);
  EXPECT_EQ(out.dspark_rows[0].position, S);
  const std::vector<float> golden_row(r.hidden_decode.begin(), r.hidden_decode.begin() + width);
  EXPECT_EQ(count_mismatches(out.dspark_hidden, golden_row), 0);

  // Fast kernels: within the hidden-state tolerance.
  ThreadPool pool(2);
  kv::SequenceLease fast_seq = m.open();
  batch.clear();
  batch.add(*fast_seq, r.prompt.data(), S, options);
  st = forward(*m.weights, batch, ComputeContext::for_backend(best_backend(), &pool), &out);
  ASSERT_TRUE(st.ok()) << st.message();
  const float fast_diff = max_abs_diff(out.dspark_hidden, r.hidden_prefill);
  std::printf("[%s %s] main_hidden_prefill max|d| %.3g (%lld elements differ)\n", name.c_str(), best_backend().name,
              fast_diff, static_cast<long long>(count_mismatches(out.dspark_hidden, r.hidden_prefill)));
  EXPECT_LE(fast_diff, kFastHiddenTolerance);
}

// End to end, the way the speculative loop will run it: the main forward's own hidden states (prefill, then the
// first decode step) into DSpark give the golden's first draft bit for bit (reference kernels).
TEST_P(DSparkGolden, EndToEndFirstDraftBitForBit) {
  const std::string name = GetParam();
  Model& m = model_for(name);
  ASSERT_TRUE(m.dspark);
  const Recorded r = load_recorded(name);
  const ComputeContext ctx = reference_ctx();
  kv::SequenceLease seq = m.open();
  const int64_t S = static_cast<int64_t>(r.prompt.size()), B = m.dspark->block_size();
  RowOptions options;
  options.dspark_hidden = true;
  options.logits = LogitsRows::kLast;
  ForwardBatch batch;
  batch.add(*seq, r.prompt.data(), S, options);
  ForwardOutput main;
  ASSERT_TRUE(forward(*m.weights, batch, ctx, &main).ok());
  DSparkOutput drafts;
  DSparkSegment seed{seq.get(), main.dspark_hidden.data(), 0, S, false, 0};
  ASSERT_TRUE(m.dspark->forward(&seed, 1, ctx, &drafts).ok());
  batch.clear();
  batch.add(*seq, &r.generated[0], 1, options);
  ASSERT_TRUE(forward(*m.weights, batch, ctx, &main).ok());
  int64_t best = 0;
  for (int64_t v = 1; v < m.checkpoint->config().vocab_size; ++v) best = main.logits[v] > main.logits[best] ? v : best;
  ASSERT_EQ(best, r.generated[1]);
  DSparkSegment step{seq.get(), main.dspark_hidden.data(), S, 1, true, static_cast<int32_t>(best)};
  ASSERT_TRUE(m.dspark->forward(&step, 1, ctx, &drafts).ok());
  EXPECT_EQ(std::vector<int64_t>(drafts.output_ids.begin(), drafts.output_ids.end()),
            std::vector<int64_t>(r.output_ids.begin(), r.output_ids.begin() + B + 1));
  EXPECT_EQ(count_mismatches(drafts.confidence, std::vector<float>(r.confidence.begin(), r.confidence.begin() + B)), 0);
  if (!r.logits.empty()) {
    const std::vector<float> golden(r.logits.begin(), r.logits.begin() + static_cast<int64_t>(drafts.logits.size()));
    EXPECT_EQ(count_mismatches(drafts.logits, golden), 0);
  }
}

// The stages on the recorded hidden states: ids, confidence and draft logits bit for bit on the reference path.
TEST_P(DSparkGolden, StagesOnRecordedHiddenBitForBit) {
  const std::string name = GetParam();
  Model& m = model_for(name);
  ASSERT_TRUE(m.dspark);
  const Recorded r = load_recorded(name);
  auto run = run_recorded(m, r, reference_ctx());
  ASSERT_TRUE(run.ok()) << run.status().message();
  std::vector<int64_t> ids(run->output_ids.begin(), run->output_ids.end());
  EXPECT_EQ(ids, r.output_ids);
  const int64_t bad_conf = count_mismatches(run->confidence, r.confidence);
  std::printf("[%s reference] %lld steps: output_ids %s, confidence %lld of %zu differ (max|d| %.3g)", name.c_str(),
              static_cast<long long>(r.steps()), ids == r.output_ids ? "equal" : "DIFFER",
              static_cast<long long>(bad_conf), r.confidence.size(), max_abs_diff(run->confidence, r.confidence));
  EXPECT_EQ(bad_conf, 0);
  if (!r.logits.empty()) {
    const int64_t bad_logits = count_mismatches(run->logits, r.logits);
    std::printf(", logits %lld of %zu differ (max|d| %.3g)", static_cast<long long>(bad_logits), r.logits.size(),
                max_abs_diff(run->logits, r.logits));
    EXPECT_EQ(bad_logits, 0);
  }
  std::printf("\n");
}

// The fast kernels (every SIMD table this CPU runs, two threads) on the same inputs: within the tolerances; a draft
// may differ only where the golden's top1-top2 margin is below the logits tolerance.
TEST_P(DSparkGolden, StagesOnRecordedHiddenFastPath) {
  const std::string name = GetParam();
  Model& m = model_for(name);
  ASSERT_TRUE(m.dspark);
  const Recorded r = load_recorded(name);
  ThreadPool pool(2);
  for (const Backend* backend : available_backends()) {
    if (backend == &reference_backend()) continue;
    SCOPED_TRACE(backend->name);
    auto run = run_recorded(m, r, ComputeContext::for_backend(*backend, &pool));
    ASSERT_TRUE(run.ok()) << run.status().message();
    const float conf_diff = max_abs_diff(run->confidence, r.confidence);
    std::printf("[%s %s] confidence max|d| %.3g", name.c_str(), backend->name, conf_diff);
    EXPECT_LE(conf_diff, kFastConfidenceTolerance);
    int64_t id_diffs = 0;
    for (size_t i = 0; i < r.output_ids.size(); ++i) id_diffs += run->output_ids[i] != r.output_ids[i];
    std::printf(", output ids differing %lld of %zu", static_cast<long long>(id_diffs), r.output_ids.size());
    if (r.logits.empty()) {
      std::printf("\n");
      EXPECT_EQ(id_diffs, 0);
      continue;
    }
    const float logits_diff = max_abs_diff(run->logits, r.logits);
    std::printf(", logits max|d| %.3g\n", logits_diff);
    EXPECT_LE(logits_diff, kFastLogitsTolerance);
    // The first differing draft of a step must follow a near tie (later ones see another Markov bias).
    const int64_t T = r.steps(), B = m.dspark->block_size(), V = static_cast<int64_t>(r.logits.size()) / (T * B);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < B; ++i) {
        const size_t k = static_cast<size_t>(t * (B + 1) + i + 1);
        if (run->output_ids[k] == r.output_ids[k]) continue;
        const float* row = &r.logits[static_cast<size_t>((t * B + i) * V)];
        float a = -INFINITY, b = -INFINITY;
        for (int64_t v = 0; v < V; ++v) {
          if (row[v] > a) {
            b = a;
            a = row[v];
          } else if (row[v] > b) {
            b = row[v];
          }
        }
        EXPECT_LT(a - b, 2 * kFastLogitsTolerance) << "step " << t << " draft " << i << " differs at a clear margin";
        break;
      }
    }
  }
}

// The stages' load-time tile-major copy (DSpark::to_tile_major, which the engine runs after the main layers') changes
// no bit of the fast path on the goldens (their block sums are exact, where every weight order agrees).
TEST_P(DSparkGolden, TileMajorStagesGiveTheSameBits) {
  const std::string name = GetParam();
  const Recorded r = load_recorded(name);
  Model m;  // its own: the copy rewrites the weights
  open_model(name, m);
  ASSERT_TRUE(m.dspark);
  ThreadPool pool(2);
  const ComputeContext ctx = ComputeContext::for_backend(best_backend(), &pool);
  auto before = run_recorded(m, r, ctx);
  ASSERT_TRUE(before.ok()) << before.status().message();
  const TileMajorFormats all{.fp8 = true, .fp4 = true};
  auto main_copied = m.weights->to_tile_major(*m.checkpoint, all, &pool);
  ASSERT_TRUE(main_copied.ok()) << main_copied.status().message();
  auto stages_copied = m.dspark->to_tile_major(*m.checkpoint, all, &pool);
  ASSERT_TRUE(stages_copied.ok()) << stages_copied.status().message();
  EXPECT_GT(*stages_copied, 0);
  // The copy looked at every FP8 code it wrote: the goldens hold no NaN code, so no copied weight may hold one.
  int64_t copied_fp8 = 0;
  for (const BlockWeights& block : m.weights->blocks())
    if (block.attention)
      block.attention->for_each_fp8_linear([&](Fp8Weight& w) {
        if (!w.tile_major) return;
        EXPECT_FALSE(w.may_hold_nan);
        ++copied_fp8;
      });
  EXPECT_GT(copied_fp8, 0);
  auto after = run_recorded(m, r, ctx);
  ASSERT_TRUE(after.ok()) << after.status().message();
  EXPECT_EQ(after->output_ids, before->output_ids);
  EXPECT_EQ(after->confidence, before->confidence);
  EXPECT_EQ(after->logits, before->logits);
}

INSTANTIATE_TEST_SUITE_P(Models, DSparkGolden, ::testing::Values("tiny-a", "tiny-b"));

// Two sequences in one call give what each gives alone, bit for bit (reference and fast kernels).
TEST(DSpark, BatchedDraftsEqualAlone) {
  if (!goldens_present()) GTEST_SKIP();
  Model& m = model_for("tiny-b");
  ASSERT_TRUE(m.dspark);
  const Recorded r = load_recorded("tiny-b");
  ThreadPool pool(2);
  for (const ComputeContext& ctx : {reference_ctx(), ComputeContext::for_backend(best_backend(), &pool)}) {
    SCOPED_TRACE(ctx.backend->name);
    // Sequence a: the prompt's first 40 rows; sequence b: the whole prompt (ring wrapped), then one decode row.
    kv::SequenceLease a1 = m.open(), b1 = m.open(), a2 = m.open(), b2 = m.open();
    const int64_t S = static_cast<int64_t>(r.prompt.size());
    DSparkOutput alone_a, alone_b, both;
    DSparkSegment sa{a1.get(), r.hidden_prefill.data(), 0, 40, true, 7};
    ASSERT_TRUE(m.dspark->forward(&sa, 1, ctx, &alone_a).ok());
    DSparkSegment seed{b1.get(), r.hidden_prefill.data(), 0, S, false, 0};
    DSparkOutput ignored;
    ASSERT_TRUE(m.dspark->forward(&seed, 1, ctx, &ignored).ok());
    DSparkSegment sb{b1.get(), r.hidden_decode.data(), S, 1, true, r.generated[1]};
    ASSERT_TRUE(m.dspark->forward(&sb, 1, ctx, &alone_b).ok());

    seed.state = b2.get();
    ASSERT_TRUE(m.dspark->forward(&seed, 1, ctx, &ignored).ok());
    DSparkSegment pair[2] = {{a2.get(), r.hidden_prefill.data(), 0, 40, true, 7},
                             {b2.get(), r.hidden_decode.data(), S, 1, true, r.generated[1]}};
    ASSERT_TRUE(m.dspark->forward(pair, 2, ctx, &both).ok());
    ASSERT_EQ(both.drafts.size(), 2u);
    EXPECT_EQ(both.drafts[1].segment, 1);
    EXPECT_EQ(both.drafts[1].first_position, S + 1);
    const size_t ids = alone_a.output_ids.size(), conf = alone_a.confidence.size(), logits = alone_a.logits.size();
    EXPECT_EQ(std::vector<int32_t>(both.output_ids.begin(), both.output_ids.begin() + ids), alone_a.output_ids);
    EXPECT_EQ(std::vector<int32_t>(both.output_ids.begin() + ids, both.output_ids.end()), alone_b.output_ids);
    EXPECT_EQ(count_mismatches(std::vector<float>(both.confidence.begin(), both.confidence.begin() + conf),
                               alone_a.confidence), 0);
    EXPECT_EQ(count_mismatches(std::vector<float>(both.confidence.begin() + conf, both.confidence.end()),
                               alone_b.confidence), 0);
    EXPECT_EQ(count_mismatches(std::vector<float>(both.logits.begin(), both.logits.begin() + logits), alone_a.logits), 0);
    EXPECT_EQ(count_mismatches(std::vector<float>(both.logits.begin() + logits, both.logits.end()), alone_b.logits), 0);
  }
}

// Context appended one row per call fills the rings exactly as one call over all rows (model.py's prefill
// seeding = its decode-step writes), so the drafts after them are equal.
TEST(DSpark, ContextRowByRowEqualsOneCall) {
  if (!goldens_present()) GTEST_SKIP();
  Model& m = model_for("tiny-b");
  ASSERT_TRUE(m.dspark);
  const Recorded r = load_recorded("tiny-b");
  const ComputeContext ctx = reference_ctx();
  const int64_t S = static_cast<int64_t>(r.prompt.size()), width = m.dspark->hidden_width();
  kv::SequenceLease one = m.open(), rows = m.open();
  DSparkOutput out_one, out_rows;
  DSparkSegment all{one.get(), r.hidden_prefill.data(), 0, S, true, r.generated[0]};
  ASSERT_TRUE(m.dspark->forward(&all, 1, ctx, &out_one).ok());
  for (int64_t p = 0; p < S; ++p) {
    DSparkSegment seg{rows.get(), &r.hidden_prefill[static_cast<size_t>(p * width)], p, 1, p == S - 1,
                      r.generated[0]};
    ASSERT_TRUE(m.dspark->forward(&seg, 1, ctx, &out_rows).ok());
  }
  const ModelConfig& config = m.checkpoint->config();
  for (int s = 0; s < m.dspark->num_stages(); ++s) {
    const WindowRing& a = one->window(config.n_layers + s);
    const WindowRing& b = rows->window(config.n_layers + s);
    for (int slot = 0; slot < a.window(); ++slot) {
      EXPECT_EQ(a.slot_position(slot), b.slot_position(slot));
      EXPECT_EQ(0, std::memcmp(a.slot_codes(slot), b.slot_codes(slot), static_cast<size_t>(a.head_dim())));
    }
  }
  EXPECT_EQ(out_one.output_ids, out_rows.output_ids);
  EXPECT_EQ(count_mismatches(out_one.logits, out_rows.logits), 0);
}

// The Markov head on its own: the bias of a token is its rank-r embedding times the head, in fp32 (checked against
// a double-precision sum: fp32 rounding only), and the draft logits are the unbiased head logits plus that bias.
TEST(DSpark, MarkovBiasIsTheEmbeddingTimesTheHead) {
  if (!goldens_present()) GTEST_SKIP();
  Model& m = model_for("tiny-a");
  ASSERT_TRUE(m.dspark);
  const ComputeContext ctx = reference_ctx();
  const ModelConfig& config = m.checkpoint->config();
  const int64_t V = config.vocab_size, rank = m.dspark->markov_rank();
  const int32_t tokens[3] = {0, 5, static_cast<int32_t>(V - 1)};
  std::vector<float> embed(static_cast<size_t>(3 * rank)), bias(static_cast<size_t>(3 * V));
  m.dspark->markov_bias(tokens, 3, ctx, embed.data(), bias.data());
  const TensorView* e = m.checkpoint->find("mtp.0.markov_head.embed.weight");
  const TensorView* h = m.checkpoint->find("mtp.0.markov_head.head.weight");
  ASSERT_TRUE(e && h);
  for (int k = 0; k < 3; ++k) {
    for (int64_t i = 0; i < rank; ++i) {
      EXPECT_EQ(embed[static_cast<size_t>(k * rank + i)], bf16_to_f32(e->as<uint16_t>()[tokens[k] * rank + i]));
    }
    for (int64_t v = 0; v < V; v += 97) {
      double sum = 0.0, magnitude = 0.0;
      for (int64_t i = 0; i < rank; ++i) {
        const double p = static_cast<double>(embed[static_cast<size_t>(k * rank + i)]) *
                         bf16_to_f32(h->as<uint16_t>()[v * rank + i]);
        sum += p;
        magnitude += std::fabs(p);
      }
      // rank fp32 roundings of partial sums bounded by the magnitude: |d| <= rank * 2^-24 * magnitude.
      EXPECT_NEAR(bias[static_cast<size_t>(k * V + v)], sum, static_cast<double>(rank) * 0x1p-24 * magnitude + 1e-30);
    }
  }
}

// Errors come before any state changes.
TEST(DSpark, RejectsBadSegmentsBeforeAnyChange) {
  if (!goldens_present()) GTEST_SKIP();
  Model& m = model_for("tiny-b");
  ASSERT_TRUE(m.dspark);
  const Recorded r = load_recorded("tiny-b");
  const ComputeContext ctx = reference_ctx();
  kv::SequenceLease seq = m.open();
  DSparkOutput out;
  const int first = m.dspark->first_layer();
  auto untouched = [&] {
    for (int s = 0; s < m.dspark->num_stages(); ++s) {
      const WindowRing& ring = seq->window(first + s);
      for (int slot = 0; slot < ring.window(); ++slot) {
        if (ring.slot_position(slot) != -1) return false;
      }
    }
    return true;
  };
  const int32_t vocab = static_cast<int32_t>(m.checkpoint->config().vocab_size);
  const std::vector<DSparkSegment> bad = {
      {nullptr, r.hidden_prefill.data(), 0, 4, false, 0},             // no state
      {seq.get(), nullptr, 0, 4, false, 0},                   // no rows
      {seq.get(), r.hidden_prefill.data(), 0, 0, true, 3},    // draft at position 0
      {seq.get(), r.hidden_prefill.data(), 0, 4, true, vocab},  // token outside the vocabulary
      {seq.get(), r.hidden_prefill.data(), 0, 0, false, 0},   // nothing to do
      {seq.get(), r.hidden_prefill.data(), -1, 4, false, 0},  // negative position
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    const Status st = m.dspark->forward(&bad[i], 1, ctx, &out);
    EXPECT_FALSE(st.ok()) << "case " << i;
    EXPECT_TRUE(untouched()) << "case " << i;
  }
  // A sequence twice in one call.
  const DSparkSegment twice[2] = {{seq.get(), r.hidden_prefill.data(), 0, 4, false, 0},
                                  {seq.get(), r.hidden_prefill.data(), 4, 4, false, 0}};
  EXPECT_FALSE(m.dspark->forward(twice, 2, ctx, &out).ok());
  EXPECT_TRUE(untouched());
  // A model without DSpark.
  auto plain = Checkpoint::open(golden_checkpoint_dir("tiny-c"));
  ASSERT_TRUE(plain.ok());
  auto plain_weights = ModelWeights::bind(*plain);
  ASSERT_TRUE(plain_weights.ok());
  EXPECT_FALSE(DSpark::bind(*plain, **plain_weights).ok());
}

// The forward hands out hidden states only for the segments that ask, for their rows past global_only, and a
// batch of two sequences gives each its own rows (as alone).
TEST(DSpark, ForwardHiddenRowsPerSegment) {
  if (!goldens_present()) GTEST_SKIP();
  Model& m = model_for("tiny-a");
  ASSERT_TRUE(m.dspark);
  const Recorded r = load_recorded("tiny-a");
  const ComputeContext ctx = reference_ctx();
  const int64_t width = m.dspark->hidden_width();
  kv::SequenceLease a = m.open(), b = m.open(), c = m.open();
  RowOptions ask;
  ask.dspark_hidden = true;
  RowOptions ask_tail = ask;
  ask_tail.global_only = 20;
  ForwardBatch batch;
  batch.add(*a, r.prompt.data(), 30, RowOptions{});
  batch.add(*b, r.prompt.data(), 25, ask);
  batch.add(*c, r.prompt.data(), 30, ask_tail);
  ForwardOutput out;
  Status st = forward(*m.weights, batch, ctx, &out);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(out.dspark_rows.size(), 25u + 10u);
  EXPECT_EQ(out.dspark_rows[0].segment, 1);
  EXPECT_EQ(out.dspark_rows[24].position, 24);
  EXPECT_EQ(out.dspark_rows[25].segment, 2);
  EXPECT_EQ(out.dspark_rows[25].position, 20);
  ASSERT_EQ(out.dspark_hidden.size(), static_cast<size_t>(35 * width));
  // Segment b alone is a 25-row official prefill: its rows are the golden prefill's first 25 rows.
  const std::vector<float> golden(r.hidden_prefill.begin(), r.hidden_prefill.begin() + 25 * width);
  EXPECT_EQ(count_mismatches(std::vector<float>(out.dspark_hidden.begin(), out.dspark_hidden.begin() + 25 * width),
                             golden), 0);
  // A model without DSpark targets refuses the flag.
  auto plain = Checkpoint::open(golden_checkpoint_dir("tiny-c"));
  ASSERT_TRUE(plain.ok());
  auto plain_weights = ModelWeights::bind(*plain);
  ASSERT_TRUE(plain_weights.ok());
  TestKv plain_kv(plain->config());
  kv::SequenceLease d = plain_kv.open();
  batch.clear();
  batch.add(*d, r.prompt.data(), 3, ask);
  EXPECT_FALSE(forward(**plain_weights, batch, ctx, &out).ok());
}

}  // namespace
}  // namespace dsflash
