#include "prefix/fingerprint.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace dsflash::prefix {
namespace {

constexpr size_t kSampleBytes = 64;

// Appends a length-prefixed field so that no two different field lists hash the same stream.
void add_field(XXH3_state_t* state, const void* data, size_t size) {
  const uint64_t length = size;
  XXH3_128bits_update(state, &length, sizeof(length));
  if (size > 0) XXH3_128bits_update(state, data, size);
}

void add_text(XXH3_state_t* state, const std::string& text) { add_field(state, text.data(), text.size()); }

// Whole file, or nothing when it does not exist (optional files); error when it exists but cannot be read.
Status add_file(XXH3_state_t* state, const std::filesystem::path& path, bool required) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    if (required) return Status::Error(path.string() + ": missing (needed for the model fingerprint)");
    add_text(state, "absent:" + path.filename().string());
    return Status::Ok();
  }
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) return Status::Error(path.string() + ": cannot read it for the model fingerprint");
  add_text(state, path.filename().string());
  add_field(state, bytes.data(), bytes.size());
  return Status::Ok();
}

// A shard's name, size and safetensors header (8-byte little-endian length, then the JSON).
Status add_shard_header(XXH3_state_t* state, const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  uint8_t length_bytes[8] = {};
  if (!in.read(reinterpret_cast<char*>(length_bytes), 8)) {
    return Status::Error(path.string() + ": cannot read the safetensors header length");
  }
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | length_bytes[i];
  std::error_code ec;
  const uint64_t file_size = std::filesystem::file_size(path, ec);
  if (ec || length > file_size - 8) return Status::Error(path.string() + ": safetensors header length out of range");
  std::vector<char> header(length);
  if (!in.read(header.data(), static_cast<std::streamsize>(length))) {
    return Status::Error(path.string() + ": cannot read the safetensors header");
  }
  add_text(state, path.filename().string());
  add_field(state, &file_size, sizeof(file_size));
  add_field(state, header.data(), header.size());
  return Status::Ok();
}

}  // namespace

std::string Fingerprint::hex() const {
  char text[33];
  std::snprintf(text, sizeof(text), "%016llx%016llx", static_cast<unsigned long long>(high),
                static_cast<unsigned long long>(low));
  return text;
}

Result<Fingerprint> fingerprint_checkpoint(const Checkpoint& checkpoint) {
  XXH3_state_t* state = XXH3_createState();
  if (state == nullptr) return Status::Error("model fingerprint: out of memory");
  XXH3_128bits_reset(state);
  const std::filesystem::path dir(checkpoint.dir());
  Status status = [&]() -> Status {
    add_field(state, &kCacheFormatVersion, sizeof(kCacheFormatVersion));
    Status s = add_file(state, dir / "config.json", true);
    if (!s.ok()) return s;
    for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
      s = add_file(state, dir / name, false);
      if (!s.ok()) return s;
    }
    std::vector<std::filesystem::path> shards;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      if (entry.path().extension() == ".safetensors") shards.push_back(entry.path());
    }
    if (ec) return Status::Error(dir.string() + ": cannot list the checkpoint directory: " + ec.message());
    std::sort(shards.begin(), shards.end());
    for (const auto& shard : shards) {
      s = add_shard_header(state, shard);
      if (!s.ok()) return s;
    }
    // all_tensors() is in a fixed order (by name). The samples are read from the files, not the mapping: tensors
    // copied at load (ModelWeights::to_tile_major) had their mapped pages given back, and reading them there would
    // fault them in again (and lock them, under --mlock).
    std::map<std::string, std::ifstream> files;
    for (const TensorView* tensor : checkpoint.all_tensors()) {
      add_text(state, tensor->name);
      std::ifstream& file = files.try_emplace(tensor->file, tensor->file, std::ios::binary).first->second;
      const size_t bytes = tensor->num_bytes;
      const size_t sample = std::min(kSampleBytes, bytes);
      char sample_bytes[kSampleBytes];
      for (size_t at : {size_t{0}, (bytes - sample) / 2, bytes - sample}) {
        file.seekg(static_cast<std::streamoff>(tensor->file_offset + at));
        if (!file.read(sample_bytes, static_cast<std::streamsize>(sample)))
          return Status::Error(tensor->file + ": cannot read tensor " + tensor->name + " at offset " +
                               std::to_string(tensor->file_offset + at) + " for the model fingerprint");
        add_field(state, sample_bytes, sample);
      }
    }
    return Status::Ok();
  }();
  const XXH128_hash_t digest = XXH3_128bits_digest(state);
  XXH3_freeState(state);
  if (!status.ok()) return status;
  return Fingerprint{digest.high64, digest.low64};
}

}  // namespace dsflash::prefix
