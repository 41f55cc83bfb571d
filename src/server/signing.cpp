#include "server/signing.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>

namespace mr::server {

std::string SignThinking(const std::string& key, const std::string& model_id, const std::string& text) {
  const std::string msg = model_id + "\n" + text;
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(msg.data()),
       msg.size(), mac, &mac_len);
  unsigned char b64[4 * ((EVP_MAX_MD_SIZE + 2) / 3) + 1];
  const int n = EVP_EncodeBlock(b64, mac, static_cast<int>(mac_len));
  return std::string(reinterpret_cast<const char*>(b64), static_cast<size_t>(n));
}

bool VerifyThinking(const std::string& key, const std::string& model_id, const std::string& text,
                    const std::string& signature) {
  const std::string want = SignThinking(key, model_id, text);
  return signature.size() == want.size() && CRYPTO_memcmp(signature.data(), want.data(), want.size()) == 0;
}

std::string RandomSigningKey() {
  unsigned char raw[32];
  if (RAND_bytes(raw, sizeof(raw)) != 1) {  // not expected; never fall back to a fixed key
    std::random_device rd;
    for (unsigned char& c : raw) c = static_cast<unsigned char>(rd());
  }
  static const char kHex[] = "0123456789abcdef";
  std::string s;
  for (unsigned char c : raw) {
    s.push_back(kHex[c >> 4]);
    s.push_back(kHex[c & 15]);
  }
  return s;
}

namespace {

bool IsHexKey(const std::string& s) {
  return s.size() == 64 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

Result<std::string> ReadKeyFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return IoError("[signing] cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  std::string key(65, '\0');
  ssize_t n = -1;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) n = read(fd, key.data(), key.size());
  close(fd);
  if (!S_ISREG(st.st_mode) || (st.st_mode & 077) != 0)
    return InvalidArgument("[signing] " + path + " must be a regular file readable only by its owner (chmod 600)");
  if (n >= 0) key.resize(static_cast<size_t>(n));
  while (!key.empty() && (key.back() == '\n' || key.back() == '\r')) key.pop_back();
  if (!IsHexKey(key))
    return InvalidArgument("[signing] " + path + " does not hold a key of 64 hex digits; remove it to make a new one");
  return key;
}

}  // namespace

Result<std::string> LoadOrCreateSigningKey(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (access(path.c_str(), F_OK) == 0) return ReadKeyFile(path);
  // Written whole to a private temporary file, then linked into place: link() fails if another
  // server got there first, and nobody ever reads a half-written key.
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return IoError("[signing] cannot create " + tmp + ": " + std::strerror(errno));
  const std::string key = RandomSigningKey();
  const std::string line = key + "\n";
  const bool ok = fchmod(fd, 0600) == 0 && write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()) &&
                  fsync(fd) == 0;
  close(fd);
  const bool linked = ok && link(tmp.c_str(), path.c_str()) == 0;
  const int link_errno = errno;
  unlink(tmp.c_str());
  if (linked) return key;
  if (ok && link_errno == EEXIST) return ReadKeyFile(path);
  return IoError("[signing] cannot write " + path);
}

}  // namespace mr::server
