#include "app/bench_env.h"

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "base/sha256.h"
#include "model/catalog.h"

namespace fs = std::filesystem;

namespace mr::app {

std::string RepoRoot() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path root = exe.parent_path().parent_path().parent_path();
    if (fs::is_directory(root / "tools" / "llamacpp", ec)) return fs::weakly_canonical(root, ec).string();
  }
  const fs::path self(__FILE__);  // <root>/src/app/bench_env.cpp
  if (self.is_absolute()) {
    const fs::path root = self.parent_path().parent_path().parent_path();
    if (fs::is_directory(root / "tools" / "llamacpp", ec)) return root.string();
  }
  return "";
}

nlohmann::json GitInfo() {
  nlohmann::json j = {{"commit", nullptr}, {"dirty", false}};
  const std::string root = RepoRoot();
  if (root.empty()) return j;
  auto head = RunCapture("git -C " + ShellQuote(root) + " rev-parse HEAD 2>/dev/null");
  if (!head.ok()) return j;
  std::string sha = *head;
  while (!sha.empty() && (sha.back() == '\n' || sha.back() == ' ')) sha.pop_back();
  j["commit"] = sha;
  auto status = RunCapture("git -C " + ShellQuote(root) + " status --porcelain --untracked-files=no 2>/dev/null");
  j["dirty"] = status.ok() && !status->empty();
  return j;
}

nlohmann::json CpuInfo() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model, flags;
  while (std::getline(in, line)) {
    auto value = [&]() {
      const size_t c = line.find(':');
      return c == std::string::npos ? std::string() : line.substr(c + (c + 1 < line.size() ? 2 : 1));
    };
    if (model.empty() && line.rfind("model name", 0) == 0) model = value();
    if (flags.empty() && line.rfind("flags", 0) == 0) flags = value();
  }
  std::vector<std::string> simd;
  std::istringstream fl(flags);
  for (std::string f; fl >> f;) {
    if (f == "sse4_2" || f == "avx" || f == "avx2" || f == "fma" || f == "f16c" || f == "bmi2" ||
        f.rfind("avx512", 0) == 0 || f == "avx_vnni" || f == "amx_int8") {
      simd.push_back(f);
    }
  }
  int64_t mem_kb = 0;
  std::ifstream mi("/proc/meminfo");
  while (std::getline(mi, line)) {
    if (line.rfind("MemTotal:", 0) == 0) {
      mem_kb = std::atoll(line.c_str() + 9);
      break;
    }
  }
  return {{"model", model},
          {"flags", simd},
          {"logical_cpus", std::thread::hardware_concurrency()},
          {"mem_total_bytes", mem_kb * 1024}};
}

std::string UtcNow() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

Result<std::string> RunCapture(const std::string& command) {
  std::FILE* p = popen(command.c_str(), "r");
  if (!p) return Internal("[bench] cannot start: " + command);
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int rc = pclose(p);
  if (rc != 0) {
    const int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    return Internal("[bench] command failed (exit " + std::to_string(code) + "): " + command);
  }
  return out;
}

Result<std::string> ModelFileSha256(const std::string& path) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) return NotFound("[bench] model file not found: " + path);
  if (auto cat = model::LoadDefaultCatalog(); cat.ok()) {
    for (const model::CatalogEntry& e : cat->models) {
      if (fs::equivalent(model::CachedModelPath(e), path, ec) && static_cast<int64_t>(size) == e.size_bytes) {
        return e.sha256;
      }
    }
  }
  return Sha256File(path);
}

}  // namespace mr::app
