// A fast non-cryptographic 64-bit hash of bytes, for checksums of files this program wrote
// itself (detecting torn or corrupted writes), not for anything an adversary chooses to collide.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mr {

// Four independent multiply-rotate lanes over 32-byte strides, then a tail and a final mix:
// several GB/s on one core. `seed` chains calls: Hash64(b, nb, Hash64(a, na)).
uint64_t Hash64(const void* data, size_t n_bytes, uint64_t seed = 0);

}  // namespace mr
