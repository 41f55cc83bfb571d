// Scalar dequantization of ggml blocks. Each Dequant* function below follows the block layout of
// ggml-common.h and the arithmetic (including operation order, so results are bit-identical) of
// the matching dequantize_row_* in ggml-quants.c. Blocks are read byte-wise (memcpy for the
// multi-byte fields) because GGUF tensor data is only guaranteed 1-byte aligned per block.
#include "model/dequant.h"

#include <array>
#include <cstring>
#include <string>

#include "base/half.h"
#include "kernels/kquant.h"

namespace mr {
namespace {

// ggml type ids (ggml.h); kept local so dequant does not depend on the GGUF reader.
constexpr uint32_t kTypeF32 = 0;
constexpr uint32_t kTypeF16 = 1;
constexpr uint32_t kTypeQ4_0 = 2;
constexpr uint32_t kTypeQ4_1 = 3;
constexpr uint32_t kTypeQ5_0 = 6;
constexpr uint32_t kTypeQ5_1 = 7;
constexpr uint32_t kTypeQ8_0 = 8;
constexpr uint32_t kTypeQ4_K = 12;
constexpr uint32_t kTypeQ5_K = 13;
constexpr uint32_t kTypeQ6_K = 14;
constexpr uint32_t kTypeBF16 = 30;
constexpr uint32_t kTypeMXFP4 = 39;

constexpr int64_t kQK = 32;     // elements per block of the legacy quants (QK4_0 ... QK8_0)
constexpr int64_t kQK_K = 256;  // elements per K-quant super-block

// Block sizes in bytes (sizeof(block_*) in ggml-common.h).
constexpr int64_t kQ5_1Bytes = 2 + 2 + 4 + kQK / 2;  // d, m, qh[4], qs[16]

inline uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline float LoadF16(const uint8_t* p) {
  return F16ToF32(LoadU16(p));
}

// All 65536 halves as floats: F16 tensors (embeddings, norms in some files) convert in bulk.
const float* F16Table() {
  static const std::array<float, 65536>* table = [] {
    auto* t = new std::array<float, 65536>;
    for (uint32_t h = 0; h < 65536; ++h) (*t)[h] = F16ToF32(static_cast<uint16_t>(h));
    return t;
  }();
  return table->data();
}

void DequantF16(const uint8_t* x, float* y, int64_t n) {
  const float* table = F16Table();
  for (int64_t i = 0; i < n; ++i) y[i] = table[LoadU16(x + 2 * i)];
}

void DequantBF16(const uint8_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = Bf16ToF32(LoadU16(x + 2 * i));
}

// block_q5_1: as q5_0 without the -16 offset, plus the block minimum m.
void DequantQ5_1(const uint8_t* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQ5_1Bytes, y += kQK) {
    const float d = LoadF16(x);
    const float m = LoadF16(x + 2);
    const uint32_t qh = LoadU32(x + 4);
    const uint8_t* qs = x + 8;
    for (int j = 0; j < 16; ++j) {
      const int h0 = static_cast<int>((qh >> j) & 1u) << 4;
      const int h1 = static_cast<int>((qh >> (j + 16)) & 1u) << 4;
      y[j] = static_cast<float>((qs[j] & 0x0F) | h0) * d + m;
      y[j + 16] = static_cast<float>((qs[j] >> 4) | h1) * d + m;
    }
  }
}

int64_t BlockElems(uint32_t type) {
  switch (type) {
    case kTypeF32:
    case kTypeF16:
    case kTypeBF16:
      return 1;
    case kTypeQ4_0:
    case kTypeQ4_1:
    case kTypeQ5_0:
    case kTypeQ5_1:
    case kTypeQ8_0:
    case kTypeMXFP4:
      return kQK;
    case kTypeQ4_K:
    case kTypeQ5_K:
    case kTypeQ6_K:
      return kQK_K;
    default:
      return 0;
  }
}

}  // namespace

bool CanDequantize(uint32_t type) {
  return BlockElems(type) != 0;
}

Status DequantizeRow(uint32_t type, const void* src, float* dst, int64_t n) {
  const int64_t block = BlockElems(type);
  if (block == 0) {
    return Unsupported("[dequant] unsupported tensor type id " + std::to_string(type));
  }
  if (n < 0 || n % block != 0) {
    return InvalidArgument("[dequant] element count " + std::to_string(n) + " is not a multiple of the block size " +
                           std::to_string(block) + " (type id " + std::to_string(type) + ")");
  }
  if (n == 0) return Status::Ok();
  const auto* x = static_cast<const uint8_t*>(src);
  const int64_t nb = n / block;
  switch (type) {
    case kTypeF32:
      std::memcpy(dst, x, static_cast<size_t>(n) * sizeof(float));
      break;
    case kTypeF16:
      DequantF16(x, dst, n);
      break;
    case kTypeBF16:
      DequantBF16(x, dst, n);
      break;
    case kTypeQ4_0:  // block_q4_0: y = (q - 8)*d (kernels/kquant.cpp)
      DequantizeKBlocks(KFormat::kQ4_0, x, dst, nb);
      break;
    case kTypeQ4_1:  // block_q4_1: y = q*d + m (kernels/kquant.cpp)
      DequantizeKBlocks(KFormat::kQ4_1, x, dst, nb);
      break;
    case kTypeQ5_0:  // block_q5_0: y = (q5 - 16)*d (kernels/kquant.cpp)
      DequantizeKBlocks(KFormat::kQ5_0, x, dst, nb);
      break;
    case kTypeQ5_1:
      DequantQ5_1(x, dst, nb);
      break;
    case kTypeQ8_0:  // block_q8_0: y = q*d (kernels/kquant.cpp)
      DequantizeKBlocks(KFormat::kQ8_0, x, dst, nb);
      break;
    case kTypeQ4_K:  // block_q4_K: 8 sub-blocks of 32, y = d*sc*q - dmin*m (kernels/kquant.cpp)
      DequantizeKBlocks(KFormat::kQ4K, x, dst, nb);
      break;
    case kTypeQ5_K:  // block_q5_K: as Q4_K with a fifth bit per quant from qh (kernels/kquant.cpp)
      DequantizeKBlocks(KFormat::kQ5K, x, dst, nb);
      break;
    case kTypeQ6_K:  // block_q6_K: 16 sub-blocks of 16, y = d*sc*(q - 32) (kernels/kquant.cpp)
      DequantizeKBlocks(KFormat::kQ6K, x, dst, nb);
      break;
    case kTypeMXFP4:  // block_mxfp4: y = kvalues_mxfp4[q] * 2^(e - 128) (kernels/kquant.cpp)
      for (int64_t b = 0; b < nb; ++b) {
        if (x[b * kMXFP4BlockBytes] == 0xFF) {  // NaN in the OCP MX spec; ggml would read 2^127
          return InvalidArgument("[dequant] mxfp4 block " + std::to_string(b) +
                                 ": shared exponent e = 0xff (NaN), expected 0..254");
        }
      }
      DequantizeKBlocks(KFormat::kMXFP4, x, dst, nb);
      break;
    default:
      return Internal("[dequant] unreachable type " + std::to_string(type));
  }
  return Status::Ok();
}

}  // namespace mr
