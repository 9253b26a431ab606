#include "server/json_fields.h"

#include <cmath>

namespace dsflash::server {

FieldReader::FieldReader(const OrderedJson& object, std::string where) : object_(object), where_(std::move(where)) {}

std::string FieldReader::path(const char* key) const { return where_.empty() ? key : where_ + "." + key; }

void FieldReader::fail(const std::string& message) {
  if (!error_) error_ = bad_request(message);
}

bool FieldReader::has(const char* key) const {
  if (!object_.is_object()) return false;
  auto it = object_.find(key);
  return it != object_.end() && !it->is_null();
}

const OrderedJson* FieldReader::find(const char* key, bool required, const char* type) {
  if (error_) return nullptr;
  if (!has(key)) {
    if (required) fail(path(key) + " is required (" + type + ")");
    return nullptr;
  }
  return &*object_.find(key);
}

const OrderedJson* FieldReader::value(const char* key) { return find(key, false, "any"); }

std::optional<std::string> FieldReader::string(const char* key, bool required) {
  const OrderedJson* v = find(key, required, "a string");
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) {
    fail(path(key) + " must be a string, got " + v->type_name());
    return std::nullopt;
  }
  return v->get<std::string>();
}

std::optional<bool> FieldReader::boolean(const char* key) {
  const OrderedJson* v = find(key, false, "a boolean");
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) {
    fail(path(key) + " must be a boolean, got " + v->type_name());
    return std::nullopt;
  }
  return v->get<bool>();
}

std::optional<double> FieldReader::number(const char* key, double lo, double hi) {
  const OrderedJson* v = find(key, false, "a number");
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) {
    fail(path(key) + " must be a number, got " + v->type_name());
    return std::nullopt;
  }
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) {
    fail(path(key) + " must be in [" + python_float_repr(lo) + ", " + python_float_repr(hi) + "], got " + v->dump());
    return std::nullopt;
  }
  return x;
}

std::optional<int64_t> FieldReader::integer(const char* key, int64_t lo, int64_t hi, bool required) {
  const OrderedJson* v = find(key, required, "an integer");
  if (v == nullptr) return std::nullopt;
  const bool whole = v->is_number_integer() || (v->is_number_float() && std::isfinite(v->get<double>()) &&
                                                std::floor(v->get<double>()) == v->get<double>() &&
                                                std::fabs(v->get<double>()) < 9e15);
  if (!whole) {
    fail(path(key) + " must be an integer, got " + v->dump());
    return std::nullopt;
  }
  int64_t x = 0;
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    x = u > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(u);
  } else if (v->is_number_integer()) {
    x = v->get<int64_t>();
  } else {
    x = static_cast<int64_t>(v->get<double>());
  }
  if (x < lo || x > hi) {
    fail(path(key) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v->dump());
    return std::nullopt;
  }
  return x;
}

const OrderedJson* FieldReader::object(const char* key, bool required) {
  const OrderedJson* v = find(key, required, "an object");
  if (v != nullptr && !v->is_object()) {
    fail(path(key) + " must be an object, got " + v->type_name());
    return nullptr;
  }
  return v;
}

const OrderedJson* FieldReader::array(const char* key, bool required) {
  const OrderedJson* v = find(key, required, "an array");
  if (v != nullptr && !v->is_array()) {
    fail(path(key) + " must be an array, got " + v->type_name());
    return nullptr;
  }
  return v;
}

std::string dump_json(const OrderedJson& value) {
  return value.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
}

ApiResult<OrderedJson> parse_json_object(const std::string& body) {
  OrderedJson json;
  try {
    json = OrderedJson::parse(body);
  } catch (const std::exception& e) {  // nlohmann reports parse errors as exceptions; they become values here
    return bad_request(std::string("the body is not valid JSON: ") + e.what(), "invalid_json");
  }
  if (!json.is_object()) return bad_request(std::string("the body must be a JSON object, got ") + json.type_name());
  return json;
}

}  // namespace dsflash::server
