#include "tokenizer/bpe.h"

#include <mutex>
#include <queue>

#include <nlohmann/json.hpp>

namespace dsflash {

bool BpeCache::lookup(std::string_view piece, std::vector<int32_t>& out) const {
  std::shared_lock lock(mutex_);
  auto it = map_.find(piece);
  if (it == map_.end()) {
    misses_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  out.insert(out.end(), it->second.begin(), it->second.end());
  hits_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void BpeCache::insert(std::string_view piece, const int32_t* ids, size_t num_ids) {
  if (piece.size() > kMaxPieceBytes) return;
  std::unique_lock lock(mutex_);
  if (map_.size() >= max_entries_) return;
  map_.try_emplace(std::string(piece), ids, ids + num_ids);
}

size_t BpeCache::size() const {
  std::shared_lock lock(mutex_);
  return map_.size();
}

namespace {

// Splits a merge entry ("a b" string, or ["a", "b"] in newer files) into its two halves.
Result<std::pair<std::string, std::string>> parse_merge(const nlohmann::json& entry, size_t rank) {
  if (entry.is_string()) {
    const auto& s = entry.get_ref<const std::string&>();
    const size_t space = s.find(' ');
    if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
      return Status::Error("model.merges[" + std::to_string(rank) + "] '" + s + "' is not two tokens joined by a space");
    }
    return std::make_pair(s.substr(0, space), s.substr(space + 1));
  }
  if (entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_string()) {
    return std::make_pair(entry[0].get<std::string>(), entry[1].get<std::string>());
  }
  return Status::Error("model.merges[" + std::to_string(rank) + "] is neither \"a b\" nor [\"a\", \"b\"]");
}

}  // namespace

Result<BpeModel> BpeModel::from_json(const nlohmann::json& model, size_t cache_entries) {
  if (!model.is_object()) return Status::Error("model: not an object");
  if (model.value("type", "") != "BPE") {
    return Status::Error("model type '" + model.value("type", std::string("(missing)")) +
                         "' is not implemented (only BPE)");
  }
  auto non_null = [&](const char* key) { return model.contains(key) && !model[key].is_null(); };
  if (non_null("dropout") && model["dropout"].is_number() && model["dropout"].get<double>() != 0.0) {
    return Status::Error("model.dropout is not implemented (must be null)");
  }
  if (non_null("continuing_subword_prefix") && !model["continuing_subword_prefix"].get<std::string>().empty()) {
    return Status::Error("model.continuing_subword_prefix is not implemented (must be null)");
  }
  if (non_null("end_of_word_suffix") && !model["end_of_word_suffix"].get<std::string>().empty()) {
    return Status::Error("model.end_of_word_suffix is not implemented (must be null)");
  }
  if (model.value("byte_fallback", false)) return Status::Error("model.byte_fallback=true is not implemented");
  if (!model.contains("vocab") || !model["vocab"].is_object()) return Status::Error("model.vocab: missing object");
  if (!model.contains("merges") || !model["merges"].is_array()) return Status::Error("model.merges: missing array");

  BpeModel m;
  m.ignore_merges_ = model.value("ignore_merges", false);
  const auto& vocab = model["vocab"];
  m.vocab_.reserve(vocab.size());
  int64_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() > (1 << 30)) {
      return Status::Error("model.vocab['" + it.key() + "']: id is not a non-negative integer");
    }
    const auto id = it.value().get<int64_t>();
    m.vocab_.emplace(it.key(), static_cast<int32_t>(id));
    max_id = std::max(max_id, id);
  }
  m.id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  m.assigned_.assign(static_cast<size_t>(max_id + 1), false);
  for (const auto& [token, id] : m.vocab_) {
    m.id_to_token_[id] = token;
    m.assigned_[id] = true;
  }
  for (int b = 0; b < 256; ++b) {
    auto it = m.vocab_.find(m.alphabet_.char_of_byte(static_cast<uint8_t>(b)));
    m.byte_ids_[b] = it == m.vocab_.end() ? -1 : it->second;
  }
  const auto& merges = model["merges"];
  m.merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    auto pair = parse_merge(merges[rank], rank);
    if (!pair.ok()) return pair.status();
    const auto& [left, right] = *pair;
    auto l = m.vocab_.find(left);
    auto r = m.vocab_.find(right);
    auto merged = m.vocab_.find(left + right);
    if (l == m.vocab_.end() || r == m.vocab_.end() || merged == m.vocab_.end()) {
      return Status::Error("model.merges[" + std::to_string(rank) + "] '" + left + " " + right +
                           "': a part or the merged token is not in the vocab");
    }
    // A repeated pair keeps its first (best) rank.
    m.merges_.try_emplace(pair_key(l->second, r->second), Merge{static_cast<int32_t>(rank), merged->second});
  }
  m.cache_ = std::make_unique<BpeCache>(cache_entries);
  return m;
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || id >= id_limit() || !assigned_[id]) return nullptr;
  return &id_to_token_[id];
}

// Hugging Face's Word::merge_all: a min-heap of (rank, position) over adjacent pairs; pop the best, skip stale
// entries (the pair there no longer yields the same token), merge, push the two new neighbour pairs.
void BpeModel::merge_word(std::vector<int32_t>& symbols) const {
  const size_t n = symbols.size();
  if (n < 2) return;
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  std::vector<Symbol> sym(n);
  for (size_t i = 0; i < n; ++i) {
    sym[i] = {symbols[i], static_cast<int32_t>(i) - 1, i + 1 < n ? static_cast<int32_t>(i + 1) : -1, true};
  }
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  for (size_t i = 0; i + 1 < n; ++i) {
    auto it = merges_.find(pair_key(sym[i].id, sym[i + 1].id));
    if (it != merges_.end()) queue.push({it->second.rank, static_cast<int32_t>(i), it->second.new_id});
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& cur = sym[top.pos];
    if (!cur.alive || cur.next < 0) continue;
    const int32_t next_pos = cur.next;
    auto it = merges_.find(pair_key(cur.id, sym[next_pos].id));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;
    cur.id = top.new_id;
    cur.next = sym[next_pos].next;
    sym[next_pos].alive = false;
    if (cur.next >= 0) sym[cur.next].prev = top.pos;
    if (cur.prev >= 0) {
      auto p = merges_.find(pair_key(sym[cur.prev].id, cur.id));
      if (p != merges_.end()) queue.push({p->second.rank, cur.prev, p->second.new_id});
    }
    if (cur.next >= 0) {
      auto q = merges_.find(pair_key(cur.id, sym[cur.next].id));
      if (q != merges_.end()) queue.push({q->second.rank, top.pos, q->second.new_id});
    }
  }
  symbols.clear();
  for (const auto& s : sym)
    if (s.alive) symbols.push_back(s.id);
}

void BpeModel::tokenize_piece_uncached(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    if (auto id = token_to_id(alphabet_.encode(piece))) {
      out.push_back(*id);
      return;
    }
  }
  std::vector<int32_t> symbols;
  symbols.reserve(piece.size());
  for (char c : piece) {
    const int32_t id = byte_ids_[static_cast<uint8_t>(c)];
    if (id >= 0) symbols.push_back(id);  // a byte missing from the vocab is dropped (no unk token)
  }
  merge_word(symbols);
  out.insert(out.end(), symbols.begin(), symbols.end());
}

void BpeModel::tokenize_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() <= BpeCache::kMaxPieceBytes && cache_->lookup(piece, out)) return;
  const size_t start = out.size();
  tokenize_piece_uncached(piece, out);
  cache_->insert(piece, out.data() + start, out.size() - start);
}

}  // namespace dsflash
