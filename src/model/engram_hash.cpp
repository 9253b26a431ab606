// Engram hashing: numpy's default_rng port, the prime layout and the per-sequence n-gram hasher
// (spec/MODEL.md §4.8, official engram.py).
#include "model/engram_hash.h"

#include <algorithm>
#include <array>
#include <limits>
#include <set>
#include <string>

#include "io/model_config.h"

namespace dsflash {

namespace {

using u128 = unsigned __int128;

// numpy SeedSequence (bit_generator.pyx): pool of 4 uint32 words mixed from the entropy words.
class SeedSequence {
 public:
  explicit SeedSequence(uint64_t seed) {
    // _coerce_to_uint32_array(int): little-endian 32-bit words, [0] for 0.
    std::vector<uint32_t> entropy;
    do {
      entropy.push_back(static_cast<uint32_t>(seed & 0xffffffffu));
      seed >>= 32;
    } while (seed != 0);
    mix_entropy(entropy);
  }

  // generate_state(n_words64, np.uint64): 2*n 32-bit words viewed as little-endian uint64.
  std::vector<uint64_t> generate_state_u64(int n_words64) const {
    std::vector<uint32_t> words(static_cast<size_t>(2 * n_words64));
    uint32_t hash_const = kInitB;
    for (size_t i = 0; i < words.size(); ++i) {
      uint32_t value = pool_[i % kPoolSize];
      value ^= hash_const;
      hash_const *= kMultB;
      value *= hash_const;
      value ^= value >> kXShift;
      words[i] = value;
    }
    std::vector<uint64_t> out(static_cast<size_t>(n_words64));
    for (size_t i = 0; i < out.size(); ++i) {
      out[i] = static_cast<uint64_t>(words[2 * i]) | (static_cast<uint64_t>(words[2 * i + 1]) << 32);
    }
    return out;
  }

 private:
  static constexpr int kPoolSize = 4;
  static constexpr uint32_t kInitA = 0x43b0d7e5u;
  static constexpr uint32_t kMultA = 0x931e8875u;
  static constexpr uint32_t kInitB = 0x8b51f9ddu;
  static constexpr uint32_t kMultB = 0x58f38dedu;
  static constexpr uint32_t kMixMultL = 0xca01f9ddu;
  static constexpr uint32_t kMixMultR = 0x4973f715u;
  static constexpr int kXShift = 16;

  static uint32_t hashmix(uint32_t value, uint32_t* hash_const) {
    value ^= *hash_const;
    *hash_const *= kMultA;
    value *= *hash_const;
    value ^= value >> kXShift;
    return value;
  }
  static uint32_t mix(uint32_t x, uint32_t y) {
    uint32_t result = kMixMultL * x - kMixMultR * y;
    result ^= result >> kXShift;
    return result;
  }

  void mix_entropy(const std::vector<uint32_t>& entropy) {
    uint32_t hash_const = kInitA;
    for (size_t i = 0; i < kPoolSize; ++i) {
      pool_[i] = hashmix(i < entropy.size() ? entropy[i] : 0u, &hash_const);
    }
    for (size_t src = 0; src < kPoolSize; ++src) {
      for (size_t dst = 0; dst < kPoolSize; ++dst) {
        if (src != dst) pool_[dst] = mix(pool_[dst], hashmix(pool_[src], &hash_const));
      }
    }
    for (size_t src = kPoolSize; src < entropy.size(); ++src) {
      for (size_t dst = 0; dst < kPoolSize; ++dst) {
        pool_[dst] = mix(pool_[dst], hashmix(entropy[src], &hash_const));
      }
    }
  }

  std::array<uint32_t, kPoolSize> pool_{};
};

// numpy PCG64: 128-bit LCG, XSL-RR output, seeded from SeedSequence.generate_state(4, uint64).
class Pcg64 {
 public:
  explicit Pcg64(const SeedSequence& seq) {
    const std::vector<uint64_t> v = seq.generate_state_u64(4);
    const u128 init_state = (static_cast<u128>(v[0]) << 64) | v[1];
    const u128 init_seq = (static_cast<u128>(v[2]) << 64) | v[3];
    state_ = 0;
    inc_ = (init_seq << 1) | 1;
    step();
    state_ += init_state;
    step();
  }

  uint64_t next64() {
    step();
    const uint64_t hi = static_cast<uint64_t>(state_ >> 64);
    const uint64_t lo = static_cast<uint64_t>(state_);
    const unsigned rot = static_cast<unsigned>(state_ >> 122);
    const uint64_t x = hi ^ lo;
    return (x >> rot) | (x << ((64 - rot) & 63));
  }

  uint32_t next32() {  // numpy buffers the high half of a 64-bit draw
    if (has_uint32_) {
      has_uint32_ = false;
      return buffered_;
    }
    const uint64_t next = next64();
    has_uint32_ = true;
    buffered_ = static_cast<uint32_t>(next >> 32);
    return static_cast<uint32_t>(next & 0xffffffffu);
  }

 private:
  void step() {
    const u128 mult = (static_cast<u128>(2549297995355413924ULL) << 64) | 4865540595714422341ULL;
    state_ = state_ * mult + inc_;
  }
  u128 state_ = 0;
  u128 inc_ = 0;
  bool has_uint32_ = false;
  uint32_t buffered_ = 0;
};

// Lemire's method exactly as numpy's bounded_lemire_uint64 / buffered_bounded_lemire_uint32 (rng = high - 1).
uint64_t bounded_lemire_u64(Pcg64& gen, uint64_t rng) {
  const uint64_t rng_excl = rng + 1;
  u128 m = static_cast<u128>(gen.next64()) * rng_excl;
  uint64_t leftover = static_cast<uint64_t>(m);
  if (leftover < rng_excl) {
    const uint64_t threshold = (std::numeric_limits<uint64_t>::max() - rng) % rng_excl;
    while (leftover < threshold) {
      m = static_cast<u128>(gen.next64()) * rng_excl;
      leftover = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

uint32_t bounded_lemire_u32(Pcg64& gen, uint32_t rng) {
  const uint32_t rng_excl = rng + 1;
  uint64_t m = static_cast<uint64_t>(gen.next32()) * rng_excl;
  uint32_t leftover = static_cast<uint32_t>(m);
  if (leftover < rng_excl) {
    const uint32_t threshold = (std::numeric_limits<uint32_t>::max() - rng) % rng_excl;
    while (leftover < threshold) {
      m = static_cast<uint64_t>(gen.next32()) * rng_excl;
      leftover = static_cast<uint32_t>(m);
    }
  }
  return static_cast<uint32_t>(m >> 32);
}

uint64_t mulmod(uint64_t a, uint64_t b, uint64_t m) { return static_cast<uint64_t>(static_cast<u128>(a) * b % m); }

uint64_t powmod(uint64_t base, uint64_t exp, uint64_t m) {
  uint64_t result = 1 % m;
  base %= m;
  while (exp) {
    if (exp & 1) result = mulmod(result, base, m);
    base = mulmod(base, base, m);
    exp >>= 1;
  }
  return result;
}

// engram.py find_next_prime: smallest prime above `start` not handed out yet.
int64_t find_next_prime(int64_t start, const std::set<int64_t>& seen) {
  int64_t candidate = start + 1;
  while (candidate < 2 || !is_prime_u64(static_cast<uint64_t>(candidate)) || seen.count(candidate)) ++candidate;
  return candidate;
}

}  // namespace

std::vector<int64_t> numpy_default_rng_integers(uint64_t seed, int64_t high, int64_t count) {
  std::vector<int64_t> out(static_cast<size_t>(std::max<int64_t>(count, 0)), 0);
  if (high <= 1) return out;  // rng == 0: numpy returns `low` without drawing
  Pcg64 gen{SeedSequence(seed)};
  const uint64_t rng = static_cast<uint64_t>(high - 1);
  for (auto& value : out) {
    if (rng <= 0xffffffffULL) {
      value = rng == 0xffffffffULL ? gen.next32() : bounded_lemire_u32(gen, static_cast<uint32_t>(rng));
    } else {
      value = static_cast<int64_t>(bounded_lemire_u64(gen, rng));
    }
  }
  return out;
}

bool is_prime_u64(uint64_t n) {
  if (n < 2) return false;
  for (uint64_t p : {2ULL, 3ULL, 5ULL, 7ULL, 11ULL, 13ULL, 17ULL, 19ULL, 23ULL, 29ULL, 31ULL, 37ULL}) {
    if (n % p == 0) return n == p;
  }
  uint64_t d = n - 1;
  int r = 0;
  while ((d & 1) == 0) {
    d >>= 1;
    ++r;
  }
  // These bases make Miller-Rabin deterministic for all n < 2^64.
  for (uint64_t a : {2ULL, 3ULL, 5ULL, 7ULL, 11ULL, 13ULL, 17ULL, 19ULL, 23ULL, 29ULL, 31ULL, 37ULL}) {
    uint64_t x = powmod(a, d, n);
    if (x == 1 || x == n - 1) continue;
    bool composite = true;
    for (int i = 1; i < r; ++i) {
      x = mulmod(x, x, n);
      if (x == n - 1) {
        composite = false;
        break;
      }
    }
    if (composite) return false;
  }
  return true;
}

int EngramHashLayout::layer_index(int layer_id) const {
  const auto it = std::find(layer_ids.begin(), layer_ids.end(), layer_id);
  return it == layer_ids.end() ? -1 : static_cast<int>(it - layer_ids.begin());
}

Result<EngramHashLayout> EngramHashLayout::create(const ModelConfig& config, int64_t compressed_vocab_size) {
  const std::string where = "Engram hash layout: ";
  if (config.engram_layer_ids.empty()) return Status::Error(where + "config.engram_layer_ids is empty");
  if (config.engram_max_ngram_size < 2) {
    return Status::Error(where + "config.engram_max_ngram_size = " + std::to_string(config.engram_max_ngram_size) +
                         ", need >= 2 (one n-gram order at least)");
  }
  if (config.engram_n_heads < 1) {
    return Status::Error(where + "config.engram_n_heads = " + std::to_string(config.engram_n_heads) + ", need >= 1");
  }
  if (config.engram_vocab_size < 0) return Status::Error(where + "config.engram_vocab_size is negative");
  if (config.engram_num_embeddings.size() != config.engram_layer_ids.size()) {
    return Status::Error(where + "config.engram_num_embeddings has " +
                         std::to_string(config.engram_num_embeddings.size()) + " entries, engram_layer_ids " +
                         std::to_string(config.engram_layer_ids.size()));
  }
  if (compressed_vocab_size < 1) {
    return Status::Error(where + "compressed vocab size " + std::to_string(compressed_vocab_size) + " < 1");
  }
  if (config.engram_compressed_vocab_size > 0 && config.engram_compressed_vocab_size != compressed_vocab_size) {
    // engram.py asserts this: every multiplier derives from the size, so a mismatch rehashes everything.
    return Status::Error(where + "the tokenizer gives a compressed vocab of " + std::to_string(compressed_vocab_size) +
                         " ids but config.engram_compressed_vocab_size = " +
                         std::to_string(config.engram_compressed_vocab_size));
  }

  EngramHashLayout layout;
  layout.max_ngram = config.engram_max_ngram_size;
  layout.n_heads = config.engram_n_heads;
  layout.compressed_vocab_size = compressed_vocab_size;
  layout.layer_ids = config.engram_layer_ids;

  const int64_t max_long = std::numeric_limits<int64_t>::max();
  const int64_t bound = std::max<int64_t>(1, (max_long / compressed_vocab_size) / 2);
  std::set<int64_t> seen;
  for (size_t e = 0; e < layout.layer_ids.size(); ++e) {
    const int layer_id = layout.layer_ids[e];
    if (layer_id < 0) return Status::Error(where + "negative engram layer id " + std::to_string(layer_id));
    std::vector<int64_t> mult =
        numpy_default_rng_integers(10007ULL * static_cast<uint64_t>(layer_id), bound, layout.max_ngram);
    for (auto& m : mult) m = m * 2 + 1;
    layout.multipliers.push_back(std::move(mult));

    // Each order restarts at engram_vocab_size - 1 and skips primes already handed out (a global walk).
    std::vector<std::vector<int64_t>> per_order;
    std::vector<int64_t> offsets;
    int64_t total = 0;
    for (int order = 2; order <= layout.max_ngram; ++order) {
      std::vector<int64_t> sizes;
      int64_t current = config.engram_vocab_size - 1;
      for (int head = 0; head < layout.n_heads; ++head) {
        current = find_next_prime(current, seen);
        seen.insert(current);
        sizes.push_back(current);
        offsets.push_back(total);
        total += current;
      }
      per_order.push_back(std::move(sizes));
    }
    layout.primes.push_back(std::move(per_order));
    layout.offsets.push_back(std::move(offsets));
    layout.num_rows.push_back(total);
    if (config.engram_num_embeddings[e] != total) {
      return Status::Error(where + "engram layer " + std::to_string(layer_id) + ": Σ primes = " +
                           std::to_string(total) + " rows but config.engram_num_embeddings[" + std::to_string(e) +
                           "] = " + std::to_string(config.engram_num_embeddings[e]));
    }
  }
  return layout;
}

Result<NgramHasher> NgramHasher::create(const ModelConfig& config, std::vector<int32_t> token_map,
                                        int64_t compressed_vocab_size) {
  auto layout = EngramHashLayout::create(config, compressed_vocab_size);
  if (!layout.ok()) return layout.status();
  if (config.engram_pad_id < 0 || static_cast<size_t>(config.engram_pad_id) >= token_map.size()) {
    return Status::Error("Engram hasher: config.engram_pad_id " + std::to_string(config.engram_pad_id) +
                         " outside the token map of " + std::to_string(token_map.size()) + " ids");
  }
  for (size_t i = 0; i < token_map.size(); ++i) {
    if (token_map[i] < 0 || token_map[i] >= compressed_vocab_size) {
      return Status::Error("Engram hasher: token map entry " + std::to_string(i) + " = " +
                           std::to_string(token_map[i]) + " outside [0, " + std::to_string(compressed_vocab_size) +
                           ")");
    }
  }
  NgramHasher hasher;
  hasher.layout_ = std::move(layout.value());
  hasher.pad_id_ = token_map[static_cast<size_t>(config.engram_pad_id)];
  hasher.token_map_ = std::move(token_map);
  return hasher;
}

Status NgramHasher::hash(const int32_t* tokens, int64_t num_tokens, int64_t start_pos, kv::EngramHistory* history,
                         int64_t* out, const uint8_t* dead, Arena* scratch) const {
  const int max_ngram = layout_.max_ngram;
  const size_t keep = static_cast<size_t>(max_ngram - 1);
  if (history == nullptr) return Status::Error("Engram hasher: no history given");
  if (num_tokens < 0) return Status::Error("Engram hasher: negative token count");
  if (start_pos != history->num_positions()) {
    return Status::Error("Engram hasher: start_pos " + std::to_string(start_pos) + " but the history has seen " +
                         std::to_string(history->num_positions()) + " positions");
  }
  if (static_cast<size_t>(history->capacity()) != keep) {
    return Status::Error("Engram hasher: the history keeps " + std::to_string(history->capacity()) +
                         " ids, the hasher needs " + std::to_string(keep));
  }
  Arena own;
  Arena& arena = scratch != nullptr ? *scratch : own;
  ArenaScope scope(arena);
  // Compressed ids of this call (kDead inside image spans), validated before anything changes.
  const std::span<int64_t> compressed = arena.take<int64_t>(static_cast<size_t>(num_tokens));
  for (int64_t i = 0; i < num_tokens; ++i) {
    const int32_t id = tokens[i];
    if (id < 0 || static_cast<size_t>(id) >= token_map_.size()) {
      return Status::Error("Engram hasher: token " + std::to_string(i) + " (position " +
                           std::to_string(start_pos + i) + ") has id " + std::to_string(id) +
                           " outside the token map of " + std::to_string(token_map_.size()) + " ids");
    }
    compressed[static_cast<size_t>(i)] =
        (dead != nullptr && dead[i]) ? kv::EngramHistory::kDead : token_map_[static_cast<size_t>(id)];
  }

  if (out != nullptr) {
    const int num_layers = layout_.num_layers();
    const int columns = layout_.columns();
    const std::span<const int64_t> recent = history->recent();
    const int64_t history_len = static_cast<int64_t>(recent.size());
    const std::span<int64_t> window = arena.take<int64_t>(static_cast<size_t>(max_ngram));  // t_0 (current) .. t_{N-1}
    for (int64_t i = 0; i < num_tokens; ++i) {
      bool blocked = false;
      for (int shift = 0; shift < max_ngram; ++shift) {
        const int64_t j = i - shift;  // index relative to this call
        int64_t source = kv::EngramHistory::kDead;
        if (start_pos + j < 0) {
          blocked = true;  // before the sequence start
        } else if (j >= 0) {
          source = compressed[static_cast<size_t>(j)];
        } else {
          source = recent[static_cast<size_t>(history_len + j)];
        }
        if (source == kv::EngramHistory::kDead) blocked = true;
        window[static_cast<size_t>(shift)] = blocked ? pad_id_ : source;
      }
      for (int e = 0; e < num_layers; ++e) {
        const auto& mult = layout_.multipliers[static_cast<size_t>(e)];
        const auto& offsets = layout_.offsets[static_cast<size_t>(e)];
        int64_t* row = out + (i * num_layers + e) * columns;
        // Products never overflow: ids < V and multipliers <= int64max / V.
        int64_t rolling = window[0] * mult[0];
        for (int k = 1; k < max_ngram; ++k) {
          rolling ^= window[static_cast<size_t>(k)] * mult[static_cast<size_t>(k)];
          const auto& primes = layout_.primes[static_cast<size_t>(e)][static_cast<size_t>(k - 1)];
          for (int h = 0; h < layout_.n_heads; ++h) {
            const int col = (k - 1) * layout_.n_heads + h;
            row[col] = rolling % primes[static_cast<size_t>(h)] + offsets[static_cast<size_t>(col)];
          }
        }
      }
    }
  }

  // Keep the last N-1 compressed ids for the next call.
  history->append(compressed);
  return Status::Ok();
}

Status NgramHasher::restore_history(const int32_t* tokens, int64_t end_pos, kv::EngramHistory* history) const {
  if (history == nullptr) return Status::Error("Engram hasher: no history given");
  const int64_t keep = std::min<int64_t>(layout_.max_ngram - 1, end_pos);
  std::vector<int64_t> recent(static_cast<size_t>(keep));
  for (int64_t i = 0; i < keep; ++i) {
    const int32_t id = tokens[end_pos - keep + i];
    if (id < 0 || static_cast<size_t>(id) >= token_map_.size()) {
      return Status::Error("Engram hasher: token id " + std::to_string(id) + " outside the token map");
    }
    recent[static_cast<size_t>(i)] = token_map_[static_cast<size_t>(id)];
  }
  return history->restore(end_pos, recent);
}

}  // namespace dsflash
