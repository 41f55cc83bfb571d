#include "base/hash.h"

#include <cstring>

namespace mr {

namespace {
constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kP3 = 0x165667B19E3779F9ULL;

uint64_t Rotl(uint64_t x, int r) {
  return (x << r) | (x >> (64 - r));
}
uint64_t Load64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;  // little-endian hosts only (x86-64), as the files are
}
uint64_t Round(uint64_t acc, uint64_t v) {
  return Rotl(acc + v * kP2, 31) * kP1;
}
uint64_t Avalanche(uint64_t h) {
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  return h ^ (h >> 32);
}
}  // namespace

uint64_t Hash64(const void* data, size_t n, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t a = seed + kP1 + kP2, b = seed + kP2, c = seed, d = seed - kP1;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a = Round(a, Load64(p + i));
    b = Round(b, Load64(p + i + 8));
    c = Round(c, Load64(p + i + 16));
    d = Round(d, Load64(p + i + 24));
  }
  uint64_t h = Rotl(a, 1) + Rotl(b, 7) + Rotl(c, 12) + Rotl(d, 18) + static_cast<uint64_t>(n);
  for (; i + 8 <= n; i += 8) h = Rotl(h ^ Round(0, Load64(p + i)), 27) * kP1 + kP3;
  for (; i < n; ++i) h = Rotl(h ^ (p[i] * kP3), 11) * kP1;
  return Avalanche(h);
}

}  // namespace mr
