// The HTTP front end (cpp-httplib): routes, limits, API key, Host check, request ids, and the
// bridge between handler threads and the engine (EventChannel per request; SSE streaming with
// pings; disconnect detection that cancels the engine job).
//
//   POST /v1/messages[?beta=true]   Anthropic Messages (anthropic_api.*)
//   POST /v1/messages/count_tokens
//   POST /v1/chat/completions       OpenAI Chat Completions (openai_api.*)
//   GET  /v1/models, /v1/models/{id}
//   GET  /health                    engine state and counts (200 ready, 503 otherwise); no API key
//   GET  /metrics                   Prometheus text (metrics.h); no API key
//   HEAD any path                   200
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "server/chat_session.h"

namespace mr::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;  // empty: no key required
  size_t max_body_bytes = 32u << 20;
  size_t max_header_bytes = 64u << 10;
  int ping_interval_ms = 3000;  // SSE ping while nothing else is written
  int http_threads = 16;
};

class HttpServer {
 public:
  HttpServer(ServedModel sm, ServerOptions opts);
  ~HttpServer();
  // Binds and serves until Stop(); an error when the address cannot be bound.
  // `on_listening` (optional) runs once bound, with the actual port.
  Status Run(const std::function<void(int port)>& on_listening = nullptr);
  void Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// True when `host_header` (a Host header, port allowed) names the loopback interface.
bool IsLoopbackHostHeader(const std::string& host_header);

}  // namespace mr::server
