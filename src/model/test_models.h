// Test helper: locate a real model file. Checks, in order, $MERERUN_HOME/models/NAME,
// ${XDG_CACHE_HOME:-$HOME/.cache}/mererun/models/NAME and /tmp/dl/models/NAME (development
// copies). Returns "" when none exists, so tests can GTEST_SKIP.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <string>

#include "base/status.h"
#include "model/model.h"

namespace mr {

inline std::string FindModelFile(const std::string& file_name) {
  namespace fs = std::filesystem;
  auto exists = [](const fs::path& p) {
    std::error_code ec;
    return fs::is_regular_file(p, ec);
  };
  if (const char* home = std::getenv("MERERUN_HOME"); home != nullptr && *home != '\0') {
    fs::path p = fs::path(home) / "models" / file_name;
    if (exists(p)) return p.string();
  }
  fs::path cache;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    cache = xdg;
  } else if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0') {
    cache = fs::path(h) / ".cache";
  }
  if (!cache.empty()) {
    fs::path p = cache / "mererun" / "models" / file_name;
    if (exists(p)) return p.string();
  }
  fs::path dev = fs::path("/tmp/dl/models") / file_name;
  if (exists(dev)) return dev.string();
  return "";
}

// First of several accepted names that exists (e.g. a catalog name and a development alias).
inline std::string FindModelFileAny(std::initializer_list<const char*> names) {
  for (const char* n : names) {
    std::string p = FindModelFile(n);
    if (!p.empty()) return p;
  }
  return "";
}

// The smallest catalog model, which most real-model unit tests use.
inline constexpr const char* kSmolLM2File = "SmolLM2-135M-Instruct.Q4_1.gguf";

// Loads a pulled model file on the fast path with n_threads. A null pointer (not an error) when
// the file is not pulled, so the caller can GTEST_SKIP; a file that fails to load is an error.
inline Result<std::unique_ptr<Model>> LoadPulledModel(const std::string& file_name, int n_threads = 2) {
  const std::string path = FindModelFile(file_name);
  if (path.empty()) return std::unique_ptr<Model>();
  LoadOptions opts;
  opts.n_threads = n_threads;
  return Model::Load(path, opts);
}

}  // namespace mr
