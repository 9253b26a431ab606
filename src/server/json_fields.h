// Typed reads of one JSON object's optional fields for the request parsers. JSON null counts as absent (clients
// send "field": null for defaults). The first wrong field is kept as a 400 ApiError naming its path
// ("messages[2].content"); later reads are no-ops, so a parser reads every field and checks error() once.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "server/api_error.h"
#include "tokenizer/python_json.h"

namespace dsflash::server {

class FieldReader {
 public:
  // `object` must outlive the reader; `where` prefixes field paths ("" at the top level).
  FieldReader(const OrderedJson& object, std::string where);

  bool has(const char* key) const;  // present and not null
  std::optional<std::string> string(const char* key, bool required = false);
  std::optional<bool> boolean(const char* key);
  std::optional<double> number(const char* key, double lo, double hi);
  std::optional<int64_t> integer(const char* key, int64_t lo, int64_t hi, bool required = false);
  const OrderedJson* object(const char* key, bool required = false);
  const OrderedJson* array(const char* key, bool required = false);
  // Present (not null), any type.
  const OrderedJson* value(const char* key);

  void fail(const std::string& message);  // records a 400 (first failure wins)
  std::string path(const char* key) const;
  const std::optional<ApiError>& error() const { return error_; }

 private:
  const OrderedJson* find(const char* key, bool required, const char* type);

  const OrderedJson& object_;
  std::string where_;
  std::optional<ApiError> error_;
};

// Compact JSON text; invalid UTF-8 (a partial character of one token's text) becomes U+FFFD.
std::string dump_json(const OrderedJson& value);

// Parses a request body: it must be a JSON object. Errors are 400s naming the parse position.
ApiResult<OrderedJson> parse_json_object(const std::string& body);

}  // namespace dsflash::server
