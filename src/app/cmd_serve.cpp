// `mererun serve -m MODEL [--host 127.0.0.1] [--port 8080] [-c CTX] [--api-key KEY] [-t N]
//  [--signing-key-file PATH] [--allow-host NAME,...] [--allow-origin ORIGIN,...] [--max-active N] [--max-queue N] [--max-queued-tokens N] [--step-rows N]
//  [--prefill-chunk N] [--prefix-cache-mb N] [--no-warmup] [--max-body-bytes N]
//  [--max-output-tokens N] [--temp T]`: the HTTP server (src/server/).
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <chrono>
#include <thread>

#include "app/commands.h"
#include "app/model_opts.h"
#include "model/catalog.h"
#include "runtime/generator.h"
#include "server/engine.h"
#include "server/http_server.h"
#include "server/signing.h"

namespace mr::app {

int CmdServe(const Args& args) {
  CliArgs cli(args);
  ModelArgs margs = ParseModelArgs(cli);
  server::ServerOptions sopts;
  sopts.host = cli.Get("", "--host", "127.0.0.1");
  sopts.port = std::atoi(cli.Get("", "--port", "8080").c_str());
  sopts.api_key = cli.Get("", "--api-key", std::getenv("MERERUN_API_KEY") ? std::getenv("MERERUN_API_KEY") : "");
  const int64_t n_ctx_arg = std::atoll(cli.Get("-c", "--ctx", "0").c_str());
  // The thinking-signature key lives in a 0600 file, never on the command line (ps shows it).
  const std::string signing_key_file =
      cli.Get("", "--signing-key-file", (std::filesystem::path(model::MererunHome()) / "signing.key").string());
  auto list_option = [&](const char* name) {
    std::vector<std::string> out;
    for (std::string v = cli.Get("", name); !v.empty(); v = cli.Get("", name)) {
      size_t pos = 0;
      while (pos <= v.size()) {
        const size_t comma = std::min(v.find(',', pos), v.size());
        if (comma > pos) out.push_back(v.substr(pos, comma - pos));
        pos = comma + 1;
      }
    }
    return out;
  };
  sopts.allow_hosts = list_option("--allow-host");
  sopts.allow_origins = list_option("--allow-origin");
  const int max_queue = std::atoi(cli.Get("", "--max-queue", "16").c_str());
  const int max_active = std::atoi(cli.Get("", "--max-active", "8").c_str());
  const long long max_queued_tokens = std::atoll(cli.Get("", "--max-queued-tokens", "1048576").c_str());
  const long long step_rows = std::atoll(cli.Get("", "--step-rows", "64").c_str());
  const long long prefill_chunk = std::atoll(cli.Get("", "--prefill-chunk", "256").c_str());
  const long long prefix_cache_mb = std::atoll(cli.Get("", "--prefix-cache-mb", "1024").c_str());
  const bool no_warmup = cli.Flag("--no-warmup");
  const long long max_body = std::atoll(cli.Get("", "--max-body-bytes", "33554432").c_str());
  const long long max_output = std::atoll(cli.Get("", "--max-output-tokens", "0").c_str());
  const std::string temp = cli.Get("", "--temp");  // default temperature for requests without one
  const double drain_s = std::atof(cli.Get("", "--drain-seconds", "30").c_str());
  if (!cli.Finish("serve")) return 2;
  if (sopts.port < 0 || sopts.port > 65535 || max_queue < 0 || max_active < 1 || max_queued_tokens < 1 ||
      step_rows < 1 || prefill_chunk < 1 || prefix_cache_mb < 0 || max_body < 1024 || n_ctx_arg < 0 || max_output < 0 || !(drain_s >= 0 && drain_s <= 86400)) {
    std::fprintf(stderr,
                 "mererun serve: bad --port, --max-active, --max-queue, --max-queued-tokens, --step-rows, --prefill-chunk, "
                 "--prefix-cache-mb, --max-body-bytes, --max-output-tokens, --drain-seconds or -c value\n");
    return 2;
  }
  sopts.max_body_bytes = static_cast<size_t>(max_body);
  // Every admitted or queued request holds a connection thread while it waits; the spare ones
  // answer /health, /metrics, count_tokens and the 429/529 refusals under load.
  sopts.http_threads = max_active + max_queue + 16;
  auto signing_key = server::LoadOrCreateSigningKey(signing_key_file);
  if (!signing_key.ok()) {
    std::fprintf(stderr, "mererun serve: %s (--signing-key-file PATH chooses another file)\n",
                 signing_key.status().message().c_str());
    return 1;
  }

  // Signals are taken by one thread (sigwait) so that shutdown runs outside a signal handler;
  // every thread started below inherits the blocked mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto model = LoadModelOrReport("serve", margs);
  if (!model) return 1;
  const int64_t n_ctx_train = model->config().n_ctx_train > 0 ? model->config().n_ctx_train : 4096;
  const int64_t n_ctx = n_ctx_arg > 0 ? n_ctx_arg : std::min<int64_t>(n_ctx_train, 32768);

  server::ServedModel sm;
  sm.model = model.get();
  sm.id = margs.model;
  if (std::filesystem::exists(sm.id)) sm.id = std::filesystem::path(sm.id).stem().string();
  sm.family = DetectChatFamily(model->file());
  sm.default_sampling = ModelDefaultSampling(*model);
  if (!temp.empty()) sm.default_sampling.temperature = std::strtof(temp.c_str(), nullptr);
  sm.n_ctx = n_ctx;
  sm.max_output_tokens = max_output;
  sm.created_unix = static_cast<int64_t>(std::time(nullptr));
  sm.signing_key = *signing_key;

  server::EngineOptions eopts;
  eopts.n_ctx = n_ctx;
  eopts.max_active = max_active;
  eopts.max_queued = max_queue;
  eopts.max_queued_tokens = max_queued_tokens;
  eopts.step_rows = step_rows;
  eopts.prefill_chunk = prefill_chunk;
  eopts.prefix_cache_bytes = static_cast<size_t>(prefix_cache_mb) << 20;
  eopts.warm_up = !no_warmup;
  server::ServerMetrics metrics;
  sm.metrics = &metrics;
  server::Engine engine(*model, eopts, &metrics);
  // The warm-up generation runs before the port opens, so the first client is served at once.
  while (engine.Status().state == server::EngineState::kLoading) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  sm.engine = &engine;
  server::HttpServer http(sm, sopts);

  // SIGINT/SIGTERM: refuse new requests (529), let admitted ones finish for --drain-seconds,
  // end what is left with an error event (never a normal stop reason), then exit. A second
  // signal exits at once.
  std::thread sig_thread([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    std::fprintf(stderr, "[serve] signal %d: draining for up to %.0f s (signal again to exit now)\n", sig, drain_s);
    std::thread([&sigs] {
      int again = 0;
      sigwait(&sigs, &again);
      std::fprintf(stderr, "[serve] signal %d again: exiting now\n", again);
      std::_Exit(130);
    }).detach();
    const bool drained = engine.Drain(std::chrono::milliseconds(static_cast<int64_t>(drain_s * 1000)));
    if (!drained) {
      std::fprintf(stderr, "[serve] drain deadline passed: ending the remaining requests with an error\n");
      engine.AbortAll("the server is shutting down; this response was cut off");
      // Let the handlers write the error events before the connections close.
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    http.Stop();
  });
  Status st = http.Run([&](int port) {
    std::fprintf(stderr, "[serve] %s (%s chat format, context %lld, %d threads) listening on http://%s:%d\n",
                 sm.id.c_str(), ChatFamilyName(sm.family), (long long)n_ctx, model->n_threads(), sopts.host.c_str(), port);
  });
  if (!st.ok()) {
    std::fprintf(stderr, "mererun serve: %s\n", st.message().c_str());
    pthread_kill(sig_thread.native_handle(), SIGTERM);
    sig_thread.join();
    return 1;
  }
  sig_thread.join();
  return 0;
}

}  // namespace mr::app
