// A minimal blocking HTTP/1.1 client (Boost.Beast) and a `mererun serve` child process, for
// commands that measure a server over HTTP (`qualify speed --http`).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "base/status.h"

namespace mr::app {

struct HttpReply {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
  double wall_s = 0.0;  // connect to the end of the body
};

// POSTs `body` (application/json) to http://host:port/target; an error when the connection or
// the exchange fails or `timeout` passes.
Result<HttpReply> HttpPostJson(const std::string& host, int port, const std::string& target, const std::string& body,
                               std::chrono::seconds timeout = std::chrono::seconds(3600));
Result<HttpReply> HttpGet(const std::string& host, int port, const std::string& target,
                          std::chrono::seconds timeout = std::chrono::seconds(60));

// Splits "http://host:port" (no path); false when it is not of that form.
bool ParseHttpUrl(const std::string& url, std::string* host, int* port);

// `mererun serve` started from this same binary with extra arguments and environment, on a
// free loopback port; stopped (SIGTERM, then SIGKILL) by Stop or the destructor.
class ServeProcess {
 public:
  ServeProcess() = default;
  ~ServeProcess() { Stop(); }
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;

  // Waits until the server listens (up to `timeout`); the error carries the end of its log.
  Status Start(const std::vector<std::string>& args, const std::vector<std::pair<std::string, std::string>>& env,
               std::chrono::seconds timeout = std::chrono::seconds(600));
  void Stop();
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }
  // Peak resident set since the last ResetPeakRss (VmHWM), in bytes; -1 when unknown.
  int64_t PeakRssBytes() const;
  void ResetPeakRss() const;

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::string log_path_;
};

}  // namespace mr::app
