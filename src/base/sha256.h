// SHA-256 over bytes and files (OpenSSL EVP). Used to verify downloaded model files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "base/status.h"

namespace mr {

// Incremental hasher. Not thread-safe; one instance per stream. Update() after Final() is a
// programming error (checked).
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(const void* data, size_t n_bytes);
  void Update(std::string_view bytes) { Update(bytes.data(), bytes.size()); }
  // Lower-case hex digest (64 chars). Call once.
  std::string FinalHex();

 private:
  void* ctx_;  // EVP_MD_CTX*
  bool finished_ = false;
};

// Lower-case hex SHA-256 of `bytes`.
std::string Sha256Hex(std::string_view bytes);

// Lower-case hex SHA-256 of the whole file at `path`, read in 4 MiB blocks. `progress`, when set,
// is called with the bytes hashed so far after each block. Fails with kIo if the file cannot be
// opened or read.
Result<std::string> Sha256File(const std::string& path, const std::function<void(uint64_t)>& progress = nullptr);

}  // namespace mr
