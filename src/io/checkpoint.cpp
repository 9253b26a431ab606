#include "io/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

namespace dsflash {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr size_t kMaxReportedProblems = 12;

// Collects validation problems so one error names several of them at once.
class Problems {
 public:
  void add(std::string p) {
    ++count_;
    if (list_.size() < kMaxReportedProblems) list_.push_back(std::move(p));
  }
  bool empty() const { return count_ == 0; }
  Status status(const std::string& dir) const {
    std::string msg = dir + ": checkpoint does not match its config (" + std::to_string(count_) + " problem" +
                      (count_ == 1 ? "" : "s") + "): ";
    for (size_t i = 0; i < list_.size(); ++i) msg += (i ? "; " : "") + list_[i];
    if (count_ > list_.size()) msg += "; and " + std::to_string(count_ - list_.size()) + " more";
    return Status::Error(msg);
  }

 private:
  std::vector<std::string> list_;
  size_t count_ = 0;
};

// The shard file names a weight_map may use: plain relative paths inside the directory.
bool safe_relative(const std::string& name) {
  if (name.empty() || name[0] == '/') return false;
  for (const auto& part : fs::path(name)) {
    if (part == "..") return false;
  }
  return true;
}

// The storage convention of a checkpoint, read off the first routed expert weight and the first mHC scale.
StorageConventions detect_conventions(const std::map<std::string, const TensorView*>& by_name) {
  StorageConventions conv;
  for (const auto& [name, view] : by_name) {
    if (name.find(".ffn.experts.") != std::string::npos && name.size() > 10 &&
        name.compare(name.size() - 10, 10, ".w1.weight") == 0) {
      if (view->dtype == DType::kI8 || view->dtype == DType::kU8 || view->dtype == DType::kF4) {
        conv.packed_experts = view->dtype;
      }
      break;
    }
  }
  auto hc = by_name.find("layers.0.hc_attn_scale");
  if (hc != by_name.end() && (hc->second->dtype == DType::kBF16 || hc->second->dtype == DType::kF32)) {
    conv.hc_scale = hc->second->dtype;
  }
  return conv;
}

}  // namespace

Result<Checkpoint> Checkpoint::open(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return Status::Error(dir + ": not a checkpoint directory");
  auto config = ModelConfig::load(dir);
  if (!config.ok()) return config.status();

  Checkpoint ckpt;
  ckpt.dir_ = dir;
  ckpt.config_ = std::move(config.value());
  const fs::path root(dir);
  const fs::path index_path = root / "model.safetensors.index.json";

  auto open_shard = [&](const std::string& name) -> Result<SafetensorsFile*> {
    auto shard = SafetensorsFile::open((root / name).string());
    if (!shard.ok()) return shard.status();
    ckpt.shards_.push_back(std::make_unique<SafetensorsFile>(std::move(shard.value())));
    return ckpt.shards_.back().get();
  };

  if (fs::exists(index_path, ec)) {
    std::ifstream in(index_path, std::ios::binary);
    if (!in) return Status::Error(index_path.string() + ": cannot open");
    std::stringstream ss;
    ss << in.rdbuf();
    json index;
    try {
      index = json::parse(ss.str());
    } catch (const json::exception& e) {
      return Status::Error(index_path.string() + ": malformed JSON: " + e.what());
    }
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      return Status::Error(index_path.string() + ": field weight_map missing or not an object");
    }
    const json& weight_map = index["weight_map"];
    // Shards in the order the index first names them.
    std::map<std::string, SafetensorsFile*> shards;
    for (auto it = weight_map.begin(); it != weight_map.end(); ++it) {
      if (!it.value().is_string()) {
        return Status::Error(index_path.string() + ": weight_map entry '" + it.key() + "' is not a file name");
      }
      const std::string shard_name = it.value().get<std::string>();
      if (!safe_relative(shard_name)) {
        return Status::Error(index_path.string() + ": weight_map entry '" + it.key() + "' names shard '" + shard_name +
                             "' outside the checkpoint directory");
      }
      if (shards.count(shard_name) == 0) {
        if (!fs::exists(root / shard_name, ec)) {
          return Status::Error(index_path.string() + ": shard '" + shard_name + "' (listed for tensor '" + it.key() +
                               "') is absent from " + dir);
        }
        auto shard = open_shard(shard_name);
        if (!shard.ok()) return shard.status();
        shards[shard_name] = shard.value();
      }
      const TensorView* view = shards[shard_name]->find(it.key());
      if (view == nullptr) {
        return Status::Error(index_path.string() + ": maps tensor '" + it.key() + "' to shard '" + shard_name +
                             "', which does not hold it");
      }
      ckpt.by_name_[it.key()] = view;
    }
    for (const auto& [shard_name, shard] : shards) {
      for (const TensorView& view : shard->tensors()) {
        auto found = ckpt.by_name_.find(view.name);
        if (found == ckpt.by_name_.end()) {
          return Status::Error(shard->path() + ": holds tensor '" + view.name + "' that " + index_path.string() +
                               " does not list");
        }
        if (found->second != &view) {
          return Status::Error(shard->path() + ": tensor '" + view.name + "' is also in " + found->second->file +
                               " (the index maps it there)");
        }
      }
    }
  } else if (fs::exists(root / "model.safetensors", ec)) {
    auto shard = open_shard("model.safetensors");
    if (!shard.ok()) return shard.status();
    for (const TensorView& view : shard.value()->tensors()) ckpt.by_name_[view.name] = &view;
  } else {
    return Status::Error(dir + ": neither model.safetensors.index.json nor model.safetensors is present");
  }

  // Every tensor the config needs, with its dtype and shape; nothing else.
  ckpt.conventions_ = detect_conventions(ckpt.by_name_);
  Problems problems;
  std::set<std::string> expected_names;
  for (const ExpectedTensor& want : expected_tensors(ckpt.config_, ckpt.conventions_)) {
    expected_names.insert(want.name);
    auto it = ckpt.by_name_.find(want.name);
    if (it == ckpt.by_name_.end()) {
      problems.add("missing tensor '" + want.name + "' (" + dtype_name(want.dtype) + " " + shape_to_string(want.shape) +
                   ")");
      continue;
    }
    const TensorView& have = *it->second;
    if (have.dtype != want.dtype || have.shape != want.shape) {
      problems.add("tensor '" + want.name + "' in " + have.file + " is " + dtype_name(have.dtype) + " " +
                   shape_to_string(have.shape) + ", expected " + dtype_name(want.dtype) + " " +
                   shape_to_string(want.shape));
    }
  }
  for (const auto& [name, view] : ckpt.by_name_) {
    if (expected_names.count(name) == 0) {
      problems.add("unexpected tensor '" + name + "' in " + view->file + " (not part of this config)");
    }
  }
  if (!problems.empty()) return problems.status(dir);
  return ckpt;
}

const TensorView* Checkpoint::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

Result<const TensorView*> Checkpoint::get(const std::string& name) const {
  const TensorView* view = find(name);
  if (view == nullptr) return Status::Error(dir_ + ": no tensor named '" + name + "'");
  return view;
}

std::vector<const TensorView*> Checkpoint::all_tensors() const {
  std::vector<const TensorView*> out;
  out.reserve(by_name_.size());
  for (const auto& [name, view] : by_name_) out.push_back(view);
  return out;
}

void Checkpoint::release(const uint8_t* p, size_t n) const {
  for (const auto& shard : shards_)
    if (shard->holds(p, n)) return shard->release(p, n);
}

Status Checkpoint::lock_in_memory(bool on_fault) const {
  for (const auto& shard : shards_) {
    if (Status s = shard->lock_in_memory(on_fault); !s.ok()) return s;
  }
  return Status::Ok();
}

}  // namespace dsflash
