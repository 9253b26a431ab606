// JSON text exactly as Python's json.dumps(value, ensure_ascii=False) writes it (", " and ": " separators,
// insertion key order, repr() floats, \uXXXX only for control characters). The V4.1 prompt embeds tool schemas
// and non-string tool arguments in this form (official encoding.py to_json), so the bytes must match.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace dsflash {

using OrderedJson = nlohmann::ordered_json;

std::string python_json_dumps(const OrderedJson& value);
// repr() of a Python float (shortest round-trip digits, scientific outside 1e-4 <= |x| < 1e16).
std::string python_float_repr(double value);
// A JSON string literal (with quotes) as json.dumps(ensure_ascii=False) writes it.
std::string python_json_string(const std::string& s);

}  // namespace dsflash
