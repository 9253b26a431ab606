#include "tokenizer/python_json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace dsflash {

std::string python_float_repr(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  if (value == 0) return std::signbit(value) ? "-0.0" : "0.0";
  // Shortest round-trip digits in scientific form: "d[.ddd]e[+-]X".
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  const int exp10 = std::atoi(sci.c_str() + e + 1);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int n = static_cast<int>(digits.size());
  std::string out;
  if (exp10 >= -4 && exp10 < 16) {  // Python repr: fixed notation for -4 <= exp10 < 16
    if (exp10 >= n - 1) {
      out = digits + std::string(static_cast<size_t>(exp10 - (n - 1)), '0') + ".0";
    } else if (exp10 >= 0) {
      out = digits.substr(0, static_cast<size_t>(exp10 + 1)) + "." + digits.substr(static_cast<size_t>(exp10 + 1));
    } else {
      out = "0.";
      out.append(static_cast<size_t>(-exp10 - 1), '0');  // (appends: GCC 12 -Wrestrict misfires on "." + string)
      out += digits;
    }
  } else {
    out = digits.substr(0, 1);
    if (n > 1) {
      out += '.';
      out.append(digits, 1, std::string::npos);
    }
    char exp_buf[16];
    std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += exp_buf;
  }
  return sign + out;
}

std::string python_json_string(const std::string& s) {
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back('"');
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (u < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", u);
          out += buf;
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
  return out;
}

namespace {

void dump(const OrderedJson& v, std::string& out) {
  switch (v.type()) {
    case OrderedJson::value_t::null: out += "null"; break;
    case OrderedJson::value_t::boolean: out += v.get<bool>() ? "true" : "false"; break;
    case OrderedJson::value_t::number_integer: out += std::to_string(v.get<int64_t>()); break;
    case OrderedJson::value_t::number_unsigned: out += std::to_string(v.get<uint64_t>()); break;
    case OrderedJson::value_t::number_float: out += python_float_repr(v.get<double>()); break;
    case OrderedJson::value_t::string: out += python_json_string(v.get_ref<const std::string&>()); break;
    case OrderedJson::value_t::array: {
      out.push_back('[');
      bool first = true;
      for (const auto& item : v) {
        if (!first) out += ", ";
        first = false;
        dump(item, out);
      }
      out.push_back(']');
      break;
    }
    case OrderedJson::value_t::object: {
      out.push_back('{');
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        out += python_json_string(it.key());
        out += ": ";
        dump(it.value(), out);
      }
      out.push_back('}');
      break;
    }
    default: out += "null"; break;  // binary / discarded: never produced by the parser
  }
}

}  // namespace

std::string python_json_dumps(const OrderedJson& value) {
  std::string out;
  dump(value, out);
  return out;
}

}  // namespace dsflash
