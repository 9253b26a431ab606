// Engram n-gram hashing (spec/MODEL.md §4.8; official engram.py: compute_hash_multipliers, EngramLayout,
// NgramHashState). Token ids -> compressed ids (tokenizer/engram_token_map.h) -> per position the
// (max_ngram-1) x n_heads table row ids of the n-grams ending there, per Engram layer.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/workspace.h"
#include "kv/state_storage.h"

namespace dsflash {

struct ModelConfig;

// numpy.random.default_rng(seed).integers(0, high, size=count, dtype=np.int64), bit for bit:
// SeedSequence(seed) -> PCG64 (XSL-RR 128/64) -> Lemire's bounded integers as numpy draws them.
// high >= 1 (high == 1 gives zeros without drawing, as numpy does). seed >= 0.
std::vector<int64_t> numpy_default_rng_integers(uint64_t seed, int64_t high, int64_t count);

// Deterministic primality test for any non-negative int64 (engram.py uses sympy.isprime).
bool is_prime_u64(uint64_t n);

// Multipliers, primes and offsets of every Engram layer. Shapes use E = number of Engram layers,
// N = max_ngram, O = N - 1 n-gram orders (2..N), H = n_heads, C = O * H hash columns per layer.
struct EngramHashLayout {
  int max_ngram = 0;                 // engram_max_ngram_size (N)
  int n_heads = 0;                   // engram_n_heads (H)
  int64_t compressed_vocab_size = 0; // from the token map; every multiplier derives from it
  std::vector<int> layer_ids;        // [E] engram_layer_ids, in config order (= hash column block order)
  // [E][N] odd multipliers: default_rng(10007 * layer_id).integers(0, (int64max // V) // 2, N) * 2 + 1
  std::vector<std::vector<int64_t>> multipliers;
  // [E][O][H] bucket moduli: distinct primes, walked upward from engram_vocab_size - 1 in layer, order, head order
  std::vector<std::vector<std::vector<int64_t>>> primes;
  // [E][C] row offset of column c = (order-2)*H + head: exclusive prefix sum of that layer's primes
  std::vector<std::vector<int64_t>> offsets;
  // [E] table rows of each layer = Σ of its primes (must equal config.engram_num_embeddings)
  std::vector<int64_t> num_rows;

  int num_layers() const { return static_cast<int>(layer_ids.size()); }
  int columns() const { return (max_ngram - 1) * n_heads; }  // C
  // Index of `layer_id` in layer_ids, or -1.
  int layer_index(int layer_id) const;

  // Errors: no Engram layers / bad sizes; compressed_vocab_size != config.engram_compressed_vocab_size
  // (when the config states one); Σ primes != config.engram_num_embeddings[e].
  static Result<EngramHashLayout> create(const ModelConfig& config, int64_t compressed_vocab_size);
};

// Hashes token ids of one sequence. Immutable after creation; shareable between threads/sequences.
class NgramHasher {
 public:
  // token_map: [num_token_ids] compressed id of each token id (EngramTokenMap::ids()), values in
  // [0, compressed_vocab_size). The pad id is token_map[config.engram_pad_id].
  static Result<NgramHasher> create(const ModelConfig& config, std::vector<int32_t> token_map,
                                    int64_t compressed_vocab_size);

  const EngramHashLayout& layout() const { return layout_; }
  int num_layers() const { return layout_.num_layers(); }
  int columns() const { return layout_.columns(); }
  int64_t pad_compressed_id() const { return pad_id_; }

  // Sets `history` to what hashing positions [0, end_pos) would have left (the compressed ids of the last N-1 of
  // them): tokens [end_pos] are the sequence's ids from position 0 (a restored cached prefix; no image spans).
  Status restore_history(const int32_t* tokens, int64_t end_pos, kv::EngramHistory* history) const;
  // tokens [num_tokens] at absolute positions start_pos .. start_pos+num_tokens-1; start_pos must equal
  // history->num_positions() (errors otherwise), so one prefill, chunked prefill and token-by-token decode
  // give identical ids. dead: optional [num_tokens], nonzero = inside an image span (no n-gram crosses it;
  // its own ids are hashed from pads). out: [num_tokens, num_layers, columns] int64 table row ids including
  // the per-column offsets (golden `prefill.engram_hash` layout); may be nullptr to only advance the history.
  // Look-back rule (engram.py): shift s = 0..N-1 reads position p-s; past the sequence start or at a dead
  // token the slot and every longer shift become pad. hash(order k) = (XOR_{s<k} t_s * m_s) % prime + offset.
  // scratch: memory for the call's buffers, given back before it returns (nullptr: a private arena, which
  // allocates).
  Status hash(const int32_t* tokens, int64_t num_tokens, int64_t start_pos, kv::EngramHistory* history,
              int64_t* out, const uint8_t* dead = nullptr, Arena* scratch = nullptr) const;

 private:
  EngramHashLayout layout_;
  std::vector<int32_t> token_map_;
  int64_t pad_id_ = 0;
};

}  // namespace dsflash
