#include "io/dtype.h"

#include <array>
#include <limits>

namespace dsflash {

namespace {

struct DTypeInfo {
  DType dtype;
  const char* name;  // the safetensors dtype string
  int bits;          // per element (F4: 4, packed two per byte)
};

constexpr std::array<DTypeInfo, 13> kDTypes = {{
    {DType::kBF16, "BF16", 16},
    {DType::kF16, "F16", 16},
    {DType::kF32, "F32", 32},
    {DType::kF64, "F64", 64},
    {DType::kF8_E4M3, "F8_E4M3", 8},
    {DType::kF8_E8M0, "F8_E8M0", 8},
    {DType::kF4, "F4", 4},
    {DType::kI8, "I8", 8},
    {DType::kU8, "U8", 8},
    {DType::kI16, "I16", 16},
    {DType::kI32, "I32", 32},
    {DType::kI64, "I64", 64},
    {DType::kBool, "BOOL", 8},
}};

const DTypeInfo& info(DType dtype) {
  for (const auto& i : kDTypes) {
    if (i.dtype == dtype) return i;
  }
  return kDTypes[8];  // unreachable for valid enum values
}

}  // namespace

bool parse_dtype(std::string_view name, DType* out) {
  for (const auto& i : kDTypes) {
    if (name == i.name) {
      *out = i.dtype;
      return true;
    }
  }
  return false;
}

const char* dtype_name(DType dtype) { return info(dtype).name; }

size_t dtype_bytes(DType dtype, int64_t num_elements) {
  if (num_elements <= 0) return 0;
  const uint64_t n = static_cast<uint64_t>(num_elements);
  const int bits = info(dtype).bits;
  if (bits < 8) return static_cast<size_t>(n / 2 + n % 2);  // F4: two per byte
  const uint64_t per = static_cast<uint64_t>(bits / 8);
  // Saturate instead of wrapping, so an absurd header shape can never match a real byte count.
  if (n > std::numeric_limits<uint64_t>::max() / per) return std::numeric_limits<size_t>::max();
  return static_cast<size_t>(n * per);
}

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

int64_t TensorView::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace dsflash
