// Dequantization of GGUF tensor blocks to FP32, exact to the ggml block definitions
// (ggml-common.h / ggml-quants.c): F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K,
// MXFP4.
#pragma once

#include <cstdint>

#include "base/status.h"

namespace mr {

// Dequantize `n` consecutive elements of a tensor of ggml type `type` starting at `src`
// (which must point at a block boundary) into dst[0..n). `n` must be a multiple of the
// type's block size. Returns an error for unsupported types, a bad n, or an MXFP4 block whose
// shared exponent is 0xFF (NaN).
Status DequantizeRow(uint32_t type, const void* src, float* dst, int64_t n);

// True when DequantizeRow supports the type.
bool CanDequantize(uint32_t type);

}  // namespace mr
