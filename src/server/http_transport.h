// HTTP/1.1 transport on Boost.Beast/Asio (Debian's libboost-dev): accepting, parsing with limits
// and deadlines, and writing responses. It knows nothing of the APIs; http_server.cpp routes.
//
// Threads: a few I/O threads run every connection's reads asynchronously, so idle, slow or
// half-sent connections cost no thread. A complete request goes first to `quick` on the I/O
// thread (checks, refusals and cheap GETs answer there, at once, whatever generation is
// doing); anything else gets a worker thread of its own for as long as it runs (a generation
// request waits there on the engine and streams from there).
//
// Limits (TransportOptions): a connection cap answered by an immediate 503; a deadline for the
// request head and another for the body (slowloris); header and body size limits enforced by
// the parser for every framing, chunked included; a write deadline per write.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace mr::server {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // as sent, query included
  std::string path;    // target without the query
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  // The connection's socket, for noticing a client that has gone away (PeerClosed) while a
  // worker runs; -1 in `quick` and for refusals.
  int fd = -1;

  bool Has(std::string_view name) const;
  // The first header of that name (case-insensitive); empty when absent.
  std::string Header(std::string_view name) const;
};

// Writes one piece of a streamed body; false once the client cannot take it (gone, or not
// reading within the write deadline). Nothing more should be written after a false.
using BodyWriter = std::function<bool(std::string_view)>;

struct HttpResponse {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;  // besides Content-Type/-Length
  std::string content_type;
  std::string body;
  // Streaming: when set, the head goes out with chunked framing and `stream` writes the body
  // (on the worker thread) until it returns; its return says whether it completed.
  std::function<bool(const BodyWriter&)> stream;
  // Called once after a streamed body: false when the head could not be written (stream never
  // ran) or the stream did not complete.
  std::function<void(bool completed)> on_stream_end;

  void SetHeader(std::string name, std::string value);
  void SetContent(std::string content, std::string type);
};

struct TransportOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port
  int io_threads = 2;
  int max_connections = 512;  // open connections; one more is answered 503 and closed
  size_t max_header_bytes = 64u << 10;
  size_t max_body_bytes = 32u << 20;
  std::chrono::milliseconds header_timeout{10000};  // from the first byte of a request to its end of head
  std::chrono::milliseconds body_timeout{60000};    // for the whole body
  std::chrono::milliseconds keep_alive{5000};       // idle between requests
  std::chrono::milliseconds write_timeout{30000};   // for each write to make progress and finish
};

class HttpTransport {
 public:
  struct Handlers {
    // On an I/O thread: answers the request (fills `res`, returns true) or returns false to hand
    // it to `worker`. It must not block.
    std::function<bool(HttpRequest&, HttpResponse&)> quick;
    // On a worker thread of its own, with `res` as `quick` left it (headers it set stay); may
    // block as long as it needs.
    std::function<void(HttpRequest&, HttpResponse&)> worker;
    // The transport refused the request before any handler saw it (`status` 400, 413, 431 or
    // 503; `partial` has what was parsed, perhaps nothing): fills `res` with an error body.
    std::function<void(int status, const std::string& why, const HttpRequest& partial, HttpResponse& res)> refused;
  };

  HttpTransport(TransportOptions opts, Handlers handlers);
  ~HttpTransport();
  HttpTransport(const HttpTransport&) = delete;
  HttpTransport& operator=(const HttpTransport&) = delete;

  // Binds (an error when the address cannot be bound), calls `on_listening` with the port, and
  // serves until Stop().
  Status Run(const std::function<void(int port)>& on_listening);
  // Stops accepting, cuts the connections that workers hold so that their writes fail, waits
  // (up to `grace`) for workers to return, and ends Run. Any thread; idempotent.
  void Stop(std::chrono::milliseconds grace = std::chrono::milliseconds(10000));

  int open_connections() const;

  struct Impl;  // public only so that the connections (in the .cpp) can name it

 private:
  std::shared_ptr<Impl> impl_;
};

// The HTTP/1.1 head and body of a complete response, as written on the wire.
std::string SerializeResponse(const HttpResponse& res, bool keep_alive);

}  // namespace mr::server
