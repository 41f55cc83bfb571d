#include "app/http_client.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

namespace mr::app {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

Result<HttpReply> Exchange(http::verb verb, const std::string& host, int port, const std::string& target,
                           const std::string& body, std::chrono::seconds timeout) {
  const auto t0 = Clock::now();
  try {
    net::io_context ioc;
    tcp::resolver resolver(ioc);
    beast::tcp_stream stream(ioc);
    stream.expires_after(timeout);
    stream.connect(resolver.resolve(host, std::to_string(port)));
    http::request<http::string_body> req{verb, target, 11};
    req.set(http::field::host, host + ":" + std::to_string(port));
    if (verb == http::verb::post) {
      req.set(http::field::content_type, "application/json");
      req.body() = body;
      req.prepare_payload();
    }
    http::write(stream, req);
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(std::uint64_t{1} << 30);
    http::read(stream, buffer, parser);
    HttpReply reply;
    reply.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
    const auto& res = parser.get();
    reply.status = static_cast<int>(res.result_int());
    for (const auto& f : res) {
      std::string name(f.name_string());
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      reply.headers[name] = std::string(f.value());
    }
    reply.body = res.body();
    beast::error_code ec;
    stream.socket().shutdown(tcp::socket::shutdown_both, ec);
    return reply;
  } catch (const std::exception& e) {
    return IoError(std::string(http::to_string(verb)) + " http://" + host + ":" + std::to_string(port) + target + ": " +
                   e.what());
  }
}

}  // namespace

Result<HttpReply> HttpPostJson(const std::string& host, int port, const std::string& target, const std::string& body,
                               std::chrono::seconds timeout) {
  return Exchange(http::verb::post, host, port, target, body, timeout);
}

Result<HttpReply> HttpGet(const std::string& host, int port, const std::string& target, std::chrono::seconds timeout) {
  return Exchange(http::verb::get, host, port, target, "", timeout);
}

bool ParseHttpUrl(const std::string& url, std::string* host, int* port) {
  static const std::regex re(R"(^http://([A-Za-z0-9.\-]+|\[[0-9a-fA-F:]+\]):(\d{1,5})/?$)");
  std::smatch m;
  if (!std::regex_match(url, m, re)) return false;
  *host = m[1].str();
  *port = std::atoi(m[2].str().c_str());
  return *port > 0 && *port < 65536;
}

Status ServeProcess::Start(const std::vector<std::string>& args,
                           const std::vector<std::pair<std::string, std::string>>& env, std::chrono::seconds timeout) {
  Stop();
  port_ = 0;
  char tmpl[] = "/tmp/mererun-qualify-serve-XXXXXX";
  const int fd = mkstemp(tmpl);
  if (fd < 0) return IoError("cannot create a log file for the server");
  log_path_ = tmpl;
  std::vector<std::string> argv_s = {"/proc/self/exe", "serve", "--host", "127.0.0.1", "--port", "0"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) {
    close(fd);
    return IoError("cannot find this program's path");
  }
  exe[n] = '\0';
  argv_s[0] = exe;
  const pid_t pid = fork();
  if (pid < 0) {
    close(fd);
    return IoError("fork failed");
  }
  if (pid == 0) {
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(exe, argv.data());
    _exit(127);
  }
  close(fd);
  pid_ = pid;
  static const std::regex listening(R"(listening on http://[^\s:]+:(\d+))");
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    const std::string log = ReadFile(log_path_);
    std::smatch m;
    if (port_ == 0 && std::regex_search(log, m, listening)) port_ = std::atoi(m[1].str().c_str());
    // The port opens before the warm-up ends: ready when /health answers 200.
    if (port_ != 0) {
      auto h = HttpGet("127.0.0.1", port_, "/health", std::chrono::seconds(10));
      if (h.ok() && h->status == 200) return Status::Ok();
    }
    int wstatus = 0;
    if (waitpid(pid_, &wstatus, WNOHANG) == pid_) {
      pid_ = -1;
      return Internal("the server exited before listening:\n" + log.substr(log.size() > 2000 ? log.size() - 2000 : 0));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  Stop();
  return Internal("the server was not ready within " + std::to_string(timeout.count()) + " s (log: " + log_path_ + ")");
}

void ServeProcess::Stop() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  for (int i = 0; i < 300; ++i) {
    if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
      pid_ = -1;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

int64_t ServeProcess::PeakRssBytes() const {
  if (pid_ <= 0) return -1;
  std::ifstream f("/proc/" + std::to_string(pid_) + "/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  return -1;
}

void ServeProcess::ResetPeakRss() const {
  if (pid_ <= 0) return;
  std::ofstream f("/proc/" + std::to_string(pid_) + "/clear_refs");
  f << "5";
}

}  // namespace mr::app
