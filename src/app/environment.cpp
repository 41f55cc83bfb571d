#include "app/environment.h"

#include <charconv>
#include <cstdlib>

#include "app/spec_config.h"
#include "base/log.h"
#include "base/thread_pool.h"
#include "kernels/ops.h"
#include "model/catalog.h"
#include "model/model.h"

namespace mr::app {
namespace {

std::string Get(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : std::string();
}

Status Bad(const char* name, const std::string& value, const std::string& allowed) {
  return InvalidArgument(std::string(name) + "='" + value + "' is not valid; allowed: " + allowed);
}

constexpr const char* kControls[] = {"MERERUN_THREADS", "MERERUN_CPU",   "MERERUN_WEIGHTS",     "MERERUN_ACTS",
                                     "MERERUN_PATH",    "MERERUN_DRAFT", "MERERUN_DRAFT_TOKENS"};

}  // namespace

Status ApplyEnvironment() {
  if (std::string v = Get("MERERUN_LOG"); !v.empty()) {
    if (v == "error")
      SetLogLevel(LogLevel::kError);
    else if (v == "warn")
      SetLogLevel(LogLevel::kWarn);
    else if (v == "info")
      SetLogLevel(LogLevel::kInfo);
    else if (v == "debug")
      SetLogLevel(LogLevel::kDebug);
    else
      return Bad("MERERUN_LOG", v, "error, warn, info, debug");
  }
  if (std::string v = Get("MERERUN_THREADS"); !v.empty()) {
    int n = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (ec != std::errc() || end != v.data() + v.size() || n < 1 || n > 1024)
      return Bad("MERERUN_THREADS", v, "an integer from 1 to 1024");
    ThreadPool::SetDefaultThreads(n);
  }
  if (std::string v = Get("MERERUN_CPU"); !v.empty()) {
    CpuVariant c;
    if (!ParseCpuVariant(v, &c)) return Bad("MERERUN_CPU", v, CpuVariantNames());
    RequestCpuVariant(c);
  }
  if (std::string v = Get("MERERUN_WEIGHTS"); !v.empty()) {
    WeightMode w;
    if (!ParseWeightMode(v, &w)) return Bad("MERERUN_WEIGHTS", v, "native, q8g64");
    SetDefaultWeightMode(w);
  }
  if (std::string v = Get("MERERUN_ACTS"); !v.empty()) {
    uint8_t roles = 0;
    if (!ParseFineActs(v, &roles))
      return Bad("MERERUN_ACTS", v, "int8, fine, or a '+' list of qkv, o, glu, down, logits");
    SetDefaultFineActs(roles);
  }
  if (std::string v = Get("MERERUN_PATH"); !v.empty()) {
    if (v != "ref" && v != "fast") return Bad("MERERUN_PATH", v, "fast, ref");
    SetDefaultReferencePath(v == "ref");
  }
  // The drafting variables are applied by the commands that speculate; checked here for all.
  DecodeConfig probe;
  MR_RETURN_IF_ERROR(ApplyDraftEnvironment(&probe));
  model::SetHomeSettings({Get("MERERUN_HOME"), Get("XDG_CACHE_HOME"), Get("HOME"), Get("MERERUN_CATALOG")});
  return Status::Ok();
}

std::string PythonExecutable() {
  const std::string p = Get("MERERUN_PYTHON");
  return p.empty() ? "python3" : p;
}

std::map<std::string, std::string> ControlEnvironment() {
  std::map<std::string, std::string> out;
  for (const char* name : kControls)
    if (const char* v = std::getenv(name)) out[name] = v;
  return out;
}

}  // namespace mr::app
