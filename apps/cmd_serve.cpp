// `dsflash serve -m DIR`: the OpenAI- and Anthropic-compatible HTTP server (src/server/http_server.h). It binds
// first (GET /health answers 503 with the load progress), prints "listening on http://HOST:PORT", loads the
// model with a progress line on stderr, then serves. SIGTERM / SIGINT: stop accepting, let in-flight requests
// finish for --shutdown-grace seconds, cancel the rest, release the engine, exit 0.
#include <CLI/CLI.hpp>

#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <thread>

#include "cli_checks.h"
#include "commands.h"
#include "dsflash/engine.h"
#include "server/http_server.h"

namespace dsflash::cli {
namespace {

struct ServeOptions {
  std::string model_dir;
  server::ServerOptions server;
  int64_t max_batch = 16;
  int64_t max_queue = 128;
  int64_t kv_mib = 1024;
  int threads = 0;
  std::string backend;
  bool mlock = false;
  bool reference = false;
  int64_t cache_disk_bytes = int64_t{16} << 30;
  bool no_prefix_cache = false;
};

// The last path component of the model directory ("DeepSeek-V4.1-Flash").
std::string served_name_of(const std::string& dir) {
  std::filesystem::path p(dir);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();
  const std::string name = p.filename().string();
  return name.empty() ? "dsflash" : name;
}

int run_serve(ServeOptions o) {
  // Shutdown signals are taken by one thread (sigwait), never by a handler; every thread started below inherits
  // the blocked mask. A dead client must fail a write, not kill the process.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGUSR1);  // internal: wakes the signal thread when the server ends on its own
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  if (o.server.served_name.empty()) o.server.served_name = served_name_of(o.model_dir);
  o.server.http_threads = static_cast<int>(std::max<int64_t>(16, o.max_queue + 8));
  server::HttpServer http(o.server);
  const int port = http.bind();
  if (port < 0) {
    std::cerr << "dsflash serve: cannot listen on " << o.server.host << ":" << o.server.port << "\n";
    return 1;
  }
  std::cout << "listening on http://" << o.server.host << ":" << port << std::endl;
  std::thread listener([&http] { http.listen(); });
  const double grace = o.server.shutdown_grace_s;
  std::thread signal_waiter([&http, signals, grace] {
    int sig = 0;
    sigwait(&signals, &sig);
    if (sig != SIGUSR1) std::cerr << "dsflash serve: shutting down (signal " << sig << ")" << std::endl;
    http.stop(std::chrono::duration<double>(grace));
  });

  LoadOptions load;
  load.reference_kernels = o.reference;
  load.backend = o.backend;
  load.num_threads = o.threads;
  load.lock_weights = o.mlock;
  load.dspark = o.server.speculative > 0;  // every request speculates with it, or none does
  load.max_running = static_cast<int>(o.max_batch);
  load.max_requests = static_cast<int>(o.max_queue);
  load.kv_budget_bytes = o.kv_mib << 20;
  load.require_tokenizer = true;
  load.prefix_cache = !o.no_prefix_cache;
  load.cache_dir = o.server.cache_dir;  // a directory that cannot be used switches the SSD tier off (said once)
  load.cache_disk_bytes = o.cache_disk_bytes;
  int last_percent = -1;
  auto engine = Engine::load(o.model_dir, load, [&](const LoadProgress& p) {
    http.set_load_progress(p);
    const int percent = static_cast<int>(p.fraction * 100.0);
    if (percent != last_percent) {
      std::fprintf(stderr, "\rloading %s: %3d%% (%s)   ", o.model_dir.c_str(), percent, p.stage.c_str());
      std::fflush(stderr);
      last_percent = percent;
    }
  });
  std::fprintf(stderr, "\n");
  int rc = 0;
  if (engine.ok() && o.server.speculative > 0 && (*engine)->info().dspark_block_size == 0) {
    engine = EngineError{ErrorCode::kLoad, "--speculative " + std::to_string(o.server.speculative) +
                                               ": the model has no DSpark stages (mtp.*) to draft with"};
  }
  if (!engine.ok()) {
    std::cerr << "dsflash serve: " << engine.error().message << "\n";
    http.set_load_failed(engine.error().message);
    http.stop(std::chrono::seconds(0));
    rc = 1;
  } else {
    const ModelInfo& info = (*engine)->info();
    http.set_engine(engine->get());
    std::cerr << "ready: " << o.server.served_name << " (" << info.kernels << " kernels, " << info.num_threads
              << " threads, " << info.max_request_positions << " positions per request)" << std::endl;
  }
  listener.join();  // returns after stop(), once every connection's thread is done
  pthread_kill(signal_waiter.native_handle(), SIGUSR1);
  signal_waiter.join();
  // The Engine goes last: its destructor cancels anything left and joins its loop (and would flush a cache writer).
  return rc;
}

}  // namespace

void add_serve_command(CLI::App& app, int* exit_code) {
  auto options = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI- and Anthropic-compatible HTTP server");
  cmd->add_option("-m,--model", options->model_dir, "checkpoint directory (with tokenizer.json)")->required();
  cmd->add_option("--host", options->server.host, "address to bind (default 127.0.0.1: this machine only)");
  cmd->add_option("--port", options->server.port, "port (0: any free port)")->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", options->server.api_key, "require this key (Authorization: Bearer or x-api-key)");
  add_prefix_cache_options(cmd, &options->server.cache_dir, &options->cache_disk_bytes, &options->no_prefix_cache);
  cmd->add_option("--ctx-size", options->server.context_tokens, "prompt + max_tokens per request (0: the model's)")
      ->check(whole_number_at_least(0));
  cmd->add_option("--max-batch", options->max_batch, "requests prefilling or decoding at once")->check(whole_number_at_least(1));
  cmd->add_option("--max-queue", options->max_queue, "requests in flight (running + waiting); beyond: 503 / 529")
      ->check(whole_number_at_least(1));
  cmd->add_option("--kv-mib", options->kv_mib, "KV cache budget of all running requests, MiB")->check(whole_number_at_least(1));
  cmd->add_option("--alias", options->server.aliases, "another model name that maps to this model (repeatable)");
  cmd->add_option("--served-name", options->server.served_name, "the model's name (default: the directory's name)");
  cmd->add_option("--max-body-mib", options->server.max_body_bytes, "largest request body, MiB")
      ->check(whole_number_at_least(1))
      ->transform([](std::string v) { return std::to_string(std::stoll(v) << 20); });
  cmd->add_option("--shutdown-grace", options->server.shutdown_grace_s, "seconds in-flight requests get on SIGTERM");
  cmd->add_option("--threads", options->threads, "worker threads (0 = all)");
  cmd->add_flag("--mlock", options->mlock, "lock the weights in RAM (mlock; needs ulimit -l or root)");
  cmd->add_flag("--reference", options->reference, "scalar reference kernels, single-threaded");
  add_backend_option(cmd, &options->backend);
  add_speculative_option(cmd, &options->server.speculative);
  cmd->callback([options, exit_code] { *exit_code = run_serve(*options); });
}

}  // namespace dsflash::cli
