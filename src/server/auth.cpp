#include "server/auth.h"

#include <cstdint>

namespace dsflash::server {

bool constant_time_equals(std::string_view a, std::string_view b) {
  // Runs over the longer length; a length difference is folded into the result.
  const size_t n = a.size() > b.size() ? a.size() : b.size();
  volatile uint8_t diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t x = i < a.size() ? static_cast<uint8_t>(a[i]) : 0;
    const uint8_t y = i < b.size() ? static_cast<uint8_t>(b[i]) : 0;
    diff = static_cast<uint8_t>(diff | (x ^ y));
  }
  return diff == 0;
}

std::string presented_api_key(const std::string& authorization, const std::string& x_api_key) {
  constexpr std::string_view kBearer = "Bearer ";
  if (authorization.size() > kBearer.size() && authorization.compare(0, kBearer.size(), kBearer) == 0) {
    return authorization.substr(kBearer.size());
  }
  return x_api_key;
}

}  // namespace dsflash::server
