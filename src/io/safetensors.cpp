#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

namespace dsflash {

namespace {

using json = nlohmann::json;

// Non-negative integer from a JSON value; false for anything else (negative, float, string, ...).
bool get_uint(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer()) {
    int64_t s = v.get<int64_t>();
    if (s < 0) return false;
    *out = static_cast<uint64_t>(s);
    return true;
  }
  return false;
}

// Elements of a shape, or false when the product does not fit in int64.
bool checked_num_elements(const std::vector<int64_t>& shape, int64_t* out) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) return false;
    n *= d;
  }
  *out = n;
  return true;
}

struct Span {
  uint64_t begin, end;
  size_t tensor;
};

}  // namespace

const TensorView* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  auto mapped = MappedFile::open(path);
  if (!mapped.ok()) return mapped.status();
  SafetensorsFile file;
  file.file_ = std::move(mapped.value());
  const uint8_t* base = file.file_.data();
  const uint64_t size = file.file_.size();

  if (size < 8) {
    return Status::Error(path + ": truncated: the file is " + std::to_string(size) +
                         " bytes, shorter than the 8-byte header length at offset 0");
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | base[i];  // little-endian u64
  if (header_len > size - 8) {
    return Status::Error(path + ": header length " + std::to_string(header_len) +
                         " (at offset 0) runs past the end of the file (" + std::to_string(size) +
                         " bytes: at most " + std::to_string(size - 8) + " header bytes)");
  }
  const char* header_begin = reinterpret_cast<const char*>(base + 8);
  json header;
  try {
    header = json::parse(header_begin, header_begin + header_len);
  } catch (const json::exception& e) {
    return Status::Error(path + ": malformed JSON header (bytes 8.." + std::to_string(8 + header_len) +
                         "): " + e.what());
  }
  if (!header.is_object()) {
    return Status::Error(path + ": JSON header is not an object");
  }

  const uint64_t payload_offset = 8 + header_len;
  const uint64_t payload_size = size - payload_offset;
  std::vector<Span> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& entry = it.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) return Status::Error(path + ": __metadata__ is not an object");
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string()) {
          return Status::Error(path + ": __metadata__ field '" + m.key() + "' is not a string");
        }
        file.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = path + ": tensor '" + name + "'";
    if (!entry.is_object()) return Status::Error(where + ": header entry is not an object");
    auto dt = entry.find("dtype");
    if (dt == entry.end() || !dt->is_string()) return Status::Error(where + ": field 'dtype' missing or not a string");
    TensorView view;
    view.name = name;
    view.file = path;
    if (!parse_dtype(dt->get<std::string>(), &view.dtype)) {
      return Status::Error(where + ": field 'dtype': unknown dtype '" + dt->get<std::string>() + "'");
    }
    auto sh = entry.find("shape");
    if (sh == entry.end() || !sh->is_array()) return Status::Error(where + ": field 'shape' missing or not an array");
    for (size_t i = 0; i < sh->size(); ++i) {
      uint64_t d = 0;
      if (!get_uint((*sh)[i], &d) || d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Status::Error(where + ": field 'shape' entry " + std::to_string(i) +
                             " is not a non-negative integer: " + (*sh)[i].dump());
      }
      view.shape.push_back(static_cast<int64_t>(d));
    }
    auto off = entry.find("data_offsets");
    if (off == entry.end() || !off->is_array() || off->size() != 2) {
      return Status::Error(where + ": field 'data_offsets' missing or not a pair");
    }
    uint64_t begin = 0, end = 0;
    if (!get_uint((*off)[0], &begin) || !get_uint((*off)[1], &end)) {
      return Status::Error(where + ": field 'data_offsets' " + off->dump() + " holds a non-integer or negative value");
    }
    if (end < begin) {
      return Status::Error(where + ": field 'data_offsets' " + off->dump() + ": end before begin");
    }
    if (end > payload_size) {
      return Status::Error(where + ": field 'data_offsets' " + off->dump() + " out of range: the payload is " +
                           std::to_string(payload_size) + " bytes (file offset " + std::to_string(payload_offset) +
                           " .. " + std::to_string(size) + ")");
    }
    int64_t numel = 0;
    if (!checked_num_elements(view.shape, &numel)) {
      return Status::Error(where + ": shape " + shape_to_string(view.shape) + " overflows the element count");
    }
    const size_t want = dtype_bytes(view.dtype, numel);
    if (end - begin != want) {
      return Status::Error(where + ": field 'data_offsets' " + off->dump() + " spans " + std::to_string(end - begin) +
                           " bytes, but dtype " + dtype_name(view.dtype) + " shape " + shape_to_string(view.shape) +
                           " needs " + std::to_string(want));
    }
    view.data = base + payload_offset + begin;
    view.num_bytes = static_cast<size_t>(end - begin);
    view.file_offset = static_cast<uint64_t>(payload_offset + begin);
    spans.push_back({begin, end, file.tensors_.size()});
    file.index_[name] = file.tensors_.size();
    file.tensors_.push_back(std::move(view));
  }

  // Overlap check over the non-empty byte ranges, in offset order.
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
  const Span* prev = nullptr;
  for (const Span& s : spans) {
    if (s.begin == s.end) continue;
    if (prev != nullptr && s.begin < prev->end) {
      return Status::Error(path + ": tensor '" + file.tensors_[s.tensor].name + "' bytes [" + std::to_string(s.begin) +
                           ", " + std::to_string(s.end) + ") overlap tensor '" + file.tensors_[prev->tensor].name +
                           "' bytes [" + std::to_string(prev->begin) + ", " + std::to_string(prev->end) + ")");
    }
    if (prev == nullptr || s.end > prev->end) prev = &s;
  }
  return file;
}

void SafetensorsWriter::add(const std::string& name, DType dtype, std::vector<int64_t> shape,
                            std::vector<uint8_t> bytes) {
  entries_.push_back({name, dtype, std::move(shape), std::move(bytes)});
}

void SafetensorsWriter::add_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

size_t SafetensorsWriter::payload_bytes() const {
  size_t total = 0;
  for (const auto& e : entries_) total += e.bytes.size();
  return total;
}

Status SafetensorsWriter::write(const std::string& path) const {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata_) meta[k] = v;
    header["__metadata__"] = meta;
  }
  uint64_t offset = 0;
  for (const auto& e : entries_) {
    if (e.name == "__metadata__") return Status::Error(path + ": a tensor cannot be named __metadata__");
    if (header.contains(e.name)) return Status::Error(path + ": tensor '" + e.name + "' added twice");
    int64_t numel = 0;
    if (!checked_num_elements(e.shape, &numel)) {
      return Status::Error(path + ": tensor '" + e.name + "': shape overflows the element count");
    }
    for (int64_t d : e.shape) {
      if (d < 0) return Status::Error(path + ": tensor '" + e.name + "': negative dimension in shape");
    }
    const size_t want = dtype_bytes(e.dtype, numel);
    if (e.bytes.size() != want) {
      return Status::Error(path + ": tensor '" + e.name + "': " + std::to_string(e.bytes.size()) + " bytes given, dtype " +
                           dtype_name(e.dtype) + " shape " + shape_to_string(e.shape) + " needs " +
                           std::to_string(want));
    }
    nlohmann::ordered_json entry;
    entry["dtype"] = dtype_name(e.dtype);
    entry["shape"] = e.shape;
    entry["data_offsets"] = {offset, offset + e.bytes.size()};
    header[e.name] = entry;
    offset += e.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // pad so the payload starts 8-byte aligned
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return Status::Error(path + ": cannot open for writing");
  uint8_t len[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& e : entries_) {
    out.write(reinterpret_cast<const char*>(e.bytes.data()), static_cast<std::streamsize>(e.bytes.size()));
  }
  out.close();
  if (!out) return Status::Error(path + ": write failed");
  return Status::Ok();
}

}  // namespace dsflash
