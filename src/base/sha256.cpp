#include "base/sha256.h"

#include <openssl/evp.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

namespace mr {

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  MR_CHECK(ctx_ != nullptr);
  MR_CHECK(EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr) == 1);
}

Sha256::~Sha256() {
  EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_));
}

void Sha256::Update(const void* data, size_t n_bytes) {
  MR_CHECK(!finished_);
  if (n_bytes == 0) return;
  MR_CHECK(EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, n_bytes) == 1);
}

std::string Sha256::FinalHex() {
  MR_CHECK(!finished_);
  finished_ = true;
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  MR_CHECK(EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), digest, &len) == 1);
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(len * 2);
  for (unsigned int i = 0; i < len; ++i) {
    out.push_back(kHex[digest[i] >> 4]);
    out.push_back(kHex[digest[i] & 15]);
  }
  return out;
}

std::string Sha256Hex(std::string_view bytes) {
  Sha256 h;
  h.Update(bytes);
  return h.FinalHex();
}

Result<std::string> Sha256File(const std::string& path, const std::function<void(uint64_t)>& progress) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return IoError("[sha256] cannot open '" + path + "': " + std::strerror(errno));
  }
  Sha256 h;
  std::vector<char> buf(4 << 20);
  uint64_t done = 0;
  for (;;) {
    size_t n = std::fread(buf.data(), 1, buf.size(), f);
    if (n > 0) {
      h.Update(buf.data(), n);
      done += n;
      if (progress) progress(done);
    }
    if (n < buf.size()) break;
  }
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return IoError("[sha256] read error in '" + path + "'");
  return h.FinalHex();
}

}  // namespace mr
