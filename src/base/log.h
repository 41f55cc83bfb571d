// Minimal leveled logging to stderr. Level: warn unless SetLogLevel (app/ maps MERERUN_LOG =
// error|warn|info|debug onto it at start-up).
#pragma once

#include <cstdarg>

namespace mr {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

LogLevel GetLogLevel();
void SetLogLevel(LogLevel level);
void LogF(LogLevel level, const char* component, const char* fmt, ...) __attribute__((format(printf, 3, 4)));

}  // namespace mr

#define MR_LOG_ENABLED(lvl) (::mr::GetLogLevel() >= ::mr::LogLevel::lvl)
#define MR_LOGE(comp, ...) ::mr::LogF(::mr::LogLevel::kError, comp, __VA_ARGS__)
#define MR_LOGW(comp, ...) ::mr::LogF(::mr::LogLevel::kWarn, comp, __VA_ARGS__)
#define MR_LOGI(comp, ...)                                                           \
  do {                                                                               \
    if (MR_LOG_ENABLED(kInfo)) ::mr::LogF(::mr::LogLevel::kInfo, comp, __VA_ARGS__); \
  } while (0)
#define MR_LOGD(comp, ...)                                                             \
  do {                                                                                 \
    if (MR_LOG_ENABLED(kDebug)) ::mr::LogF(::mr::LogLevel::kDebug, comp, __VA_ARGS__); \
  } while (0)
