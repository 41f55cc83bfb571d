#include "base/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace mr {
namespace {
LogLevel InitialLevel() {
  const char* env = std::getenv("MERERUN_LOG");
  if (!env) return LogLevel::kWarn;
  if (!std::strcmp(env, "error")) return LogLevel::kError;
  if (!std::strcmp(env, "info")) return LogLevel::kInfo;
  if (!std::strcmp(env, "debug")) return LogLevel::kDebug;
  return LogLevel::kWarn;
}
std::atomic<int> g_level{static_cast<int>(InitialLevel())};
}  // namespace

LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed)); }
void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }

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
