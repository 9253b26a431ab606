// safetensors files: 8-byte little-endian header length, JSON header {name: {dtype, shape, data_offsets}},
// then the payload. The reader maps the file and validates the header completely before handing out views.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "core/status.h"
#include "io/dtype.h"

namespace dsflash {

class SafetensorsFile {
 public:
  // Validates: header length within the file, JSON well formed, every entry's dtype known, shape
  // non-negative, byte size = dtype_bytes(shape), offsets inside the payload and not overlapping.
  // Every error names the file (and the tensor and field where there is one).
  static Result<SafetensorsFile> open(const std::string& path);

  const std::vector<TensorView>& tensors() const { return tensors_; }
  const TensorView* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return file_.path(); }
  Status lock_in_memory(bool on_fault = false) const { return file_.lock_in_memory(on_fault); }
  bool holds(const uint8_t* p, size_t n) const { return file_.contains(p, n); }
  void release(const uint8_t* p, size_t n) const { file_.release(p, n); }

 private:
  MappedFile file_;
  std::vector<TensorView> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Writer (make-tiny, tests): tensors are laid out in the order added, 8-byte aligned header.
class SafetensorsWriter {
 public:
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes);
  void add_metadata(const std::string& key, const std::string& value);
  size_t payload_bytes() const;
  Status write(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace dsflash
