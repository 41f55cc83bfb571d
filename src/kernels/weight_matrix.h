// The weight-matrix abstraction of the fast path: one matrix in the format its kernels read,
// with the format tag deciding the kernel. Q8/g64 (q8.h) is the converted format, for every
// GGUF type; Q4_K, Q5_K, Q6_K, Q5_0, Q4_1, Q8_0, Q4_0, F16, BF16 and MXFP4 (kquant.h) keep the
// file's own words, only reordered into tiles.
// A new format adds a tag, a member and a case here (and its kernels in KernelTable); callers
// (the model's forward pass) only see tiles, bytes and these entry points.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/kquant.h"
#include "kernels/ops.h"
#include "kernels/q8.h"

namespace mr {

// Native formats are 1 + their KFormat.
enum class WeightFormat : uint8_t {
  kQ8G64 = 0,
  kQ4K = 1,
  kQ6K = 2,
  kQ5_0 = 3,
  kQ4_1 = 4,
  kQ8_0 = 5,
  kQ4_0 = 6,
  kQ5K = 7,
  kF16 = 8,
  kBF16 = 9,
  kMXFP4 = 10
};
const char* WeightFormatName(WeightFormat f);
constexpr WeightFormat NativeWeightFormat(KFormat f) {
  return static_cast<WeightFormat>(1 + static_cast<int>(f));
}
constexpr KFormat KFormatOf(WeightFormat f) {  // f native
  return static_cast<KFormat>(static_cast<int>(f) - 1);
}

struct WeightMatrix {
  WeightFormat format = WeightFormat::kQ8G64;
  QMatrix q8;  // format kQ8G64 (packed)
  KMatrix k;   // native formats
  // The fast path reads this matrix's input as two int8 rows (model.h ActRole; not for F16 / BF16).
  bool fine_acts = false;

  bool native() const { return format != WeightFormat::kQ8G64; }
  // F16 / BF16: the kernels read the FP32 activations, not the int8 ones.
  bool float_format() const { return native() && KFormatIsFloat(k.format); }
  int64_t rows() const { return native() ? k.rows : q8.rows; }
  int64_t cols() const { return native() ? k.cols : q8.cols; }
  // Units of kernel work (8 outputs for Q8/g64, 16 for the K-quants): threads split an op by tiles.
  int64_t tiles() const { return native() ? k.tiles() : q8.tiles(); }
  size_t bytes() const { return native() ? k.bytes() : q8.bytes(); }  // weight bytes read per use
};

// y[r * ldy + o] = sum_i w[o][i] * xdeq[r][i] for rows r < n_rows and the outputs of tiles
// [t_begin, t_end), by the format's kernel. x: quantized activations (QActs::ComputeSums done
// when w is native; QActs::x set when w is F16 or BF16).
void MatmulTiles(const KernelTable& kt, const WeightMatrix& w, const QActs& x, int64_t n_rows, float* y, int64_t ldy,
                 int64_t t_begin, int64_t t_end);
// y[r * ldy + o] = act(gate·x) * (up·x). gate and up must have the same format and shape.
void MatmulGluTiles(const KernelTable& kt, const WeightMatrix& gate, const WeightMatrix& up, const QActs& x,
                    int64_t n_rows, GluAct act, float* y, int64_t ldy, int64_t t_begin, int64_t t_end);
// Output row o dequantized into dst[cols] (embedding lookup).
void DequantizeWeightRow(const WeightMatrix& w, int64_t o, float* dst);

}  // namespace mr
