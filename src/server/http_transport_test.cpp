// The HTTP transport over real loopback sockets: framing (keep-alive, pipelining, chunked both
// ways, 100-continue), limits (head, body, connections), deadlines (head, write) and Stop.
#include "server/http_transport.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>

namespace mr::server {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

class Client {
 public:
  explicit Client(int port, int rcvbuf = 0) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    if (rcvbuf > 0) setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  }
  ~Client() { close(fd_); }
  bool connected() const { return connected_; }
  bool Send(const std::string& s) {
    return send(fd_, s.data(), s.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(s.size());
  }
  // Reads until `until` appears in what was read, the peer closes, or `timeout` passes.
  std::string ReadUntil(const std::string& until, std::chrono::milliseconds timeout = 5000ms) {
    const auto deadline = Clock::now() + timeout;
    while (until.empty() || got_.find(until) == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left)) <= 0) break;
      char buf[65536];
      const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) {
        closed_ = true;
        break;
      }
      got_.append(buf, static_cast<size_t>(n));
    }
    return got_;
  }
  bool closed() const { return closed_; }
  void Clear() { got_.clear(); }

 private:
  int fd_ = -1;
  bool connected_ = false;
  bool closed_ = false;
  std::string got_;
};

// A transport on an ephemeral port, run on its own thread for the test's lifetime.
class Served {
 public:
  Served(TransportOptions opts, HttpTransport::Handlers h) : t_(std::move(opts), std::move(h)) {
    std::promise<int> port;
    auto f = port.get_future();
    thread_ = std::thread([this, &port] { EXPECT_TRUE(t_.Run([&port](int p) { port.set_value(p); }).ok()); });
    port_ = f.get();
  }
  ~Served() {
    t_.Stop(2000ms);
    thread_.join();
  }
  int port() const { return port_; }
  HttpTransport& transport() { return t_; }

 private:
  HttpTransport t_;
  std::thread thread_;
  int port_ = 0;
};

TransportOptions Opts() {
  TransportOptions o;
  o.port = 0;
  return o;
}

// Echo: "METHOD PATH BODY" from the worker; /quick answers on the I/O thread.
HttpTransport::Handlers Echo() {
  HttpTransport::Handlers h;
  h.quick = [](HttpRequest& req, HttpResponse& res) {
    if (req.path != "/quick") return false;
    res.SetContent("quick", "text/plain");
    return true;
  };
  h.worker = [](HttpRequest& req, HttpResponse& res) {
    res.SetContent(req.method + " " + req.path + " " + req.body, "text/plain");
  };
  h.refused = [](int status, const std::string& why, const HttpRequest&, HttpResponse& res) {
    res.status = status;
    res.SetContent("refused: " + why, "text/plain");
  };
  return h;
}

std::string Post(const std::string& path, const std::string& body, const std::string& extra = "") {
  return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) + "\r\n" + extra +
         "\r\n" + body;
}

TEST(HttpTransport, KeepAliveAndPipelinedRequestsAnswerInOrder) {
  Served s(Opts(), Echo());
  Client c(s.port());
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(c.Send(Post("/a", "one") + Post("/b", "two") + "GET /quick HTTP/1.1\r\nHost: x\r\n\r\n"));
  const std::string out = c.ReadUntil("quick");
  const size_t a = out.find("POST /a one"), b = out.find("POST /b two"), q = out.find("\r\n\r\nquick");
  ASSERT_NE(a, std::string::npos) << out;
  ASSERT_NE(b, std::string::npos) << out;
  ASSERT_NE(q, std::string::npos) << out;
  EXPECT_LT(a, b);
  EXPECT_LT(b, q);
  EXPECT_NE(out.find("Connection: keep-alive"), std::string::npos);
  EXPECT_FALSE(c.closed());
}

TEST(HttpTransport, ExpectContinueThenChunkedUpload) {
  Served s(Opts(), Echo());
  Client c(s.port());
  ASSERT_TRUE(c.Send("POST /up HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n"));
  EXPECT_NE(c.ReadUntil("\r\n\r\n").find("HTTP/1.1 100 Continue"), std::string::npos);
  ASSERT_TRUE(c.Send("3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n"));
  EXPECT_NE(c.ReadUntil("abcdefg").find("POST /up abcdefg"), std::string::npos);
}

TEST(HttpTransport, HeadAndBodyLimitsAreRefused) {
  TransportOptions o = Opts();
  o.max_header_bytes = 4096;
  o.max_body_bytes = 1000;
  Served s(o, Echo());
  {
    Client c(s.port());
    std::string flood = "GET /quick HTTP/1.1\r\n";
    for (int i = 0; i < 200; ++i) flood += "X-H" + std::to_string(i) + ": " + std::string(40, 'v') + "\r\n";
    c.Send(flood + "\r\n");
    EXPECT_EQ(c.ReadUntil("refused").rfind("HTTP/1.1 431", 0), 0u);
  }
  {
    // Refused on the declared length, before the body is sent.
    Client c(s.port());
    c.Send("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5000000\r\n\r\n");
    const std::string out = c.ReadUntil("refused");
    EXPECT_EQ(out.rfind("HTTP/1.1 413", 0), 0u) << out;
    EXPECT_NE(out.find("Connection: close"), std::string::npos);
  }
  {
    // A chunked body is counted as it arrives.
    Client c(s.port());
    std::string req = "POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
    for (int i = 0; i < 20; ++i) req += "64\r\n" + std::string(100, 'z') + "\r\n";
    c.Send(req + "0\r\n\r\n");
    EXPECT_EQ(c.ReadUntil("refused").rfind("HTTP/1.1 413", 0), 0u);
  }
  {
    Client c(s.port());
    c.Send("BROKEN\r\n\r\n");
    EXPECT_EQ(c.ReadUntil("refused").rfind("HTTP/1.1 400", 0), 0u);
  }
}

TEST(HttpTransport, ConnectionCapAnswers503AtOnce) {
  TransportOptions o = Opts();
  o.max_connections = 3;
  Served s(o, Echo());
  Client a(s.port()), b(s.port()), c(s.port());
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(s.transport().open_connections(), 3);
  Client d(s.port());
  const auto t0 = Clock::now();
  d.Send("GET /quick HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string out = d.ReadUntil("refused");
  EXPECT_EQ(out.rfind("HTTP/1.1 503", 0), 0u) << out;
  EXPECT_LT(Clock::now() - t0, 1s);
  // The held connections still work.
  a.Send("GET /quick HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_NE(a.ReadUntil("quick").find("200 OK"), std::string::npos);
}

TEST(HttpTransport, HeadDeadlineClosesSlowConnections) {
  TransportOptions o = Opts();
  o.header_timeout = 300ms;
  Served s(o, Echo());
  Client slow(s.port());
  const auto t0 = Clock::now();
  for (int i = 0; i < 20 && !slow.closed(); ++i) {
    slow.Send("X");  // never ends the head
    slow.ReadUntil("", 100ms);
  }
  EXPECT_TRUE(slow.closed());
  EXPECT_LT(Clock::now() - t0, 1500ms);
  // A normal client meanwhile is unaffected.
  Client c(s.port());
  c.Send("GET /quick HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_NE(c.ReadUntil("quick").find("200 OK"), std::string::npos);
}

TEST(HttpTransport, StreamedResponseIsChunked) {
  HttpTransport::Handlers h = Echo();
  std::promise<bool> ended;
  h.worker = [&ended](HttpRequest&, HttpResponse& res) {
    res.content_type = "text/event-stream";
    res.stream = [](const BodyWriter& write) { return write("data: 1\n\n") && write("") && write("data: 2\n\n"); };
    res.on_stream_end = [&ended](bool ok) { ended.set_value(ok); };
  };
  Served s(Opts(), h);
  Client c(s.port());
  c.Send(Post("/s", ""));
  const std::string out = c.ReadUntil("0\r\n\r\n");
  EXPECT_NE(out.find("Transfer-Encoding: chunked"), std::string::npos);
  EXPECT_NE(out.find("9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n0\r\n\r\n"), std::string::npos) << out;
  EXPECT_TRUE(ended.get_future().get());
}

TEST(HttpTransport, ClientThatStopsReadingIsDroppedAtTheWriteDeadline) {
  TransportOptions o = Opts();
  o.write_timeout = 300ms;
  HttpTransport::Handlers h = Echo();
  std::promise<bool> ended;
  h.worker = [&ended](HttpRequest&, HttpResponse& res) {
    res.stream = [](const BodyWriter& write) {
      const std::string block(1 << 16, 'x');
      for (int i = 0; i < 4096; ++i)  // 256 MiB: more than any socket buffer
        if (!write(block)) return false;
      return true;
    };
    res.on_stream_end = [&ended](bool ok) { ended.set_value(ok); };
  };
  Served s(o, h);
  Client c(s.port(), /*rcvbuf=*/4096);
  c.Send(Post("/s", ""));
  auto f = ended.get_future();
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready);
  EXPECT_FALSE(f.get());
}

TEST(HttpTransport, StopCutsAWorkerBlockedOnAClient) {
  HttpTransport::Handlers h = Echo();
  std::atomic<bool> in_stream{false};
  h.worker = [&in_stream](HttpRequest&, HttpResponse& res) {
    res.stream = [&in_stream](const BodyWriter& write) {
      in_stream = true;
      const std::string block(1 << 16, 'x');
      for (;;)
        if (!write(block)) return false;
    };
  };
  auto s = std::make_unique<Served>(Opts(), h);
  Client c(s->port(), 4096);
  c.Send(Post("/s", ""));
  while (!in_stream) std::this_thread::sleep_for(10ms);
  const auto t0 = Clock::now();
  s.reset();  // Stop (2 s grace) and join Run
  EXPECT_LT(Clock::now() - t0, 1500ms);
}

TEST(HttpTransport, SerializedHeadersCannotBeSplit) {
  HttpResponse res;
  res.SetHeader("X-Echo", "a\r\nSet-Cookie: evil");
  res.SetContent("b", "text/plain");
  const std::string out = SerializeResponse(res, false);
  EXPECT_NE(out.find("X-Echo: aSet-Cookie: evil\r\n"), std::string::npos) << out;
  EXPECT_NE(out.find("Content-Length: 1\r\n"), std::string::npos);
}

}  // namespace
}  // namespace mr::server
