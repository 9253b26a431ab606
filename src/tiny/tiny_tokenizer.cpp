// Tokenizer restriction for make-tiny (see tiny_tokenizer.h).
#include "tiny/tiny_tokenizer.h"

#include <cstdlib>
#include <filesystem>
#include <unordered_set>

#include <nlohmann/json.hpp>

namespace dsflash::tiny {

namespace {

using ordered_json = nlohmann::ordered_json;

// A merge "a b" as its two parts (the V3 file stores merges as space-joined strings; newer files as pairs).
bool merge_parts(const ordered_json& merge, std::string* left, std::string* right) {
  if (merge.is_string()) {
    const std::string text = merge.get<std::string>();
    const size_t space = text.find(' ');
    if (space == std::string::npos) return false;
    *left = text.substr(0, space);
    *right = text.substr(space + 1);
    return true;
  }
  if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
    *left = merge[0].get<std::string>();
    *right = merge[1].get<std::string>();
    return true;
  }
  return false;
}

// Builds an ordered_json DOM from SAX events, appending object members in file order WITHOUT ordered_map's
// linear duplicate search (quadratic on a 128,000-entry vocab: minutes). Keys of a tokenizer.json are unique.
class OrderedDomBuilder : public nlohmann::json_sax<ordered_json> {
 public:
  using Members = std::vector<std::pair<const std::string, ordered_json>>;  // ordered_map's base

  bool null() override { return add(nullptr); }
  bool boolean(bool value) override { return add(value); }
  bool number_integer(number_integer_t value) override { return add(value); }
  bool number_unsigned(number_unsigned_t value) override { return add(value); }
  bool number_float(number_float_t value, const string_t&) override { return add(value); }
  bool string(string_t& value) override { return add(std::move(value)); }
  bool binary(binary_t&) override { return false; }
  bool start_object(std::size_t) override {
    ordered_json* object = add_container(ordered_json::object());
    stack_.push_back(object);
    return true;
  }
  bool key(string_t& value) override {
    key_ = std::move(value);
    return true;
  }
  bool end_object() override {
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    ordered_json* array = add_container(ordered_json::array());
    stack_.push_back(array);
    return true;
  }
  bool end_array() override {
    stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& ex) override {
    error_ = "byte " + std::to_string(position) + ": " + ex.what();
    return false;
  }

  ordered_json& root() { return root_; }
  const std::string& error() const { return error_; }

 private:
  // Adds a value to the innermost open container (or makes it the root); returns where it now lives.
  // Pointers on the stack stay valid: a container only grows while it is the innermost one.
  ordered_json* add_container(ordered_json value) {
    if (stack_.empty()) {
      root_ = std::move(value);
      return &root_;
    }
    ordered_json& parent = *stack_.back();
    if (parent.is_array()) {
      parent.get_ref<ordered_json::array_t&>().push_back(std::move(value));
      return &parent.get_ref<ordered_json::array_t&>().back();
    }
    Members& members = parent.get_ref<ordered_json::object_t&>();
    members.emplace_back(std::move(key_), std::move(value));
    return &members.back().second;
  }
  template <class T>
  bool add(T&& value) {
    add_container(ordered_json(std::forward<T>(value)));
    return true;
  }

  ordered_json root_;
  std::vector<ordered_json*> stack_;
  std::string key_;
  std::string error_;
};

}  // namespace

Result<std::string> restrict_tokenizer_json(const std::string& json_text, int64_t vocab_size,
                                            const std::string& origin) {
  OrderedDomBuilder builder;
  if (!ordered_json::sax_parse(json_text, &builder)) return Status::Error(origin + ": invalid JSON: " + builder.error());
  ordered_json& root = builder.root();
  if (!root.is_object()) return Status::Error(origin + ": not a JSON object");
  auto model = root.find("model");
  if (model == root.end() || !model->is_object() || !model->contains("vocab") || !(*model)["vocab"].is_object() ||
      !model->contains("merges") || !(*model)["merges"].is_array()) {
    return Status::Error(origin + ": field model.vocab / model.merges missing (not a BPE tokenizer.json)");
  }
  ordered_json& vocab = (*model)["vocab"];
  int64_t max_id = -1;
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer()) return Status::Error(origin + ": model.vocab['" + token + "'] is not an integer id");
    max_id = std::max<int64_t>(max_id, id.get<int64_t>());
  }
  if (root.contains("added_tokens") && root["added_tokens"].is_array()) {
    for (const auto& added : root["added_tokens"]) {
      if (added.is_object() && added.contains("id") && added["id"].is_number_integer()) {
        max_id = std::max<int64_t>(max_id, added["id"].get<int64_t>());
      }
    }
  }
  if (vocab_size > max_id) return json_text;  // nothing to cut

  ordered_json kept_vocab = ordered_json::object();
  auto& kept_members = static_cast<OrderedDomBuilder::Members&>(kept_vocab.get_ref<ordered_json::object_t&>());
  std::unordered_set<std::string> kept_tokens;
  for (const auto& [token, id] : vocab.items()) {
    if (id.get<int64_t>() < vocab_size) {
      kept_members.emplace_back(token, id);  // unique keys: no duplicate search
      kept_tokens.insert(token);
    }
  }
  ordered_json kept_merges = ordered_json::array();
  for (const auto& merge : (*model)["merges"]) {
    std::string left, right;
    if (!merge_parts(merge, &left, &right)) return Status::Error(origin + ": malformed merge " + merge.dump());
    if (kept_tokens.count(left) && kept_tokens.count(right) && kept_tokens.count(left + right)) {
      kept_merges.push_back(merge);
    }
  }
  vocab = std::move(kept_vocab);
  (*model)["merges"] = std::move(kept_merges);
  if (root.contains("added_tokens") && root["added_tokens"].is_array()) {
    ordered_json kept_added = ordered_json::array();
    for (const auto& added : root["added_tokens"]) {
      if (added.is_object() && added.contains("id") && added["id"].is_number_integer() &&
          added["id"].get<int64_t>() < vocab_size) {
        kept_added.push_back(added);
      }
    }
    root["added_tokens"] = std::move(kept_added);
  }
  return root.dump(1) + "\n";
}

std::string default_tokenizer_path() {
  namespace fs = std::filesystem;
  std::vector<std::string> roots;
  if (const char* env = std::getenv("DSFLASH_SHARED_DIR"); env != nullptr && *env != '\0') roots.emplace_back(env);
#ifdef DSFLASH_CONFIGURED_SHARED_DIR
  roots.emplace_back(DSFLASH_CONFIGURED_SHARED_DIR);
#endif
  for (const auto& root : roots) {
    const fs::path path = fs::path(root) / "tokenizer" / "deepseek_v3_tokenizer.json";
    std::error_code ec;
    if (fs::is_regular_file(path, ec)) return path.string();
  }
  return "";
}

}  // namespace dsflash::tiny
