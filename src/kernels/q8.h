// The engine's weight format Q8/g64: int8 symmetric, one BF16 scale per 64 inputs.
// A matrix has `rows` outputs of `cols` inputs (cols % 64 == 0), stored row-major:
//   q[rows][cols] int8, scales[rows][cols/64] bf16; w[o][i] = q[o][i] * scale[o][i/64].
// Activations for the integer kernels use the same grouping with FP32 scales (QActs).
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"

namespace mr {

constexpr int64_t kQ8Group = 64;

struct QMatrix {
  int64_t rows = 0;  // output features
  int64_t cols = 0;  // input features, multiple of kQ8Group
  std::vector<int8_t> q;         // (rows, cols)
  std::vector<uint16_t> scales;  // (rows, cols / 64) bf16

  int64_t groups() const { return cols / kQ8Group; }
  const int8_t* row_q(int64_t o) const { return q.data() + o * cols; }
  const uint16_t* row_scales(int64_t o) const { return scales.data() + o * groups(); }
  size_t bytes() const { return q.size() + scales.size() * 2; }
};

// Conversion error statistics of one matrix (for debug logging).
struct QuantError {
  double max_abs = 0;  // max |w - deq(q(w))|
  double rms = 0;      // rms of the error
  double rms_w = 0;    // rms of w (to relate the error)
};

// Quantize row-major FP32 weights (rows, cols) to Q8/g64. cols must be a multiple of 64.
// If err is non-null, fills conversion error statistics.
QMatrix QuantizeQ8(const float* w, int64_t rows, int64_t cols, QuantError* err);
// Dequantize one output row into dst[cols].
void DequantizeQ8Row(const QMatrix& m, int64_t o, float* dst);

// Activations quantized per row per 64-group to int8 with FP32 scales. Shape (n_rows, cols).
struct QActs {
  int64_t n_rows = 0;
  int64_t cols = 0;
  std::vector<int8_t> q;       // (n_rows, cols)
  std::vector<float> scales;   // (n_rows, cols / 64)
  std::vector<int32_t> sums;   // unused by symmetric kernels; reserved
  void Resize(int64_t rows, int64_t c);
};

}  // namespace mr
