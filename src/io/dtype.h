// Tensor element types as safetensors names them, and read-only views onto mapped tensor bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dsflash {

enum class DType {
  kBF16,
  kF16,
  kF32,
  kF64,
  kF8_E4M3,
  kF8_E8M0,
  kF4,  // packed e2m1, two per byte; header shape is the logical element count [out, in]
  kI8,  // the released checkpoint's dtype for packed e2m1 experts: header shape [out, in/2] bytes
  kU8,
  kI16,
  kI32,
  kI64,
  kBool,
};

// "BF16", "F8_E4M3", ... ; false when the name is unknown.
bool parse_dtype(std::string_view name, DType* out);
const char* dtype_name(DType dtype);
// Bytes that `num_elements` elements of this dtype occupy (F4: ceil(num_elements / 2)).
size_t dtype_bytes(DType dtype, int64_t num_elements);
// "[2048, 128]" for messages and listings.
std::string shape_to_string(const std::vector<int64_t>& shape);

// A tensor inside a mapped file: no ownership, no copy.
struct TensorView {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t num_bytes = 0;
  std::string file;  // the shard it lives in (for error messages)
  uint64_t file_offset = 0;  // where its bytes start in that file (its mapped pages may be given back at load)

  int64_t num_elements() const;
  int64_t dim(int i) const { return shape.at(static_cast<size_t>(i)); }
  template <class T>
  const T* as() const { return reinterpret_cast<const T*>(data); }
};

}  // namespace dsflash
