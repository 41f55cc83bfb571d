// The HTTP front end: routes, checks (Host, Origin, Content-Type, API key), request ids, and
// the bridge between worker threads and the engine (EventChannel per request; SSE streaming
// with pings; disconnect detection that cancels the engine job). Sockets, parsing, limits and
// deadlines are the transport's (http_transport.h, Boost.Beast).
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
#include <functional>
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
  int ping_interval_ms = 3000;    // SSE ping while nothing else is written
  int io_threads = 2;             // accept, parse, checks, /health; generation runs on workers
  int max_connections = 512;      // open connections; one more gets an immediate 503
  int header_timeout_ms = 10000;  // the request head must arrive within this (slowloris)
  int body_timeout_ms = 60000;    // and the body within this
  int keep_alive_ms = 5000;       // an idle keep-alive connection is closed after this
  int write_timeout_ms = 30000;   // a client that does not read for this long is dropped
  // Names accepted in the Host header besides loopback literals and "localhost" (DNS
  // rebinding protection; checked when bound to a loopback address).
  std::vector<std::string> allow_hosts;
  // Browser origins allowed to call the server (CORS); "*" allows any. Empty: any request
  // carrying an Origin header is refused with 403, so web pages cannot drive the server.
  std::vector<std::string> allow_origins;
  RequestLimits limits;
  // /v1/responses stored for previous_response_id and GET (`store`, default true): at most this
  // many MiB of response JSON and responses_store_count responses, the oldest dropped first.
  int responses_store_mb = 64;
  size_t responses_store_count = 10000;
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
// The value of query parameter `name` in a request target ("/health?identity=ab12"), with
// %XX and '+' decoded; empty when absent. The first occurrence wins.
std::string QueryParam(std::string_view target, std::string_view name);
// Constant-time comparison of a presented API key with the configured one (digests compared
// with CRYPTO_memcmp, so neither the content nor the length leaks through timing).
bool ApiKeyMatches(const std::string& presented, const std::string& expected);

}  // namespace mr::server
