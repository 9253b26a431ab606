// What `dsflash serve` configures the HTTP server with (apps/cmd_serve.cpp fills it from the command line).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dsflash::server {

struct ServerOptions {
  std::string host = "127.0.0.1";      // loopback unless told otherwise
  int port = 8080;                     // 0: any free port
  std::string api_key;                 // "": no authentication
  std::string served_name;             // the model's name in /v1/models and responses
  std::vector<std::string> aliases;    // more names that map to the loaded model
  int64_t context_tokens = 0;          // prompt + max_tokens per request (0: the engine's limit)
  int64_t max_body_bytes = 32 << 20;   // larger bodies: 413
  int http_threads = 64;               // connections served at once (streams hold one each)
  double shutdown_grace_s = 10.0;      // on SIGTERM, in-flight requests get this long before they are cancelled
  int speculative = 0;                 // DSpark drafted tokens per decode step for every request (0 = off)
  std::string cache_dir;               // prefix-cache directory (reported; used once the engine has a prefix cache)
};

}  // namespace dsflash::server
