// `mererun serve -m MODEL [--port 8080] [-c CTX] [--api-key KEY] ...` (all options with their
// defaults: `mererun serve --help`): the HTTP server (src/server/).
#include <malloc.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "app/cli.h"
#include "app/commands.h"
#include "app/environment.h"
#include "app/identity.h"
#include "app/model_opts.h"
#include "app/spec_config.h"
#include "base/log.h"
#include "model/catalog.h"
#include "runtime/generator.h"
#include "server/engine.h"
#include "server/http_server.h"
#include "server/signing.h"

namespace mr::app {
namespace {

// Resident memory that follows live memory over a long run (the soak's drift bar, docs/
// reliability.md): glibc raises its mmap threshold each time a large block is freed, after which
// prompt-sized buffers (token lists, request bodies, rendered prompts, per-request logits) come
// from the heap arenas and stay resident after their request, so RSS wanders by the size of the
// largest recent prompts. A fixed threshold sends every block of 256 KiB or more to mmap, which
// returns it on free; heap tops past 1 MiB are trimmed; 4 arenas instead of 8 per core.
void SteadyAllocator() {
#ifdef __GLIBC__
  mallopt(M_MMAP_THRESHOLD, 256 * 1024);
  mallopt(M_TRIM_THRESHOLD, 1024 * 1024);
  mallopt(M_ARENA_MAX, 4);
#endif
}

}  // namespace

int CmdServe(const Args& args) {
  SteadyAllocator();
  Cli cli("serve", "HTTP server: the Anthropic Messages and OpenAI chat completions APIs (docs/api.md).");
  CLI::App& app = cli.app();
  ModelArgs margs;
  AddModelOptions(app, &margs);
  server::ServerOptions sopts;
  sopts.host = "127.0.0.1";
  sopts.port = 8080;
  int64_t n_ctx_arg = 0;
  // The thinking-signature key lives in a 0600 file, never on the command line (ps shows it).
  std::string signing_key_file = (std::filesystem::path(model::MererunHome()) / "signing.key").string();
  std::vector<std::string> allow_hosts, allow_origins;
  int max_queue = 16, max_active = 8;
  long long max_queued_tokens = 1048576, step_rows = 64, prefill_chunk = 256, prefix_cache_mb = 1024;
  std::string cache_dir = (std::filesystem::path(model::MererunHome()) / "kv-cache").string();
  long long cache_disk_mb = 4096;
  double cache_ttl_5m = 300, cache_ttl_1h = 3600;
  bool no_warmup = false;
  long long max_body = 33554432, max_output = 0;
  float temp = 0;  // default temperature for requests without one (model default when not given)
  double drain_s = 30;
  std::string draft_arg, draft_model_arg, draft_tokens_arg, pooling_arg;
  app.add_option("--host", sopts.host, "address to listen on");
  app.add_option("--port", sopts.port, "TCP port (0: any free port, printed on stderr)")->check(InRange(0, 65535));
  app.add_option("-c,--ctx", n_ctx_arg, "context length (0: the model's, at most 32768)")->check(AtLeast<int64_t>(0));
  app.add_option("--api-key", sopts.api_key, "require this key (x-api-key or Authorization: Bearer)")
      ->envname("MERERUN_API_KEY");
  app.add_option("--signing-key-file", signing_key_file, "0600 file holding the thinking-signature key");
  app.add_option("--allow-host", allow_hosts, "extra accepted Host names (repeat or comma list)")->delimiter(',');
  app.add_option("--allow-origin", allow_origins,
                 "browser origins allowed to call the API, * for any (repeat or comma list)")
      ->delimiter(',');
  app.add_option("--max-active", max_active, "requests generated together")->check(AtLeast(1));
  app.add_option("--max-queue", max_queue, "requests waiting for a slot before 429")->check(AtLeast(0));
  app.add_option("--max-queued-tokens", max_queued_tokens, "prompt tokens waiting before 429")->check(AtLeast(1LL));
  app.add_option("--step-rows", step_rows, "rows per batched engine step")->check(AtLeast(1LL));
  app.add_option("--prefill-chunk", prefill_chunk, "prompt rows per prefill chunk")->check(AtLeast(1LL));
  app.add_option("--prefix-cache-mb", prefix_cache_mb, "prefix cache budget in MiB (0: off)")
      ->check(InRange(0LL, 1LL << 30));
  app.add_option("--cache-dir", cache_dir, "disk tier of the prefix cache: KV blocks kept across restarts")
      ->capture_default_str();
  app.add_option("--cache-disk-mb", cache_disk_mb, "disk tier budget in MiB (0: no disk tier)")
      ->check(AtLeast(0LL))
      ->capture_default_str();
  app.add_option("--cache-ttl-5m", cache_ttl_5m, "seconds a \"5m\" cached prefix lives after its last use")
      ->check(InRange(1.0, 86400.0 * 30))
      ->capture_default_str();
  app.add_option("--cache-ttl-1h", cache_ttl_1h, "seconds a \"1h\" cached prefix lives after its last use")
      ->check(InRange(1.0, 86400.0 * 30))
      ->capture_default_str();
  app.add_flag("--no-warmup", no_warmup, "skip the warm-up generation before the port opens");
  app.add_option("--max-body-bytes", max_body, "largest request body")->check(AtLeast(1024LL));
  app.add_option("--max-connections", sopts.max_connections, "open connections; one more gets an immediate 503")
      ->check(AtLeast(1));
  app.add_option("--header-timeout-ms", sopts.header_timeout_ms, "time for a request's head to arrive")
      ->check(AtLeast(100));
  app.add_option("--body-timeout-ms", sopts.body_timeout_ms, "time for a request's body to arrive")
      ->check(AtLeast(100));
  app.add_option("--responses-store-mb", sopts.responses_store_mb,
                 "memory for stored /v1/responses (previous_response_id, GET); the oldest go first (0: none)")
      ->check(AtLeast(0))
      ->capture_default_str();
  app.add_option("--max-output-tokens", max_output, "cap on max_tokens per request (0: context only)")
      ->check(AtLeast(0LL));
  CLI::Option* temp_opt =
      app.add_option("--temp", temp, "temperature for requests that give none (default: the model's)")
          ->check(InRange(0.0f, 2.0f))
          ->default_str("");
  app.add_option("--draft", draft_arg,
                 "speculative drafter: off, ngram, model, chain (ngram, then the draft model), model:NAME "
                 "(default: ngram; chain with --draft-model; env MERERUN_DRAFT)")
      ->type_name("DRAFTER");
  app.add_option("--draft-model", draft_model_arg, "draft model (catalog name or GGUF path) with the same vocabulary")
      ->type_name("NAME");
  app.add_option("--draft-tokens", draft_tokens_arg,
                 "drafts per step: auto (the cost controller picks 0..7), auto:KMAX or N (default auto; env "
                 "MERERUN_DRAFT_TOKENS)")
      ->type_name("K");
  app.add_option("--pooling", pooling_arg,
                 "how /v1/embeddings pools the hidden states: mean, cls or last (default: the model file's "
                 "pooling type, else mean)")
      ->check(CLI::IsMember({"mean", "cls", "last"}));
  app.add_option("--drain-seconds", drain_s, "on SIGINT/SIGTERM, time admitted requests get to finish")
      ->check(InRange(0.0, 86400.0));
  if (auto rc = cli.Parse(args)) return *rc;
  sopts.allow_hosts = NonEmpty(std::move(allow_hosts));
  sopts.allow_origins = NonEmpty(std::move(allow_origins));
  sopts.max_body_bytes = static_cast<size_t>(max_body);
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

  // Speculative decoding: n-gram lookup by default (chain with a draft model), then
  // MERERUN_DRAFT / MERERUN_DRAFT_TOKENS, then the flags.
  DecodeConfig spec;
  spec.ngram = true;
  if (Status st = ApplyDraftEnvironment(&spec); !st.ok()) {
    std::fprintf(stderr, "mererun serve: %s\n", st.message().c_str());
    return kUsageError;
  }
  if (!draft_model_arg.empty()) {
    spec.draft_model = draft_model_arg;
    if (draft_arg.empty() && spec.speculative()) spec.use_model = true;
  }
  std::string spec_err;
  if ((!draft_arg.empty() && !SetConfigValue("--draft", draft_arg, &spec, &spec_err)) ||
      (!draft_tokens_arg.empty() && !SetConfigValue("--draft-tokens", draft_tokens_arg, &spec, &spec_err))) {
    std::fprintf(stderr, "mererun serve: %s\n", spec_err.c_str());
    return kUsageError;
  }
  if (Status st = spec.Validate(); !st.ok()) {
    std::fprintf(stderr, "mererun serve: %s\n", st.message().c_str());
    return kUsageError;
  }

  auto model = LoadModelOrReport("serve", margs);
  if (!model) return 1;
  std::unique_ptr<Model> draft_model;
  if (spec.use_model) {
    ModelArgs dargs = margs;
    dargs.model = spec.draft_model;
    draft_model = LoadModelOrReport("serve (draft model)", dargs);
    if (!draft_model) return 1;
  }
  const int64_t n_ctx_train = model->config().n_ctx_train > 0 ? model->config().n_ctx_train : 4096;
  const int64_t n_ctx = n_ctx_arg > 0 ? n_ctx_arg : std::min<int64_t>(n_ctx_train, 32768);

  server::ServedModel sm;
  sm.model = model.get();
  sm.id = margs.model;
  if (std::filesystem::exists(sm.id)) sm.id = std::filesystem::path(sm.id).stem().string();
  sm.family = DetectChatFamily(model->file());
  sm.default_sampling = ModelDefaultSampling(*model);
  if (temp_opt->count() > 0) sm.default_sampling.temperature = temp;
  sm.n_ctx = n_ctx;
  sm.max_output_tokens = max_output;
  sm.pooling = ChoosePooling(pooling_arg, *model);
  sm.created_unix = static_cast<int64_t>(std::time(nullptr));
  sm.signing_key = *signing_key;
  {
    const auto t0 = std::chrono::steady_clock::now();
    sm.masker = std::make_shared<const TokenMasker>(model->tokenizer(), model->config().n_vocab);
    MR_LOGI("serve", "token masks for constrained decoding ready in %.0f ms",
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  sm.environment = ControlEnvironment();
  sm.drafter = spec.DrafterName();
  sm.draft_tokens = spec.TokensName();
  {
    ReplicaSettings rs;
    rs.model_id = sm.id;
    rs.n_ctx = n_ctx;
    rs.max_output_tokens = max_output;
    rs.drafter = sm.drafter;
    rs.draft_tokens = sm.draft_tokens;
    rs.default_temperature = sm.default_sampling.temperature;
    rs.default_top_p = sm.default_sampling.top_p;
    rs.default_top_k = sm.default_sampling.top_k;
    rs.default_min_p = sm.default_sampling.min_p;
    rs.pooling = PoolingName(sm.pooling);
    auto identity = MakeReplicaIdentity(*model, rs);
    if (!identity.ok()) {
      std::fprintf(stderr, "mererun serve: %s\n", identity.status().message().c_str());
      return 1;
    }
    sm.identity = identity->fields;
    sm.identity_hash = identity->hash;
  }

  server::EngineOptions eopts;
  eopts.n_ctx = n_ctx;
  eopts.max_active = max_active;
  eopts.max_queued = max_queue;
  eopts.max_queued_tokens = max_queued_tokens;
  eopts.step_rows = step_rows;
  eopts.prefill_chunk = prefill_chunk;
  eopts.prefix_cache_bytes = static_cast<size_t>(prefix_cache_mb) << 20;
  eopts.cache_dir = cache_dir;
  eopts.cache_disk_bytes = static_cast<size_t>(cache_disk_mb) << 20;
  eopts.cache_ttl_s = cache_ttl_5m;
  eopts.cache_long_ttl_s = std::max(cache_ttl_5m, cache_ttl_1h);
  eopts.warm_up = !no_warmup;
  if (spec.speculative()) {
    eopts.make_drafter = [&spec, &model, &draft_model, &margs, n_ctx]() -> Result<std::unique_ptr<Drafter>> {
      auto d = MakeDrafter(spec, *model, draft_model.get(), n_ctx, margs.model);
      if (!d.ok()) return d.status();
      return std::unique_ptr<Drafter>(std::move(d).value());
    };
    eopts.draft_tokens = spec.k;
    eopts.draft_adaptive = spec.adaptive;
    // A drafter that cannot be made (another vocabulary) is a start-up error, not a silent
    // fallback to plain decoding.
    if (auto probe = eopts.make_drafter(); !probe.ok()) {
      std::fprintf(stderr, "mererun serve: %s\n", probe.status().message().c_str());
      return 1;
    }
  }
  server::ServerMetrics metrics;
  sm.metrics = &metrics;
  server::Engine engine(*model, eopts, &metrics);
  // The port opens at once: during the warm-up generation /health says "loading" (529) and
  // requests get 529 with retry-after, so clients and load balancers wait for readiness.
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
                 sm.id.c_str(), ChatFamilyName(sm.family), (long long)n_ctx, model->n_threads(), sopts.host.c_str(),
                 port);
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
