#include "model/catalog.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace mr::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

bool IsHex64(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// A plain file name: no directories, not "." or "..", not hidden.
bool IsSafeFileName(const std::string& s) {
  return !s.empty() && s.find('/') == std::string::npos && s.find('\\') == std::string::npos && s[0] != '.' &&
         s.find('\0') == std::string::npos;
}

std::mutex g_home_mu;
HomeSettings g_home;  // guarded by g_home_mu

std::string Env(std::string HomeSettings::*field) {
  std::lock_guard<std::mutex> lock(g_home_mu);
  return g_home.*field;
}

// Field readers: the error says which model and field, and what type was found.
class EntryReader {
 public:
  EntryReader(const json& obj, std::string where) : obj_(obj), where_(std::move(where)) {}

  Status Error(const std::string& what) const { return InvalidArgument("[catalog] " + where_ + ": " + what); }
  Result<std::string> String(const char* key, bool required) const {
    auto it = obj_.find(key);
    if (it == obj_.end()) {
      if (required) return Error(std::string("missing field '") + key + "'");
      return std::string();
    }
    if (!it->is_string()) {
      return Error(std::string("field '") + key + "' must be a string (got " + it->type_name() + ")");
    }
    return it->get<std::string>();
  }
  Result<int64_t> Int(const char* key, bool required, int64_t def) const {
    auto it = obj_.find(key);
    if (it == obj_.end()) {
      if (required) return Error(std::string("missing field '") + key + "'");
      return def;
    }
    if (!it->is_number_integer() && !it->is_number_unsigned()) {
      return Error(std::string("field '") + key + "' must be an integer (got " + it->type_name() + ")");
    }
    return it->get<int64_t>();
  }

 private:
  const json& obj_;
  std::string where_;
};

Result<CatalogPart> ParsePart(const json& j, const std::string& where) {
  if (!j.is_object()) {
    return InvalidArgument("[catalog] " + where + ": must be an object (got " + j.type_name() + ")");
  }
  EntryReader r(j, where);
  CatalogPart p;
  MR_ASSIGN_OR_RETURN(p.package, r.String("package", true));
  MR_ASSIGN_OR_RETURN(p.version, r.String("version", true));
  MR_ASSIGN_OR_RETURN(p.member, r.String("member", true));
  MR_ASSIGN_OR_RETURN(p.size_bytes, r.Int("size_bytes", false, -1));
  if (p.package.empty() || p.version.empty() || p.member.empty()) {
    return r.Error("package, version and member must be non-empty");
  }
  if (p.size_bytes < -1) return r.Error("size_bytes must be >= 0");
  return p;
}

Result<CatalogSampling> ParseSampling(const json& j, const std::string& where) {
  CatalogSampling s;
  if (j.is_null()) return s;
  if (!j.is_object()) {
    return InvalidArgument("[catalog] " + where + ": sampling must be an object");
  }
  auto number = [&](const char* key, auto* out) -> Status {
    auto it = j.find(key);
    if (it == j.end()) return Status::Ok();
    if (!it->is_number()) {
      return InvalidArgument("[catalog] " + where + ": sampling." + key + " must be a number");
    }
    *out = it->get<typename std::remove_reference_t<decltype(*out)>::value_type>();
    return Status::Ok();
  };
  MR_RETURN_IF_ERROR(number("temperature", &s.temperature));
  MR_RETURN_IF_ERROR(number("top_p", &s.top_p));
  MR_RETURN_IF_ERROR(number("top_k", &s.top_k));
  MR_RETURN_IF_ERROR(number("repeat_penalty", &s.repeat_penalty));
  return s;
}

Result<CatalogEntry> ParseEntry(const json& j, size_t index, const std::string& origin) {
  std::string where = origin + ": models[" + std::to_string(index) + "]";
  if (!j.is_object()) {
    return InvalidArgument("[catalog] " + where + ": must be an object (got " + j.type_name() + ")");
  }
  CatalogEntry e;
  MR_ASSIGN_OR_RETURN(e.name, EntryReader(j, where).String("name", true));
  if (e.name.empty()) return InvalidArgument("[catalog] " + where + ": name is empty");
  where = origin + ": model '" + e.name + "'";
  EntryReader r(j, where);
  MR_ASSIGN_OR_RETURN(e.description, r.String("description", false));
  MR_ASSIGN_OR_RETURN(e.architecture, r.String("architecture", true));
  MR_ASSIGN_OR_RETURN(e.file, r.String("file", true));
  MR_ASSIGN_OR_RETURN(e.size_bytes, r.Int("size_bytes", true, 0));
  MR_ASSIGN_OR_RETURN(e.sha256, r.String("sha256", true));
  MR_ASSIGN_OR_RETURN(e.status, r.String("status", true));
  MR_ASSIGN_OR_RETURN(e.chat_template, r.String("chat_template", false));

  if (!IsSafeFileName(e.file)) {
    return r.Error("file must be a plain file name (got '" + e.file + "')");
  }
  if (e.size_bytes <= 0) return r.Error("size_bytes must be positive (got " + std::to_string(e.size_bytes) + ")");
  if (!IsHex64(e.sha256)) {
    return r.Error("sha256 must be 64 lower-case hex digits (got " + std::to_string(e.sha256.size()) + " chars: '" +
                   e.sha256 + "')");
  }
  if (auto it = j.find("aliases"); it != j.end()) {
    if (!it->is_array()) return r.Error("aliases must be an array of strings");
    for (const json& a : *it) {
      if (!a.is_string() || a.get<std::string>().empty()) {
        return r.Error("aliases must be an array of non-empty strings");
      }
      e.aliases.push_back(a.get<std::string>());
    }
  }
  auto parts = j.find("parts");
  if (parts == j.end() || !parts->is_array() || parts->empty()) {
    return r.Error("parts must be a non-empty array");
  }
  bool all_sized = true;
  int64_t total = 0;
  for (size_t i = 0; i < parts->size(); ++i) {
    MR_ASSIGN_OR_RETURN(CatalogPart p, ParsePart((*parts)[i], where + ": parts[" + std::to_string(i) + "]"));
    if (p.size_bytes < 0)
      all_sized = false;
    else
      total += p.size_bytes;
    e.parts.push_back(std::move(p));
  }
  if (all_sized && total != e.size_bytes) {
    return r.Error("part sizes add up to " + std::to_string(total) + " bytes, expected size_bytes " +
                   std::to_string(e.size_bytes));
  }
  if (auto it = j.find("sampling"); it != j.end()) {
    MR_ASSIGN_OR_RETURN(e.sampling, ParseSampling(*it, where));
  }
  return e;
}

fs::path ExecutableDir() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  return exe.parent_path();
}

// The source tree this file was compiled from (src/model/catalog.cpp -> its root), when __FILE__
// is absolute, as it is under CMake.
fs::path CompiledSourceRoot() {
  fs::path self(__FILE__);
  if (!self.is_absolute()) return {};
  return self.parent_path().parent_path().parent_path();
}

}  // namespace

bool CatalogEntry::Matches(std::string_view n) const {
  if (n == name) return true;
  for (const std::string& a : aliases) {
    if (n == a) return true;
  }
  return false;
}

const CatalogEntry* Catalog::Find(std::string_view n) const {
  for (const CatalogEntry& e : models) {
    if (e.Matches(n)) return &e;
  }
  return nullptr;
}

std::string Catalog::NameList() const {
  std::string out;
  for (const CatalogEntry& e : models) {
    if (!out.empty()) out += ", ";
    out += e.name;
  }
  return out;
}

Result<Catalog> ParseCatalog(std::string_view json_text, const std::string& origin) {
  json root;
  try {
    root = json::parse(json_text, nullptr, /*allow_exceptions=*/true, /*ignore_comments=*/true);
  } catch (const json::exception& ex) {
    return InvalidArgument("[catalog] " + origin + ": invalid JSON: " + ex.what());
  }
  if (!root.is_object()) return InvalidArgument("[catalog] " + origin + ": top level must be an object");
  auto models = root.find("models");
  if (models == root.end() || !models->is_array()) {
    return InvalidArgument("[catalog] " + origin + ": missing array 'models'");
  }
  Catalog cat;
  std::set<std::string> names, files;
  for (size_t i = 0; i < models->size(); ++i) {
    MR_ASSIGN_OR_RETURN(CatalogEntry e, ParseEntry((*models)[i], i, origin));
    std::vector<std::string> all = e.aliases;
    all.push_back(e.name);
    for (const std::string& n : all) {
      if (!names.insert(n).second) {
        return InvalidArgument("[catalog] " + origin + ": model '" + e.name + "': name '" + n + "' is used twice");
      }
    }
    if (!files.insert(e.file).second) {
      return InvalidArgument("[catalog] " + origin + ": model '" + e.name + "': file '" + e.file + "' is used twice");
    }
    cat.models.push_back(std::move(e));
  }
  return cat;
}

Result<Catalog> LoadCatalog(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("[catalog] cannot open '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return IoError("[catalog] read error in '" + path + "'");
  MR_ASSIGN_OR_RETURN(Catalog cat, ParseCatalog(ss.str(), path));
  cat.path = path;
  return cat;
}

void SetHomeSettings(HomeSettings s) {
  std::lock_guard<std::mutex> lock(g_home_mu);
  g_home = std::move(s);
}

Result<std::string> FindCatalogPath() {
  std::error_code ec;
  if (std::string env = Env(&HomeSettings::catalog); !env.empty()) {
    if (fs::is_regular_file(env, ec)) return env;
    return NotFound("[catalog] MERERUN_CATALOG='" + env + "' is not a file");
  }
  std::vector<fs::path> tried;
  if (fs::path dir = ExecutableDir(); !dir.empty()) {
    tried.push_back(dir / ".." / ".." / "models" / "catalog.json");
  }
  if (fs::path root = CompiledSourceRoot(); !root.empty()) {
    tried.push_back(root / "models" / "catalog.json");
  }
  std::string list;
  for (const fs::path& p : tried) {
    if (fs::is_regular_file(p, ec)) return fs::weakly_canonical(p, ec).string();
    list += (list.empty() ? "" : ", ") + p.string();
  }
  return NotFound("[catalog] models/catalog.json not found (tried " + list + "); set MERERUN_CATALOG to its path");
}

Result<Catalog> LoadDefaultCatalog() {
  MR_ASSIGN_OR_RETURN(std::string path, FindCatalogPath());
  return LoadCatalog(path);
}

std::string MererunHome() {
  if (std::string home = Env(&HomeSettings::mererun_home); !home.empty()) return home;
  fs::path cache;
  if (std::string xdg = Env(&HomeSettings::xdg_cache_home); !xdg.empty()) {
    cache = xdg;
  } else if (std::string h = Env(&HomeSettings::home); !h.empty()) {
    cache = fs::path(h) / ".cache";
  } else {
    cache = fs::path("/tmp");
  }
  return (cache / "mererun").string();
}

std::string ModelCacheDir() {
  return (fs::path(MererunHome()) / "models").string();
}

std::string CachedModelPath(const CatalogEntry& entry) {
  return (fs::path(ModelCacheDir()) / entry.file).string();
}

bool IsCachedBySize(const CatalogEntry& entry) {
  std::error_code ec;
  const std::string path = CachedModelPath(entry);
  if (!fs::is_regular_file(path, ec)) return false;
  auto size = fs::file_size(path, ec);
  return !ec && static_cast<int64_t>(size) == entry.size_bytes;
}

}  // namespace mr::model
