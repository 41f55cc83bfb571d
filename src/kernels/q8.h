// The engine's weight format Q8/g64: int8 symmetric, one BF16 scale per 64 inputs.
// A matrix has `rows` outputs of `cols` inputs (cols % 64 == 0); w[o][i] = q(o, i) * scale(o, i/64).
//
// Two storage orders of the same words:
//  - row-major (QuantizeQ8's output, packed == false):
//      q[o * cols + i], scales[o * groups + g];
//  - tile-interleaved (PackQ8, what the kernels read, packed == true): outputs are grouped in
//    tiles of kQ8Tile = 8 rows (the last tile padded with zero rows). Tile t, group g is one
//    512-byte block at ((t * groups + g) * 512); inside it, 16 chunks of 32 bytes, chunk k
//    holding inputs 4k..4k+3 of the group for rows 0..7 of the tile:
//      q(o, i) at block(o/8, i/64) + ((i%64)/4) * 32 + (o%8) * 4 + i%4
//    and scale(o, g) at scales[(t * groups + g) * 8 + o%8].
//    A 32-byte load then holds 4 inputs for 8 outputs: the kernels multiply it against the
//    same 4 activation bytes broadcast to all lanes and accumulate 8 outputs in the 8 lanes of
//    one register, so no horizontal sums are needed and a tile's weights are read once for all
//    activation rows. Packing is a pure permutation (UnpackQ8 restores the words exactly).
// Activations for the integer kernels: int8 per row per kActGroup inputs, FP32 scales (QActs).
#pragma once

#include <cstdint>
#include <vector>

#include "base/status.h"

namespace mr {

constexpr int64_t kQ8Group = 64;
constexpr int64_t kQ8Tile = 8;
constexpr int64_t kQ8Block = kQ8Group * kQ8Tile;  // bytes of one (tile, group) block
// Activations are quantized in groups of kActGroup inputs (64 or 32; the kernels handle both).
// 32 (two FP32 scales per weight group) lowers the fast path's mean KL to the reference by ~20%
// on SmolLM2 but flips the greedy first token of the "capital of France" check (a 0.11-logit
// tie in the reference path), so 64 stays the default (docs/architecture.md).
#ifndef MERERUN_ACT_GROUP
#define MERERUN_ACT_GROUP 64
#endif
constexpr int64_t kActGroup = MERERUN_ACT_GROUP;
static_assert(kActGroup == 32 || kActGroup == 64, "kernels split a weight group into 1 or 2 activation groups");
constexpr int64_t kActPerWeightGroup = kQ8Group / kActGroup;

struct QMatrix {
  int64_t rows = 0;  // output features
  int64_t cols = 0;  // input features, multiple of kQ8Group
  bool packed = false;
  std::vector<int8_t> q;         // row-major (rows, cols) or packed (tiles, groups, 512)
  std::vector<uint16_t> scales;  // row-major (rows, groups) or packed (tiles, groups, 8); bf16

  int64_t groups() const { return cols / kQ8Group; }
  int64_t tiles() const { return (rows + kQ8Tile - 1) / kQ8Tile; }
  // Index of q(o, i) and scale(o, g) in either order.
  int64_t q_index(int64_t o, int64_t i) const {
    if (!packed) return o * cols + i;
    return ((o / kQ8Tile) * groups() + i / kQ8Group) * kQ8Block + ((i % kQ8Group) / 4) * 32 + (o % kQ8Tile) * 4 + i % 4;
  }
  int64_t scale_index(int64_t o, int64_t g) const {
    if (!packed) return o * groups() + g;
    return ((o / kQ8Tile) * groups() + g) * kQ8Tile + o % kQ8Tile;
  }
  // Packed: the block of tile t, group g, and its 8 scales.
  const int8_t* block(int64_t t, int64_t g) const { return q.data() + (t * groups() + g) * kQ8Block; }
  const uint16_t* block_scales(int64_t t, int64_t g) const { return scales.data() + (t * groups() + g) * kQ8Tile; }
  // Bytes of weights read per use (padding rows excluded).
  size_t bytes() const { return static_cast<size_t>(rows * cols + rows * groups() * 2); }
};

// Conversion error statistics of one matrix (for debug logging).
struct QuantError {
  double max_abs = 0;  // max |w - deq(q(w))|
  double rms = 0;      // rms of the error
  double rms_w = 0;    // rms of w (to relate the error)
};

// Quantize row-major FP32 weights (rows, cols) to Q8/g64, row-major order. cols must be a
// multiple of 64. If err is non-null, fills conversion error statistics.
QMatrix QuantizeQ8(const float* w, int64_t rows, int64_t cols, QuantError* err);
// An empty packed matrix (zeroed, padding included) to fill with PackRowsInto.
QMatrix NewPackedQ8(int64_t rows, int64_t cols);
// Copy the rows of a row-major `part` into packed `dst` at output row r0 (r0 % 8 == 0).
void PackRowsInto(const QMatrix& part, int64_t r0, QMatrix* dst);
// Row-major -> tile-interleaved and back (pure permutations of the int8 words and scales).
QMatrix PackQ8(const QMatrix& m);
QMatrix UnpackQ8(const QMatrix& m);
// Dequantize one output row into dst[cols] (either order).
void DequantizeQ8Row(const QMatrix& m, int64_t o, float* dst);

// Activations quantized per row per kActGroup inputs to int8 with FP32 scales. Shape (n_rows, cols).
struct QActs {
  int64_t n_rows = 0;
  int64_t cols = 0;
  std::vector<int8_t> q;      // (n_rows, cols)
  std::vector<float> scales;  // (n_rows, cols / kActGroup)
  // The FP32 rows (n_rows, cols) these were quantized from, owned by the caller and valid for the
  // op: the F16 / BF16 kernels read them instead of q (kquant.h).
  const float* x = nullptr;
  // For the native K-quant kernels (kquant.h), whose weights carry an offset (Q6_K's -32) or a
  // sub-block minimum (Q4_K): per-row sums of the quantized activations, filled by ComputeSums.
  std::vector<int16_t> sums16;  // (n_rows, cols / 16): sum of q over inputs 16j..16j+15 (|sum| <= 2032)
  std::vector<float> sums32;    // (n_rows, cols / 32): scale * sum of q over inputs 32j..32j+31
  // q again, interleaved for the native kernels' broadcasts: blocks of kInterleaveRows rows,
  // and inside a block the 4 bytes of inputs 4k..4k+3 of each row side by side:
  // qi[(r / 8) * cols * 8 + (i / 4) * 32 + (r % 8) * 4 + i % 4] = q[r * cols + i]. A kernel then
  // reaches every row's word of a 4-input step at a constant offset from one pointer.
  static constexpr int64_t kInterleaveRows = 8;
  // Only filled when n_rows >= kInterleaveMinRows: passes of 1 or 2 rows read q itself (its rows
  // stay in L1 where the interleaved copy would not), so decode skips the copy.
  static constexpr int64_t kInterleaveMinRows = 3;
  std::vector<int8_t> qi;
  // scales and sums32 again for blocks of kBlockRows rows, transposed so that the block's values
  // of one group sit side by side (the AMX kernels read a row's at a constant offset): for row r
  // of block b = r / 16, xs_t[(b * (cols / kActGroup) + g) * 16 + r % 16] and
  // s32_t[(b * (cols / 32) + j) * 16 + r % 16]. Only filled when n_rows >= kBlockRows; the rows
  // past n_rows in the last block hold 0.
  static constexpr int64_t kBlockRows = 16;
  std::vector<float> xs_t, s32_t;
  // Grows the buffers (never shrinks them) for rows x c inputs (c % kActGroup == 0).
  void Resize(int64_t rows, int64_t c);
  // Fills sums16, sums32, (n_rows >= kInterleaveMinRows) qi and (n_rows >= kBlockRows) xs_t and
  // s32_t of rows [r_begin, r_end) from q
  // and scales (threads may fill disjoint row ranges at once).
  void ComputeSums(int64_t r_begin, int64_t r_end);
};

}  // namespace mr
