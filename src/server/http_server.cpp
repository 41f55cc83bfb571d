#include "server/http_server.h"

// The default listen backlog of 5 drops SYNs in a burst of clients, which then retry after 1 s.
#define CPPHTTPLIB_LISTEN_BACKLOG 4096
#include <httplib.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "base/log.h"
#include "server/anthropic_api.h"
#include "server/connection.h"
#include "server/openai_api.h"

namespace mr::server {
namespace {

using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

enum class Api { kAnthropic, kOpenAI };

Api ApiOfPath(const std::string& path) {
  return path.rfind("/v1/chat/", 0) == 0 || path.rfind("/v1/completions", 0) == 0 ? Api::kOpenAI : Api::kAnthropic;
}

void SetError(httplib::Response& res, Api api, const ApiError& e) {
  res.status = HttpStatus(e.type);
  if (e.retry_after_s > 0) res.set_header("retry-after", std::to_string(e.retry_after_s));
  res.set_content(api == Api::kOpenAI ? OpenAIErrorBody(e) : AnthropicErrorBody(e), "application/json");
}

// Long text (request bodies, prompts) to stderr at debug level, untruncated.
void LogLong(const char* what, const std::string& text) {
  if (!MR_LOG_ENABLED(kDebug)) return;
  std::fprintf(stderr, "D [http] %s (%zu bytes):\n", what, text.size());
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fputc('\n', stderr);
}

// The requests counted in mererun_requests_total.
bool IsGenerationPath(const std::string& path) { return path == "/v1/messages" || path == "/v1/chat/completions"; }

Outcome OutcomeOfStatus(int status) {
  if (status == 429) return Outcome::kRateLimited;
  if (status == 529) return Outcome::kOverloaded;
  if (status >= 500) return Outcome::kError;
  if (status >= 400) return Outcome::kInvalid;
  return Outcome::kOk;  // also -1: the handler left the status to the library (200)
}

void CountRequest(ServerMetrics* m, Api api, Outcome o) {
  if (m != nullptr) m->requests[api == Api::kOpenAI ? 1 : 0][static_cast<int>(o)].fetch_add(1, std::memory_order_relaxed);
}

// One generation request's entry in mererun_requests_total, counted when the last owner lets go:
// the handler for a plain response, the streaming provider (kept by the response until the
// stream is over) for SSE.
struct RequestCount {
  RequestCount(ServerMetrics* metrics, Api a) : m(metrics), api(a) {}
  ~RequestCount() { CountRequest(m, api, job && job->cancelled ? Outcome::kCancelled : outcome); }
  RequestCount(const RequestCount&) = delete;
  RequestCount& operator=(const RequestCount&) = delete;
  ServerMetrics* m;
  Api api;
  Outcome outcome = Outcome::kError;  // until the handler returns (it may throw)
  std::shared_ptr<EngineJob> job;  // once submitted: a cancelled job means the client left
};

bool IsLoopbackBind(const std::string& host) {
  return host == "127.0.0.1" || host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

}  // namespace

namespace {

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool AllDigits(std::string_view s, size_t max_len) {
  return !s.empty() && s.size() <= max_len && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// 127.a.b.c with every part a decimal 0..255 (no leading zeros, which some resolvers read as octal).
bool IsLoopbackIpv4(std::string_view h) {
  int parts = 0;
  size_t pos = 0;
  while (pos <= h.size()) {
    const size_t dot = std::min(h.find('.', pos), h.size());
    const std::string_view part = h.substr(pos, dot - pos);
    if (!AllDigits(part, 3) || (part.size() > 1 && part[0] == '0') || std::stoi(std::string(part)) > 255) return false;
    if (parts == 0 && part != "127") return false;
    ++parts;
    pos = dot + 1;
  }
  return parts == 4;
}

}  // namespace

bool IsAllowedHostHeader(const std::string& header, const std::vector<std::string>& allowed) {
  std::string host = Lower(header);
  if (!host.empty() && host[0] == '[') {  // [::1]:8080
    const size_t end = host.find(']');
    if (end == std::string::npos) return false;
    const std::string rest = host.substr(end + 1);
    if (!rest.empty() && (rest[0] != ':' || !AllDigits(std::string_view(rest).substr(1), 5))) return false;
    host = host.substr(1, end - 1);
    return host == "::1" || std::find(allowed.begin(), allowed.end(), "[" + host + "]") != allowed.end();
  }
  if (host == "::1") return true;  // unbracketed, as some clients send it
  const size_t colon = host.find(':');
  if (colon != std::string::npos) {
    if (!AllDigits(std::string_view(host).substr(colon + 1), 5)) return false;
    host.resize(colon);
  }
  if (host == "localhost" || IsLoopbackIpv4(host)) return true;
  for (const std::string& a : allowed)
    if (!host.empty() && Lower(a) == host) return true;
  return false;
}

bool IsAllowedOrigin(const std::string& origin, const std::vector<std::string>& allowed) {
  const std::string o = Lower(origin);
  for (const std::string& a : allowed)
    if (a == "*" || Lower(a) == o) return true;
  return false;
}

bool IsJsonContentType(const std::string& content_type) {
  std::string media = Lower(content_type.substr(0, content_type.find(';')));
  while (!media.empty() && (media.back() == ' ' || media.back() == '\t')) media.pop_back();
  size_t lead = 0;
  while (lead < media.size() && (media[lead] == ' ' || media[lead] == '\t')) ++lead;
  return media.substr(lead) == "application/json";
}

bool ApiKeyMatches(const std::string& presented, const std::string& expected) {
  unsigned char a[SHA256_DIGEST_LENGTH], b[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(presented.data()), presented.size(), a);
  SHA256(reinterpret_cast<const unsigned char*>(expected.data()), expected.size(), b);
  return CRYPTO_memcmp(a, b, sizeof(a)) == 0;
}

struct HttpServer::Impl {
  ServedModel sm;
  ServerOptions opts;
  httplib::Server svr;

  // Per-request state shared between the handler and the streaming provider.
  struct Pending {
    std::shared_ptr<EventChannel> channel = std::make_shared<EventChannel>();
    std::shared_ptr<EngineJob> job;
    int fd = -1;
  };

  Json ModelEntry() const {
    char created[32];
    std::time_t t = static_cast<std::time_t>(sm.created_unix);
    std::tm tm{};
    gmtime_r(&t, &tm);
    std::strftime(created, sizeof(created), "%Y-%m-%dT%H:%M:%SZ", &tm);
    return {{"type", "model"},         {"id", sm.id},          {"display_name", sm.id}, {"created_at", created},
            {"object", "model"},       {"created", sm.created_unix}, {"owned_by", "mererun"}};
  }

  // Submits the prepared chat; on error the response is already set.
  bool Submit(httplib::Response& res, Api api, const httplib::Request& req, PreparedChat prepared, Pending* p) {
    p->fd = FindConnectionSocket(req.remote_addr, req.remote_port, req.local_port);
    if (auto e = StartChat(sm, std::move(prepared), p->channel, &p->job)) {
      SetError(res, api, *e);
      return false;
    }
    return true;
  }

  // Non-streaming: wait for the outcome, watching the socket; false when the client left.
  template <typename Writer>
  bool Collect(Pending& p, Writer& w, StreamEvent* last) {
    // The socket is checked every 100 ms whether or not events arrive: a fast model produces
    // tokens more often than that, and the check must not depend on a quiet channel.
    auto next_check = Clock::now();
    for (;;) {
      StreamEvent ev;
      if (p.channel->Pop(&ev, std::chrono::milliseconds(100))) {
        if (ev.kind == StreamEvent::Kind::kDone || ev.kind == StreamEvent::Kind::kError) {
          *last = std::move(ev);
          return !p.job->cancelled;
        }
        w.Event(ev);
      }
      if (Clock::now() >= next_check) {
        next_check = Clock::now() + std::chrono::milliseconds(100);
        if (!p.job->cancelled && PeerClosed(p.fd)) {
          MR_LOGI("http", "client went away; cancelling its generation");
          p.job->Cancel();
        }
      }
    }
  }

  // Streaming: SSE from the channel, with pings; false (and cancel) when the client left.
  // `pings` (Anthropic): the stream opens with message_start once the engine has started the
  // request (its usage then has the real cache counts), with pings while it is queued (the
  // official SDKs skip pings wherever they come); otherwise the writer's start goes out at once.
  template <typename Writer>
  void Stream(httplib::Response& res, std::shared_ptr<Pending> p, std::shared_ptr<Writer> w, bool pings,
              std::shared_ptr<RequestCount> count) {
    const int ping_ms = opts.ping_interval_ms;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream", [p, w, pings, ping_ms, count](size_t, httplib::DataSink& sink) {
          auto send = [&](const std::string& s) { return s.empty() || sink.write(s.data(), s.size()); };
          auto cancel = [&] {
            MR_LOGI("http", "client went away during a stream; cancelling its generation");
            p->job->Cancel();
            return false;
          };
          // cpp-httplib 0.11 calls the provider outside any try block: an exception here would
          // end the process. A failure ends this stream (and its generation) only.
          try {
            bool started = !pings;
            if (started && !send(w->Start())) return cancel();
            auto last_write = Clock::now();
            for (;;) {
              StreamEvent ev;
              if (p->channel->Pop(&ev, std::chrono::milliseconds(100))) {
                if (!started) {
                  // kStarted carries the counts; an end before it (cancelled or refused while
                  // queued) still opens the message first.
                  if (ev.kind == StreamEvent::Kind::kStarted) w->Event(ev);
                  if (!send(w->Start()) || !send(AnthropicWriter::Ping())) return cancel();
                  started = true;
                  last_write = Clock::now();
                  if (ev.kind == StreamEvent::Kind::kStarted) continue;
                }
                const bool end = ev.kind == StreamEvent::Kind::kDone || ev.kind == StreamEvent::Kind::kError;
                const std::string s = w->Event(ev);
                if (!send(s)) return cancel();
                if (!s.empty()) last_write = Clock::now();
                if (end) {
                  if (ev.kind == StreamEvent::Kind::kError) count->outcome = Outcome::kError;
                  sink.done();
                  return true;
                }
              } else {
                if (PeerClosed(p->fd)) return cancel();
                if (pings && Clock::now() - last_write > std::chrono::milliseconds(ping_ms)) {
                  if (!send(AnthropicWriter::Ping())) return cancel();
                  last_write = Clock::now();
                }
              }
            }
          } catch (const std::exception& e) {
            MR_LOGE("http", "stream failed: %s", e.what());
            count->outcome = Outcome::kError;
            p->job->Cancel();
            return false;
          }
        },
        // Also when the provider never ran (the connection failed before the headers went out).
        [p, count](bool success) {
          if (!success) p->job->Cancel();
        });
  }

  // `count` (null for count_tokens) is told the outcome of a plain response here; a streamed one
  // tells its own.
  void Messages(const httplib::Request& req, httplib::Response& res, bool count_only, std::shared_ptr<RequestCount> count) {
    LogLong(("POST " + req.path + " body").c_str(), req.body);
    Json body;
    if (auto e = ParseRequestBody(req.body, opts.limits, &body)) return SetError(res, Api::kAnthropic, *e);
    ChatRequest chat;
    AnthropicOptions aopts;
    if (auto e = ParseAnthropicRequest(body, sm, count_only, &chat, &aopts)) {
      MR_LOGI("http", "400: %s", e->message.c_str());
      return SetError(res, Api::kAnthropic, *e);
    }
    PreparedChat prepared;
    if (auto e = PrepareChat(sm, std::move(chat), &prepared, !count_only)) return SetError(res, Api::kAnthropic, *e);
    const int64_t n_prompt = static_cast<int64_t>(prepared.prompt.size());
    if (count_only) {
      res.set_content(Json({{"input_tokens", n_prompt}}).dump(), "application/json");
      return;
    }
    auto p = std::make_shared<Pending>();
    if (!Submit(res, Api::kAnthropic, req, std::move(prepared), p.get())) return;
    count->job = p->job;
    auto w = std::make_shared<AnthropicWriter>(sm, aopts, n_prompt);
    if (aopts.stream) return Stream(res, p, w, /*pings=*/true, std::move(count));
    StreamEvent last;
    if (!Collect(*p, *w, &last)) return;
    if (last.kind == StreamEvent::Kind::kError) return SetError(res, Api::kAnthropic, last.error);
    w->Event(last);
    res.set_content(w->Message().dump(-1, ' ', false, Json::error_handler_t::replace), "application/json");
  }

  void ChatCompletions(const httplib::Request& req, httplib::Response& res, std::shared_ptr<RequestCount> count) {
    LogLong("POST /v1/chat/completions body", req.body);
    Json body;
    if (auto e = ParseRequestBody(req.body, opts.limits, &body)) return SetError(res, Api::kOpenAI, *e);
    ChatRequest chat;
    OpenAIOptions oopts;
    if (auto e = ParseOpenAIRequest(body, sm, &chat, &oopts)) return SetError(res, Api::kOpenAI, *e);
    PreparedChat prepared;
    if (auto e = PrepareChat(sm, std::move(chat), &prepared)) return SetError(res, Api::kOpenAI, *e);
    const int64_t n_prompt = static_cast<int64_t>(prepared.prompt.size());
    auto p = std::make_shared<Pending>();
    if (!Submit(res, Api::kOpenAI, req, std::move(prepared), p.get())) return;
    count->job = p->job;
    auto w = std::make_shared<OpenAIWriter>(oopts, n_prompt);
    if (oopts.stream) return Stream(res, p, w, /*pings=*/false, std::move(count));
    StreamEvent last;
    if (!Collect(*p, *w, &last)) return;
    if (last.kind == StreamEvent::Kind::kError) return SetError(res, Api::kOpenAI, last.error);
    w->Event(last);
    res.set_content(w->Completion().dump(-1, ' ', false, Json::error_handler_t::replace), "application/json");
  }

  // GET /health: 200 with the engine's state when it accepts requests, else 503.
  void Health(httplib::Response& res) const {
    const EngineStatus st = sm.engine != nullptr ? sm.engine->Status() : EngineStatus{};
    const bool ready = st.state == EngineState::kReady;
    const char* status = ready ? "ok" : EngineStateName(st.state);
    const Json body = {{"status", status},         {"model", sm.id},           {"active", st.active},
                       {"queued", st.queued},      {"max_active", st.max_active}, {"max_queued", st.max_queued},
                       {"n_ctx", st.n_ctx}};
    res.status = ready ? 200 : 503;
    res.set_content(body.dump(), "application/json");
  }

  void Setup() {
    svr.new_task_queue = [n = opts.http_threads] { return new httplib::ThreadPool(static_cast<size_t>(n)); };
    svr.set_payload_max_length(opts.max_body_bytes);
    svr.set_keep_alive_max_count(1000);
    svr.set_keep_alive_timeout(opts.keep_alive_s);
    svr.set_read_timeout(30, 0);
    svr.set_write_timeout(30, 0);
    svr.set_tcp_nodelay(true);
    const bool loopback = IsLoopbackBind(opts.host);
    svr.set_pre_routing_handler([this, loopback](const httplib::Request& req, httplib::Response& res) {
      res.set_header("request-id", RandomId("req_"));
      const Api api = ApiOfPath(req.path);
      MR_LOGI("http", "%s %s", req.method.c_str(), req.target.c_str());
      size_t header_bytes = 0;
      for (const auto& [k, v] : req.headers) header_bytes += k.size() + v.size() + 4;
      auto refuse = [&](const ApiError& e) {
        SetError(res, api, e);
        if (req.method == "POST" && IsGenerationPath(req.path)) CountRequest(sm.metrics, api, OutcomeOfStatus(res.status));
        return httplib::Server::HandlerResponse::Handled;
      };
      if (header_bytes > opts.max_header_bytes)
        return refuse({ApiErrorType::kRequestTooLarge, "request headers exceed " + std::to_string(opts.max_header_bytes) + " bytes"});
      // DNS rebinding: a page whose name now resolves to 127.0.0.1 still sends its own name.
      if (loopback && req.has_header("Host") && !IsAllowedHostHeader(req.get_header_value("Host"), opts.allow_hosts))
        return refuse({ApiErrorType::kPermission, "Host '" + req.get_header_value("Host") +
                                                      "' is not a loopback name; this server only answers local clients "
                                                      "(serve --allow-host NAME admits another name)"});
      // Browsers send Origin on cross-origin requests (and on every POST): a web page the user
      // opens must not drive the server unless --allow-origin names it. No page is served from
      // here, so no Origin is ever our own.
      if (req.has_header("Origin")) {
        const std::string origin = req.get_header_value("Origin");
        if (!IsAllowedOrigin(origin, opts.allow_origins))
          return refuse({ApiErrorType::kPermission, "requests from web pages (Origin '" + origin +
                                                        "') are refused; serve --allow-origin ORIGIN allows one"});
        res.set_header("Access-Control-Allow-Origin", origin);
        res.set_header("Vary", "Origin");
        if (req.method == "OPTIONS") {  // CORS preflight of an allowed origin
          res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
          res.set_header("Access-Control-Allow-Headers",
                         req.has_header("Access-Control-Request-Headers") ? req.get_header_value("Access-Control-Request-Headers")
                                                                          : "content-type, x-api-key, authorization");
          res.set_header("Access-Control-Max-Age", "600");
          res.status = 204;
          return httplib::Server::HandlerResponse::Handled;
        }
      }
      if (req.method == "HEAD") {
        res.status = 200;
        return httplib::Server::HandlerResponse::Handled;
      }
      // Only JSON bodies: a form or text/plain POST is what a page can send without a
      // preflight. Also refuses chunked uploads, which bypass httplib 0.11's body limit.
      if (req.method == "POST") {
        if (!IsJsonContentType(req.get_header_value("Content-Type")))
          return refuse(InvalidRequest("Content-Type must be application/json, got '" +
                                       req.get_header_value("Content-Type") + "'"));
        if (req.has_header("Transfer-Encoding"))
          return refuse({ApiErrorType::kRequestTooLarge,
                         "chunked request bodies are not accepted; send Content-Length with the body"});
      }
      // /health and /metrics answer without the key (as llama.cpp's /health does): probes and
      // scrapers rarely carry one, and neither shows request content (docs/api.md).
      const bool open_path = req.method == "GET" && (req.path == "/health" || req.path == "/metrics");
      if (!opts.api_key.empty() && !open_path) {
        const std::string auth = req.get_header_value("Authorization");
        const std::string bearer = auth.rfind("Bearer ", 0) == 0 ? auth.substr(7) : std::string();
        const bool key_ok = ApiKeyMatches(req.get_header_value("x-api-key"), opts.api_key);
        const bool bearer_ok = ApiKeyMatches(bearer, opts.api_key);
        if (!key_ok && !bearer_ok)
          return refuse({ApiErrorType::kAuthentication, "invalid API key: send it as x-api-key or Authorization: Bearer"});
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
    svr.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      const Api api = ApiOfPath(req.path);
      // Refused by the library before any handler ran (a body over the limit): still a finished
      // generation request. Handler-made errors have a body and are counted by their handler.
      if (req.method == "POST" && IsGenerationPath(req.path) && res.status != 404 && res.status != 405)
        CountRequest(sm.metrics, api, OutcomeOfStatus(res.status));
      if (res.status == 404) {
        SetError(res, api, {ApiErrorType::kNotFound, "no such endpoint: " + req.method + " " + req.path});
      } else if (res.status == 413) {
        SetError(res, api, {ApiErrorType::kRequestTooLarge, "the request body is too large"});
      } else if (res.status == 405) {
        SetError(res, api, {ApiErrorType::kNotFound, "method " + req.method + " is not allowed on " + req.path});
      } else if (res.status >= 500) {
        SetError(res, api, {ApiErrorType::kApi, "internal server error"});
      } else if (res.status >= 400) {
        const int status = res.status;
        SetError(res, api, InvalidRequest("bad request"));
        res.status = status;
      }
    });
    svr.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "unknown error";
      try {
        if (ep) std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      MR_LOGE("http", "handler failed: %s", what.c_str());
      SetError(res, ApiOfPath(req.path), {ApiErrorType::kApi, "internal error: " + what});
    });

    svr.Post("/v1/messages", [this](const httplib::Request& req, httplib::Response& res) {
      auto count = std::make_shared<RequestCount>(sm.metrics, Api::kAnthropic);
      Messages(req, res, false, count);
      count->outcome = OutcomeOfStatus(res.status);  // a streamed response holds its own reference
    });
    svr.Post("/v1/messages/count_tokens",
             [this](const httplib::Request& req, httplib::Response& res) { Messages(req, res, true, nullptr); });
    svr.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      auto count = std::make_shared<RequestCount>(sm.metrics, Api::kOpenAI);
      ChatCompletions(req, res, count);
      count->outcome = OutcomeOfStatus(res.status);
    });
    svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) { Health(res); });
    svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      static const ServerMetrics kNone;
      const EngineStatus st = sm.engine != nullptr ? sm.engine->Status() : EngineStatus{};
      res.set_content(RenderPrometheus(sm.metrics != nullptr ? *sm.metrics : kNone, st),
                      "text/plain; version=0.0.4; charset=utf-8");
    });
    svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      const Json entry = ModelEntry();
      Json body = {{"object", "list"},
                   {"data", Json::array({entry})},
                   {"has_more", false},
                   {"first_id", sm.id},
                   {"last_id", sm.id}};
      res.set_content(body.dump(), "application/json");
    });
    svr.Get(R"(/v1/models/(.+))", [this](const httplib::Request&, httplib::Response& res) {
      // Any id names the served model, as in /v1/messages.
      res.set_content(ModelEntry().dump(), "application/json");
    });
  }
};

HttpServer::HttpServer(ServedModel sm, ServerOptions opts) : impl_(std::make_unique<Impl>()) {
  impl_->sm = std::move(sm);
  impl_->opts = std::move(opts);
  impl_->Setup();
}

HttpServer::~HttpServer() = default;

Status HttpServer::Run(const std::function<void(int port)>& on_listening) {
  int port = impl_->opts.port;
  if (port == 0) {
    port = impl_->svr.bind_to_any_port(impl_->opts.host);
    if (port < 0) return IoError("cannot bind " + impl_->opts.host + " on any port");
  } else if (!impl_->svr.bind_to_port(impl_->opts.host, port)) {
    return IoError("cannot bind " + impl_->opts.host + ":" + std::to_string(port) + " (in use, or not a local address?)");
  }
  if (on_listening) on_listening(port);
  if (!impl_->svr.listen_after_bind()) return IoError("the HTTP server stopped with an error");
  return Status::Ok();
}

void HttpServer::Stop() { impl_->svr.stop(); }

}  // namespace mr::server
