#include "base/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace mr {
namespace {
// kWarn until the program sets another level (app/ reads MERERUN_LOG).
std::atomic<int> g_level{static_cast<int>(LogLevel::kWarn)};
}  // namespace

LogLevel GetLogLevel() {
  return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed));
}
void SetLogLevel(LogLevel level) {
  g_level.store(static_cast<int>(level));
}

void LogF(LogLevel level, const char* component, const char* fmt, ...) {
  if (GetLogLevel() < level) return;
  static const char* kNames[] = {"E", "W", "I", "D"};
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "%s [%s] %s\n", kNames[static_cast<int>(level)], component, buf);
}

}  // namespace mr
