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
#include <vector>

#include "base/status.h"
#include "server/chat_session.h"
#include "server/request_fields.h"

namespace mr::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;  // empty: no key required
  size_t max_body_bytes = 32u << 20;
  size_t max_header_bytes = 64u << 10;
  int ping_interval_ms = 3000;  // SSE ping while nothing else is written
  // Connections served at once. cmd_serve sizes it above max_active + max_queue so that the
  // engine's 429/529 are reachable over HTTP and /health keeps spare threads under load.
  int http_threads = 16;
  int keep_alive_s = 5;  // an idle keep-alive connection holds a thread this long at most
  // Names accepted in the Host header besides loopback literals and "localhost" (DNS
  // rebinding protection; checked when bound to a loopback address).
  std::vector<std::string> allow_hosts;
  // Browser origins allowed to call the server (CORS); "*" allows any. Empty: any request
  // carrying an Origin header is refused with 403, so web pages cannot drive the server.
  std::vector<std::string> allow_origins;
  RequestLimits limits;
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

// True when `host_header` (a Host header, port allowed) is a loopback literal (127.0.0.0/8 in
// dotted-quad form, [::1]), "localhost", or one of `allowed` (case-insensitive). Anything
// malformed (a bad port, trailing dots, user info) is false.
bool IsAllowedHostHeader(const std::string& host_header, const std::vector<std::string>& allowed = {});
// True when `origin` (an Origin header) is allowed by `allowed` ("*" or an exact, case-insensitive
// match such as "http://localhost:3000").
bool IsAllowedOrigin(const std::string& origin, const std::vector<std::string>& allowed);
// Media type of a Content-Type header is application/json (parameters allowed).
bool IsJsonContentType(const std::string& content_type);
// Constant-time comparison of a presented API key with the configured one (digests compared
// with CRYPTO_memcmp, so neither the content nor the length leaks through timing).
bool ApiKeyMatches(const std::string& presented, const std::string& expected);

}  // namespace mr::server
