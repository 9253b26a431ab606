#include "model/weight_binding.h"

#include <sstream>

namespace dsflash {
namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

Result<const TensorView*> find_checked(const Checkpoint& checkpoint, const std::string& name, DType dtype,
                                       const std::vector<int64_t>& shape) {
  auto tensor = checkpoint.get(name);
  if (!tensor.ok()) return tensor.status();
  const TensorView* view = *tensor;
  if (view->dtype != dtype) {
    return Status::Error("tensor " + name + " in " + view->file + ": dtype " + dtype_name(view->dtype) +
                         ", expected " + dtype_name(dtype));
  }
  if (view->shape != shape) {
    return Status::Error("tensor " + name + " in " + view->file + ": shape " + shape_text(view->shape) +
                         ", expected " + shape_text(shape));
  }
  return view;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

Result<Bf16Weight> bind_bf16_matrix(const Checkpoint& checkpoint, const std::string& name, int64_t out, int64_t in) {
  auto view = find_checked(checkpoint, name, DType::kBF16, {out, in});
  if (!view.ok()) return view.status();
  return Bf16Weight{(*view)->as<uint16_t>(), out, in};
}

Result<const uint16_t*> bind_bf16_vector(const Checkpoint& checkpoint, const std::string& name, int64_t n) {
  auto view = find_checked(checkpoint, name, DType::kBF16, {n});
  if (!view.ok()) return view.status();
  return (*view)->as<uint16_t>();
}

Result<const float*> bind_f32(const Checkpoint& checkpoint, const std::string& name, std::vector<int64_t> shape) {
  auto view = find_checked(checkpoint, name, DType::kF32, shape);
  if (!view.ok()) return view.status();
  return (*view)->as<float>();
}

Result<Fp8Weight> bind_fp8_linear(const Checkpoint& checkpoint, const std::string& prefix, int64_t out, int64_t in) {
  auto weight = find_checked(checkpoint, prefix + ".weight", DType::kF8_E4M3, {out, in});
  if (!weight.ok()) return weight.status();
  auto scale = find_checked(checkpoint, prefix + ".scale", DType::kF8_E8M0, {ceil_div(out, 32), ceil_div(in, 32)});
  if (!scale.ok()) return scale.status();
  if (in % 32 != 0) return Status::Error("tensor " + prefix + ".weight: in features " + std::to_string(in) +
                                         " not a multiple of 32");
  return Fp8Weight{(*weight)->data, (*scale)->data, out, in};
}

Result<Fp4Weight> bind_fp4_linear(const Checkpoint& checkpoint, const std::string& prefix, int64_t out, int64_t in) {
  const std::string name = prefix + ".weight";
  auto found = checkpoint.get(name);
  if (!found.ok()) return found.status();
  const TensorView* weight = *found;
  const bool logical = weight->dtype == DType::kF4 && weight->shape == std::vector<int64_t>{out, in};
  const bool packed = (weight->dtype == DType::kI8 || weight->dtype == DType::kU8) &&
                      weight->shape == std::vector<int64_t>{out, in / 2};
  if (!logical && !packed) {
    return Status::Error("tensor " + name + " in " + weight->file + ": " + dtype_name(weight->dtype) + " " +
                         shape_text(weight->shape) + ", expected F4 " + shape_text({out, in}) + " or I8 " +
                         shape_text({out, in / 2}));
  }
  if (in % 32 != 0) return Status::Error("tensor " + name + ": in features " + std::to_string(in) +
                                         " not a multiple of 32");
  auto scale = find_checked(checkpoint, prefix + ".scale", DType::kF8_E8M0, {out, in / 32});
  if (!scale.ok()) return scale.status();
  return Fp4Weight{weight->data, (*scale)->data, out, in};
}

}  // namespace dsflash
