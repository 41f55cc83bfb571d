#include "server/http_server.h"

#include <httplib.h>

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

bool IsLoopbackBind(const std::string& host) {
  return host == "127.0.0.1" || host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

}  // namespace

bool IsLoopbackHostHeader(const std::string& h) {
  std::string host = h;
  if (!host.empty() && host[0] == '[') {  // [::1]:8080
    const size_t end = host.find(']');
    if (end == std::string::npos) return false;
    host = host.substr(1, end - 1);
  } else if (host.find(':') != std::string::npos && host.find(':') == host.rfind(':')) {
    host = host.substr(0, host.find(':'));
  }
  for (char& c : host) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0) return true;
  const std::string suffix = ".localhost";
  return host.size() > suffix.size() && host.compare(host.size() - suffix.size(), suffix.size(), suffix) == 0;
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
  template <typename Writer>
  void Stream(httplib::Response& res, std::shared_ptr<Pending> p, std::shared_ptr<Writer> w, bool pings) {
    const int ping_ms = opts.ping_interval_ms;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream", [p, w, pings, ping_ms](size_t, httplib::DataSink& sink) {
          auto send = [&](const std::string& s) { return s.empty() || sink.write(s.data(), s.size()); };
          auto cancel = [&] {
            MR_LOGI("http", "client went away during a stream; cancelling its generation");
            p->job->Cancel();
            return false;
          };
          if (!send(w->Start()) || (pings && !send(AnthropicWriter::Ping()))) return cancel();
          auto last_write = Clock::now();
          for (;;) {
            StreamEvent ev;
            if (p->channel->Pop(&ev, std::chrono::milliseconds(100))) {
              const bool end = ev.kind == StreamEvent::Kind::kDone || ev.kind == StreamEvent::Kind::kError;
              const std::string s = w->Event(ev);
              if (!send(s)) return cancel();
              if (!s.empty()) last_write = Clock::now();
              if (end) {
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
        },
        // Also when the provider never ran (the connection failed before the headers went out).
        [p](bool success) {
          if (!success) p->job->Cancel();
        });
  }

  void Messages(const httplib::Request& req, httplib::Response& res, bool count_only) {
    LogLong(("POST " + req.path + " body").c_str(), req.body);
    const Json body = Json::parse(req.body, nullptr, /*allow_exceptions=*/false);
    if (body.is_discarded()) return SetError(res, Api::kAnthropic, InvalidRequest("the request body is not valid JSON"));
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
    auto w = std::make_shared<AnthropicWriter>(sm, aopts, n_prompt);
    if (aopts.stream) return Stream(res, p, w, /*pings=*/true);
    StreamEvent last;
    if (!Collect(*p, *w, &last)) return;
    if (last.kind == StreamEvent::Kind::kError) return SetError(res, Api::kAnthropic, last.error);
    w->Event(last);
    res.set_content(w->Message().dump(-1, ' ', false, Json::error_handler_t::replace), "application/json");
  }

  void ChatCompletions(const httplib::Request& req, httplib::Response& res) {
    LogLong("POST /v1/chat/completions body", req.body);
    const Json body = Json::parse(req.body, nullptr, false);
    if (body.is_discarded()) return SetError(res, Api::kOpenAI, InvalidRequest("the request body is not valid JSON"));
    ChatRequest chat;
    OpenAIOptions oopts;
    if (auto e = ParseOpenAIRequest(body, sm, &chat, &oopts)) return SetError(res, Api::kOpenAI, *e);
    PreparedChat prepared;
    if (auto e = PrepareChat(sm, std::move(chat), &prepared)) return SetError(res, Api::kOpenAI, *e);
    const int64_t n_prompt = static_cast<int64_t>(prepared.prompt.size());
    auto p = std::make_shared<Pending>();
    if (!Submit(res, Api::kOpenAI, req, std::move(prepared), p.get())) return;
    auto w = std::make_shared<OpenAIWriter>(oopts, n_prompt);
    if (oopts.stream) return Stream(res, p, w, /*pings=*/false);
    StreamEvent last;
    if (!Collect(*p, *w, &last)) return;
    if (last.kind == StreamEvent::Kind::kError) return SetError(res, Api::kOpenAI, last.error);
    w->Event(last);
    res.set_content(w->Completion().dump(-1, ' ', false, Json::error_handler_t::replace), "application/json");
  }

  void Setup() {
    svr.new_task_queue = [n = opts.http_threads] { return new httplib::ThreadPool(static_cast<size_t>(n)); };
    svr.set_payload_max_length(opts.max_body_bytes);
    svr.set_keep_alive_max_count(1000);
    svr.set_keep_alive_timeout(30);
    svr.set_read_timeout(30, 0);
    svr.set_write_timeout(30, 0);
    svr.set_tcp_nodelay(true);
    const bool loopback = IsLoopbackBind(opts.host);
    svr.set_pre_routing_handler([this, loopback](const httplib::Request& req, httplib::Response& res) {
      res.set_header("request-id", RandomId("req_"));
      const Api api = ApiOfPath(req.path);
      MR_LOGI("http", "%s %s", req.method.c_str(), req.target.c_str());
      if (req.method == "HEAD") {
        res.status = 200;
        return httplib::Server::HandlerResponse::Handled;
      }
      size_t header_bytes = 0;
      for (const auto& [k, v] : req.headers) header_bytes += k.size() + v.size() + 4;
      if (header_bytes > opts.max_header_bytes) {
        SetError(res, api, {ApiErrorType::kRequestTooLarge, "request headers exceed " + std::to_string(opts.max_header_bytes) + " bytes"});
        return httplib::Server::HandlerResponse::Handled;
      }
      if (loopback && req.has_header("Host") && !IsLoopbackHostHeader(req.get_header_value("Host"))) {
        SetError(res, api, {ApiErrorType::kPermission, "Host '" + req.get_header_value("Host") +
                                                           "' is not a loopback name; this server only answers local clients"});
        return httplib::Server::HandlerResponse::Handled;
      }
      if (!opts.api_key.empty()) {
        const std::string bearer = "Bearer " + opts.api_key;
        if (req.get_header_value("x-api-key") != opts.api_key && req.get_header_value("Authorization") != bearer) {
          SetError(res, api, {ApiErrorType::kAuthentication, "invalid API key: send it as x-api-key or Authorization: Bearer"});
          return httplib::Server::HandlerResponse::Handled;
        }
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
    svr.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      const Api api = ApiOfPath(req.path);
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

    svr.Post("/v1/messages", [this](const httplib::Request& req, httplib::Response& res) { Messages(req, res, false); });
    svr.Post("/v1/messages/count_tokens",
             [this](const httplib::Request& req, httplib::Response& res) { Messages(req, res, true); });
    svr.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) { ChatCompletions(req, res); });
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
