#include "server/http_transport.h"

#include <poll.h>
#include <strings.h>
#include <sys/socket.h>

#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "base/log.h"

namespace mr::server {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

bool IEquals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && strncasecmp(a.data(), b.data(), a.size()) == 0;
}

// Header names and values come from this program, but some echo request text (an allowed
// Origin, requested CORS headers): never let one end the line.
void AppendClean(std::string* out, std::string_view s) {
  for (char c : s)
    if (c != '\r' && c != '\n') out->push_back(c);
}

std::string SerializeHead(const HttpResponse& res, bool keep_alive, bool chunked) {
  std::string out = "HTTP/1.1 " + std::to_string(res.status) + " ";
  const auto reason = http::obsolete_reason(http::int_to_status(static_cast<unsigned>(res.status)));
  out.append(reason.empty() ? "Unknown" : std::string_view(reason.data(), reason.size()));
  out += "\r\n";
  if (!res.content_type.empty()) {
    out += "Content-Type: ";
    AppendClean(&out, res.content_type);
    out += "\r\n";
  }
  out += chunked ? std::string("Transfer-Encoding: chunked\r\n")
                 : "Content-Length: " + std::to_string(res.body.size()) + "\r\n";
  for (const auto& [k, v] : res.headers) {
    AppendClean(&out, k);
    out += ": ";
    AppendClean(&out, v);
    out += "\r\n";
  }
  out += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  return out;
}

// Writes all of `data` to a socket (blocking or not) within `deadline`; false when the peer is
// gone or does not read in time.
bool SendAll(int fd, std::string_view data, Clock::time_point deadline) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return false;
      pollfd p{fd, POLLOUT, 0};
      const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
      if (r < 0 && errno != EINTR) return false;
      if (r > 0 && (p.revents & (POLLERR | POLLHUP | POLLNVAL))) return false;
      continue;
    }
    return false;
  }
  return true;
}

// Ends a connection without losing the response just written: stop sending, then read and drop
// what the client still sends (an unread body would make close() send a reset, and the client
// could lose the response) for up to a second and 1 MiB.
struct Discard {
  std::shared_ptr<beast::tcp_stream> stream;
  std::shared_ptr<std::array<char, 4096>> buf;
  size_t total = 0;
  void operator()(beast::error_code ec, size_t n) {
    total += n;
    if (ec || total > (1u << 20)) {
      beast::error_code ignored;
      stream->socket().close(ignored);
      return;
    }
    auto& s = *stream;
    auto& b = *buf;
    s.async_read_some(net::buffer(b), std::move(*this));
  }
};

void LingeringClose(const std::shared_ptr<beast::tcp_stream>& stream) {
  beast::error_code ec;
  stream->socket().shutdown(tcp::socket::shutdown_send, ec);
  if (ec) {
    stream->socket().close(ec);
    return;
  }
  stream->expires_after(std::chrono::seconds(1));
  auto buf = std::make_shared<std::array<char, 4096>>();
  stream->async_read_some(net::buffer(*buf), Discard{stream, buf, 0});
}

// The head of `msg`; the body too (moved out, not copied: it may be tens of MiB) when with_body.
HttpRequest RequestOf(http::request<http::string_body>& msg, bool with_body) {
  HttpRequest req;
  req.method = std::string(msg.method_string());
  req.target = std::string(msg.target());
  req.path = req.target.substr(0, req.target.find('?'));
  for (const auto& f : msg) req.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
  if (with_body) req.body = std::move(msg.body());
  return req;
}

}  // namespace

bool HttpRequest::Has(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (IEquals(k, name)) return true;
  return false;
}

std::string HttpRequest::Header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (IEquals(k, name)) return v;
  return {};
}

void HttpResponse::SetHeader(std::string name, std::string value) {
  for (auto& [k, v] : headers) {
    if (IEquals(k, name)) {
      v = std::move(value);
      return;
    }
  }
  headers.emplace_back(std::move(name), std::move(value));
}

void HttpResponse::SetContent(std::string content, std::string type) {
  body = std::move(content);
  content_type = std::move(type);
}

std::string SerializeResponse(const HttpResponse& res, bool keep_alive) {
  return SerializeHead(res, keep_alive, /*chunked=*/false) + res.body;
}

// Ownership: the HttpTransport and every running worker thread hold the Impl (shared_ptr);
// handlers queued in the io_context hold connections, never the Impl (that would be a cycle: the
// Impl owns the io_context), and reach it by a plain pointer, valid because the io_context
// (with every handler still in it) is destroyed first, with the Impl. Members are declared so
// that what connections touch in their destructors (the counter) outlives the io_context.
struct HttpTransport::Impl : std::enable_shared_from_this<Impl> {
  TransportOptions opts;
  Handlers handlers;
  std::atomic<int> connections{0};
  std::atomic<bool> stopping{false};
  std::mutex mu;
  std::condition_variable cv;
  int workers = 0;           // guarded by mu
  std::set<int> worker_fds;  // sockets that workers write to; guarded by mu
  net::io_context ioc;
  tcp::acceptor acceptor{ioc};
  net::steady_timer accept_retry{ioc};

  void Accept();
  void RefuseConnection(tcp::socket socket);
  void Refuse(int status, const std::string& why, const HttpRequest& partial, HttpResponse* res) {
    try {
      handlers.refused(status, why, partial, *res);
    } catch (const std::exception& e) {
      MR_LOGE("http", "refusal handler failed: %s", e.what());
      res->status = status;
      res->body.clear();
    }
  }
};

namespace {

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(HttpTransport::Impl* impl, tcp::socket socket)
      : impl_(impl), stream_(std::make_shared<beast::tcp_stream>(std::move(socket))) {
    impl_->connections.fetch_add(1);
  }
  ~Connection() { impl_->connections.fetch_sub(1); }

  void Start() { ReadHead(impl_->opts.header_timeout); }

 private:
  void ReadHead(std::chrono::milliseconds deadline) {
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(std::min<size_t>(impl_->opts.max_header_bytes, UINT32_MAX)));
    parser_->body_limit(impl_->opts.max_body_bytes);
    stream_->expires_after(deadline);
    http::async_read_header(*stream_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) { self->OnHead(ec); });
  }

  // A read that ended in an error: a refusal when the request was malformed or too large, a
  // quiet close when the client left or ran out of time.
  void OnReadError(beast::error_code ec) {
    if (ec == http::error::header_limit)
      return Refuse(431, "request headers exceed " + std::to_string(impl_->opts.max_header_bytes) + " bytes");
    if (ec == http::error::body_limit)
      return Refuse(413, "the request body exceeds " + std::to_string(impl_->opts.max_body_bytes) + " bytes");
    if (ec.category() == http::make_error_code(http::error::end_of_stream).category() &&
        ec != http::error::end_of_stream && ec != http::error::partial_message)
      return Refuse(400, "malformed HTTP request: " + ec.message());
    if (ec == beast::error::timeout) MR_LOGI("http", "closing a connection that did not send its request in time");
    LingeringClose(stream_);
  }

  void OnHead(beast::error_code ec) {
    if (ec) return OnReadError(ec);
    if (parser_->is_done()) return Dispatch();
    const auto expect = parser_->get()[http::field::expect];
    if (IEquals(std::string_view(expect.data(), expect.size()), "100-continue")) {
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      stream_->expires_after(impl_->opts.write_timeout);
      net::async_write(*stream_, net::buffer(kContinue), [self = shared_from_this()](beast::error_code ec, size_t) {
        if (ec) return LingeringClose(self->stream_);
        self->ReadBody();
      });
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    stream_->expires_after(impl_->opts.body_timeout);
    http::async_read(*stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->OnReadError(ec);
      self->Dispatch();
    });
  }

  void Refuse(int status, const std::string& why) {
    HttpRequest partial;
    if (parser_ && parser_->is_header_done()) partial = RequestOf(parser_->get(), false);
    HttpResponse res;
    impl_->Refuse(status, why, partial, &res);
    keep_alive_ = false;
    WriteAsync(res);
  }

  void Dispatch() {
    stream_->expires_never();
    keep_alive_ = parser_->get().keep_alive() && !impl_->stopping.load();
    HttpRequest req = RequestOf(parser_->get(), true);
    parser_.reset();
    HttpResponse res;
    bool answered = false;
    try {
      answered = impl_->handlers.quick(req, res);
    } catch (const std::exception& e) {
      MR_LOGE("http", "request check failed: %s", e.what());
      res = HttpResponse{};
      impl_->Refuse(500, e.what(), req, &res);
      answered = true;
    }
    if (answered) return WriteAsync(res);
    StartWorker(std::move(req), std::move(res));
  }

  void WriteAsync(const HttpResponse& res) {
    auto data = std::make_shared<std::string>(SerializeResponse(res, keep_alive_));
    stream_->expires_after(impl_->opts.write_timeout);
    net::async_write(*stream_, net::buffer(*data),
                     [self = shared_from_this(), data](beast::error_code ec, size_t) { self->AfterResponse(!ec); });
  }

  void AfterResponse(bool ok) {
    if (ok && keep_alive_ && !impl_->stopping.load()) return ReadHead(impl_->opts.keep_alive);
    LingeringClose(stream_);
  }

  void StartWorker(HttpRequest req, HttpResponse res) {
    const int fd = stream_->socket().native_handle();
    {
      std::lock_guard<std::mutex> lock(impl_->mu);
      ++impl_->workers;
      impl_->worker_fds.insert(fd);
    }
    try {
      std::thread([impl = impl_->shared_from_this(), self = shared_from_this(), req = std::move(req),
                   res = std::move(res), fd]() mutable {
        self->RunWorker(std::move(req), std::move(res), fd);
        self.reset();  // before the count drops, so Stop never outlives a connection in use
        std::lock_guard<std::mutex> lock(impl->mu);
        --impl->workers;
        impl->cv.notify_all();
      }).detach();
    } catch (const std::system_error& e) {
      {
        std::lock_guard<std::mutex> lock(impl_->mu);
        --impl_->workers;
        impl_->worker_fds.erase(fd);
      }
      MR_LOGE("http", "no thread for a request: %s", e.what());
      Refuse(503, "the server cannot take more connections now; retry later");
    }
  }

  void RunWorker(HttpRequest req, HttpResponse res, int fd) {
    req.fd = fd;
    try {
      impl_->handlers.worker(req, res);
    } catch (const std::exception& e) {
      MR_LOGE("http", "handler failed: %s", e.what());
      res = HttpResponse{};
      impl_->Refuse(500, std::string("internal error: ") + e.what(), req, &res);
    }
    const auto timeout = impl_->opts.write_timeout;
    bool ok = false;
    if (res.stream) {
      ok = SendAll(fd, SerializeHead(res, keep_alive_, /*chunked=*/true), Clock::now() + timeout);
      bool completed = false;
      if (ok) {
        completed = res.stream([fd, timeout](std::string_view s) {
          if (s.empty()) return true;
          char size[24];
          std::snprintf(size, sizeof(size), "%zx\r\n", s.size());
          const auto deadline = Clock::now() + timeout;
          return SendAll(fd, size, deadline) && SendAll(fd, s, deadline) && SendAll(fd, "\r\n", deadline);
        });
        ok = completed && SendAll(fd, "0\r\n\r\n", Clock::now() + timeout);
      }
      if (res.on_stream_end) res.on_stream_end(ok && completed);
    } else {
      ok = SendAll(fd, SerializeResponse(res, keep_alive_), Clock::now() + timeout);
    }
    {
      std::lock_guard<std::mutex> lock(impl_->mu);
      impl_->worker_fds.erase(fd);
    }
    net::post(stream_->get_executor(), [self = shared_from_this(), ok] { self->AfterResponse(ok); });
  }

  HttpTransport::Impl* impl_;  // see Impl: outlives every connection
  std::shared_ptr<beast::tcp_stream> stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  bool keep_alive_ = false;
};

}  // namespace

void HttpTransport::Impl::RefuseConnection(tcp::socket socket) {
  HttpResponse res;
  Refuse(503, "too many open connections; retry later", HttpRequest{}, &res);
  auto stream = std::make_shared<beast::tcp_stream>(std::move(socket));
  auto data = std::make_shared<std::string>(SerializeResponse(res, /*keep_alive=*/false));
  stream->expires_after(std::chrono::seconds(2));
  net::async_write(*stream, net::buffer(*data), [stream, data](beast::error_code, size_t) { LingeringClose(stream); });
}

void HttpTransport::Impl::Accept() {
  acceptor.async_accept(net::make_strand(ioc), [self = this](beast::error_code ec, tcp::socket socket) {
    if (self->stopping.load() || ec == net::error::operation_aborted) return;
    if (ec) {
      // Out of descriptors, typically: try again shortly rather than spin.
      MR_LOGE("http", "accept failed: %s", ec.message().c_str());
      self->accept_retry.expires_after(std::chrono::milliseconds(50));
      self->accept_retry.async_wait([self](beast::error_code e) {
        if (!e) self->Accept();
      });
      return;
    }
    beast::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    if (self->connections.load() >= self->opts.max_connections) {
      self->RefuseConnection(std::move(socket));
    } else {
      std::make_shared<Connection>(self, std::move(socket))->Start();
    }
    self->Accept();
  });
}

HttpTransport::HttpTransport(TransportOptions opts, Handlers handlers) : impl_(std::make_shared<Impl>()) {
  impl_->opts = std::move(opts);
  impl_->handlers = std::move(handlers);
}

HttpTransport::~HttpTransport() {
  Stop(std::chrono::milliseconds(0));
}

int HttpTransport::open_connections() const {
  return impl_->connections.load();
}

Status HttpTransport::Run(const std::function<void(int port)>& on_listening) {
  Impl& im = *impl_;
  beast::error_code ec;
  tcp::resolver resolver(im.ioc);
  const auto results = resolver.resolve(im.opts.host, std::to_string(im.opts.port),
                                        tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || results.empty()) return IoError("cannot resolve the address to bind: " + im.opts.host);
  const tcp::endpoint ep = results.begin()->endpoint();
  const std::string where = im.opts.host + ":" + std::to_string(im.opts.port);
  im.acceptor.open(ep.protocol(), ec);
  if (!ec) im.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) im.acceptor.bind(ep, ec);
  if (ec) return IoError("cannot bind " + where + " (" + ec.message() + "; in use, or not a local address?)");
  im.acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) return IoError("cannot listen on " + where + ": " + ec.message());
  if (on_listening) on_listening(im.acceptor.local_endpoint().port());
  if (im.stopping.load()) return Status::Ok();
  im.Accept();
  auto run = [&im] {
    for (;;) {
      try {
        im.ioc.run();
        return;
      } catch (const std::exception& e) {
        MR_LOGE("http", "I/O thread: %s", e.what());
      }
    }
  };
  std::vector<std::thread> threads;
  for (int i = 1; i < std::max(1, im.opts.io_threads); ++i) threads.emplace_back(run);
  run();
  for (auto& t : threads) t.join();
  return Status::Ok();
}

void HttpTransport::Stop(std::chrono::milliseconds grace) {
  Impl& im = *impl_;
  if (im.stopping.exchange(true) && grace.count() == 0) {
    im.ioc.stop();
    return;
  }
  net::post(im.ioc, [impl = &im] {
    beast::error_code ec;
    impl->acceptor.close(ec);
  });
  {
    std::unique_lock<std::mutex> lock(im.mu);
    // Workers writing to clients fail their next write at once; those waiting on the engine
    // notice the closed socket on their next check.
    for (int fd : im.worker_fds) ::shutdown(fd, SHUT_RDWR);
    if (!im.cv.wait_for(lock, grace, [&] { return im.workers == 0; }))
      MR_LOGE("http", "%d request threads still running at shutdown", im.workers);
  }
  im.ioc.stop();
}

}  // namespace mr::server
