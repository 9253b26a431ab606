// API-key check of both APIs: OpenAI sends "Authorization: Bearer KEY", Anthropic "x-api-key: KEY"; either is
// accepted. The comparison takes the same time wherever the first difference is (no timing oracle).
#pragma once

#include <string>
#include <string_view>

namespace dsflash::server {

bool constant_time_equals(std::string_view a, std::string_view b);

// The key a request presents: the Bearer token of `authorization`, else `x_api_key`; "" when neither.
std::string presented_api_key(const std::string& authorization, const std::string& x_api_key);

}  // namespace dsflash::server
