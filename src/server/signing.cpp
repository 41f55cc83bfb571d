#include "server/signing.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

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

}  // namespace mr::server
