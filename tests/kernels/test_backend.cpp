// The bit-exact entries of every Backend this CPU runs against the reference table on random ragged shapes:
// rmsnorm, mHC (mixes, pre, post), RoPE rotation, indexer scores, top-k and sparse attention, with and without
// threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "formats/formats.h"
#include "kernels/backend.h"
#include "test_backend_util.h"

namespace dsflash {
namespace {

std::vector<float> bf16_normals(std::mt19937& rng, int64_t n, float spread = 1.0f) {
  std::normal_distribution<float> normal(0.0f, spread);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = round_to_bf16(normal(rng));
  return v;
}

TEST(Backend, RmsnormBitForBit) {
  ThreadPool pool(3);
  const Backend& ref = reference_backend();
  for (const Backend* b : test::every_backend()) {
    std::mt19937 rng(31);
    for (int64_t rows : {1, 2, 5, 33}) {
      for (int64_t dim : {1, 7, 64, 129, 1024}) {
        const std::vector<float> x = bf16_normals(rng, rows * dim, 3.0f);
        std::vector<uint16_t> w(static_cast<size_t>(dim));
        const std::vector<float> wf = bf16_normals(rng, dim);
        for (int64_t i = 0; i < dim; ++i) w[static_cast<size_t>(i)] = f32_to_bf16(wf[static_cast<size_t>(i)]);
        std::vector<float> want(x.size()), got(x.size());
        ref.rmsnorm_bf16(x.data(), rows, dim, w.data(), 1e-6f, want.data(), nullptr);
        const std::string what = std::string(b->name) + " rows " + std::to_string(rows) + " dim " + std::to_string(dim);
        b->rmsnorm_bf16(x.data(), rows, dim, w.data(), 1e-6f, got.data(), &pool);
        test::expect_same_bits(got, want, what);
        got = x;  // in place (out aliases x)
        b->rmsnorm_bf16(got.data(), rows, dim, w.data(), 1e-6f, got.data(), nullptr);
        test::expect_same_bits(got, want, what + " in place");
      }
    }
  }
}

TEST(Backend, HcMixesPrePostBitForBit) {
  ThreadPool pool(3);
  const Backend& ref = reference_backend();
  for (const Backend* b : test::every_backend()) {
    std::mt19937 rng(32);
    for (int hc : {1, 4}) {
      for (int64_t dim : {8, 33, 256}) {
        for (int64_t tokens : {1, 3, 4, 5, 17}) {  // tokens*hc around torch's 16-float vector chunk
          HcShape shape;
          shape.hc = hc;
          shape.dim = dim;
          const int64_t flat = hc * dim;
          const std::vector<float> streams = bf16_normals(rng, tokens * flat);
          const std::vector<float> fn = bf16_normals(rng, shape.mix_count() * flat, 0.05f);
          const std::vector<float> base = bf16_normals(rng, shape.mix_count(), 0.5f);
          const std::vector<float> scale = {0.7f, 1.3f, 2.0f};
          const HcSiteWeights site{fn.data(), base.data(), scale.data()};
          const std::string what = std::string(b->name) + " hc " + std::to_string(hc) + " dim " +
                                   std::to_string(dim) + " tokens " + std::to_string(tokens);
          std::vector<float> pre(static_cast<size_t>(tokens * hc)), post(pre.size()),
              comb(static_cast<size_t>(tokens * hc * hc));
          std::vector<float> want_pre(pre.size()), want_post(pre.size()), want_comb(comb.size());
          ref.hc_mixes(streams.data(), tokens, site, shape, want_pre.data(), want_post.data(), want_comb.data(), nullptr);
          b->hc_mixes(streams.data(), tokens, site, shape, pre.data(), post.data(), comb.data(), &pool);
          test::expect_same_bits(pre, want_pre, "hc_mixes pre " + what);
          test::expect_same_bits(post, want_post, "hc_mixes post " + what);
          test::expect_same_bits(comb, want_comb, "hc_mixes comb " + what);

          std::vector<float> x(static_cast<size_t>(tokens * dim)), want_x(x.size());
          ref.hc_pre(streams.data(), tokens, hc, dim, want_pre.data(), want_x.data(), nullptr);
          b->hc_pre(streams.data(), tokens, hc, dim, want_pre.data(), x.data(), &pool);
          test::expect_same_bits(x, want_x, "hc_pre " + what);

          const std::vector<float> y = bf16_normals(rng, tokens * dim);
          std::vector<float> out(streams.size()), want_out(streams.size());
          ref.hc_post(y.data(), streams.data(), tokens, hc, dim, want_post.data(), want_comb.data(), want_out.data(),
                      nullptr);
          b->hc_post(y.data(), streams.data(), tokens, hc, dim, want_post.data(), want_comb.data(), out.data(), &pool);
          test::expect_same_bits(out, want_out, "hc_post " + what);
        }
      }
    }
  }
}

TEST(Backend, RopeRotateBitForBit) {
  const Backend& ref = reference_backend();
  for (const Backend* b : test::every_backend()) {
    std::mt19937 rng(33);
    std::uniform_real_distribution<float> angle(-100.0f, 100.0f);
    for (int64_t pairs : {1, 3, 8, 32}) {
      for (int64_t count : {1, 2, 7, 64}) {
        for (bool inverse : {false, true}) {
          const int64_t stride = 2 * pairs + 5;  // vectors inside wider rows (the rope tail of each head)
          const std::vector<float> x = bf16_normals(rng, count * stride);
          std::vector<float> c(static_cast<size_t>(pairs)), s(c.size());
          for (int64_t i = 0; i < pairs; ++i) {
            const float a = angle(rng);
            c[static_cast<size_t>(i)] = std::cos(a);
            s[static_cast<size_t>(i)] = std::sin(a);
          }
          std::vector<float> want = x, got = x;
          ref.rope_rotate(want.data(), count, stride, c.data(), s.data(), pairs, inverse);
          b->rope_rotate(got.data(), count, stride, c.data(), s.data(), pairs, inverse);
          test::expect_same_bits(got, want, std::string(b->name) + " pairs " + std::to_string(pairs) + " count " +
                                                std::to_string(count) + (inverse ? " inverse" : ""));
        }
      }
    }
  }
}

TEST(Backend, IndexScoresBitForBit) {
  const Backend& ref = reference_backend();
  for (const Backend* b : test::every_backend()) {
    std::mt19937 rng(34);
    std::uniform_real_distribution<float> wide(-30.0f, 30.0f);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int heads : {1, 3, 4, 5, 16, 64}) {
      for (int64_t dim : {7, 32, 128}) {
        for (int64_t keys : {1, 15, 16, 17, 100, 256}) {
          for (int64_t queries : {1, 3, 32}) {
            if (heads * dim * keys * queries > (int64_t{1} << 22)) continue;
            // wide exponents so that any change of summation order or fused rounding would show
            std::vector<float> q(static_cast<size_t>(queries * heads * dim)), k(static_cast<size_t>(keys * dim));
            for (float& v : q) v = round_to_bf16(normal(rng) * std::exp2(std::round(wide(rng) / 6.0f)));
            for (float& v : k) v = normal(rng) * std::exp2(std::round(wide(rng) / 6.0f));
            const std::vector<float> w = bf16_normals(rng, queries * heads, 0.1f);
            const int64_t stride = keys + 3;
            std::vector<float> want(static_cast<size_t>(queries * stride), -5.0f), got(want);
            IndexScoreArgs args;
            args.q = q.data();
            args.weights = w.data();
            args.keys = k.data();
            args.num_queries = queries;
            args.num_keys = keys;
            args.score_stride = stride;
            args.heads = heads;
            args.dim = dim;
            args.scores = want.data();
            ref.index_scores(args);
            args.scores = got.data();
            b->index_scores(args);
            test::expect_same_bits(got, want, std::string(b->name) + " heads " + std::to_string(heads) + " dim " +
                                                  std::to_string(dim) + " keys " + std::to_string(keys) +
                                                  " queries " + std::to_string(queries));
          }
        }
      }
    }
  }
}

TEST(Backend, TopkSelectSameIndices) {
  const Backend& ref = reference_backend();
  for (const Backend* b : test::every_backend()) {
    std::mt19937 rng(35);
    std::uniform_int_distribution<int> few(-4, 4);  // many ties
    for (int64_t n : {1, 2, 7, 64, 300, 2048}) {
      for (int64_t k : {1, 3, 16, 64, 512, 4096}) {
        std::vector<float> x(static_cast<size_t>(n));
        for (float& v : x) v = static_cast<float>(few(rng)) * 0.5f;
        if (n > 3) {
          x[1] = -0.0f;
          x[2] = -std::numeric_limits<float>::infinity();
        }
        const int64_t count = std::min(k, n);
        std::vector<int32_t> want(static_cast<size_t>(count)), got(want.size(), -9);
        ref.topk_select(x.data(), n, k, want.data(), nullptr, nullptr);
        b->topk_select(x.data(), n, k, got.data(), nullptr, nullptr);
        EXPECT_EQ(got, want) << b->name << " n " << n << " k " << k;
      }
    }
  }
}

TEST(Backend, SparseAttentionBitForBit) {
  ThreadPool pool(3);
  const Backend& ref = reference_backend();
  for (const Backend* b : test::every_backend()) {
    std::mt19937 rng(36);
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    for (int heads : {1, 5, 16, 17}) {
      for (int64_t dim : {8, 64, 72}) {
        for (int64_t entries : {1, 3, 63, 64, 65, 200}) {
          for (int64_t queries : {1, 3}) {
            const std::vector<float> q = bf16_normals(rng, queries * heads * dim);
            const std::vector<float> kv = bf16_normals(rng, queries * entries * dim);
            const std::vector<float> sink = bf16_normals(rng, heads);
            std::vector<const float*> rows(static_cast<size_t>(queries * entries));
            for (size_t j = 0; j < rows.size(); ++j) rows[j] = unit(rng) < 0.2 ? nullptr : &kv[j * dim];
            std::vector<float> want(q.size()), got(q.size(), -3.0f);
            SparseAttentionArgs a;
            a.q = q.data();
            a.rows = rows.data();
            a.sink = sink.data();
            a.num_queries = queries;
            a.num_entries = entries;
            a.heads = heads;
            a.dim = dim;
            a.scale = 0.125f;
            a.out = want.data();
            ref.sparse_attention(a, nullptr);
            a.out = got.data();
            b->sparse_attention(a, &pool);
            test::expect_same_bits(got, want, std::string(b->name) + " heads " + std::to_string(heads) + " dim " +
                                                  std::to_string(dim) + " entries " + std::to_string(entries) +
                                                  " queries " + std::to_string(queries));
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace dsflash
