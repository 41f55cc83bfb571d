// Native weight formats: a GGUF file's own Q4_K / Q6_K / Q5_0 / Q4_1 / Q8_0 / Q4_0 / Q5_K / F16 /
// BF16 / MXFP4 words, reordered into tiles of kKTile = 16 output rows so that one 64-byte load holds 4
// quant bytes of each of the 16 rows.
// The repack is a pure permutation of the bytes of the ggml blocks (quants, f16 d/dmin/m, the
// packed 6-bit or int8 scales, Q5_0's high bits and MXFP4's E8M0 exponents stay as stored);
// UnpackK restores the file's bytes exactly.
//
// A matrix has `rows` outputs of `cols` inputs (cols a multiple of the format's block inputs,
// KSuperInputs: 256 for the K-quants, 32 for Q5_0 / Q4_1 / Q8_0 / Q4_0 / MXFP4). Tile t covers outputs
// 16t..16t+15 (the last tile padded with zero rows: d = 0, so they contribute nothing; MXFP4's
// padding has e = 0 and nibbles 0, value 0). Tile t, super-block s
// (one ggml block per row: inputs s*KSuperInputs..) is one block of 16 * (ggml block bytes) at
// (t * supers + s) * KBlockBytes(format). Inside a block, row o (0..15) of the tile:
//
//  Q4_K (ggml block_q4_K: d f16, dmin f16, scales[12], qs[128]; 2304-byte blocks):
//    [0, 32)      d of row o at 2o
//    [32, 64)     dmin of row o at 32 + 2o
//    [64, 256)    scales[j] (the 12 packed bytes of 6-bit scales and mins) at 64 + 16j + o
//    [256, 2304)  qs[b] at 256 + (b/4)*64 + 4o + b%4
//    qs[32k + l] holds input 64k + l in its low nibble and input 64k + 32 + l in its high nibble,
//    so the 64-byte chunk c of activation group k (64 inputs) holds, for the 16 rows, the nibbles
//    of inputs 64k + 4c..+3 (low) and 64k + 32 + 4c..+3 (high): u8 weights for vpdpbusd /
//    vpmaddubsw against 4 broadcast activation bytes, 16 (or 2 x 8) outputs per register.
//  Q5_K (ggml block_q5_K: d f16, dmin f16, scales[12], qh[32], qs[128]; 2816-byte blocks):
//    [0, 256)     d, dmin and scales as Q4_K
//    [256, 768)   qh[b] at 256 + (b/4)*64 + 4o + b%4: chunk c holds qh[4c..4c+3] of the 16 rows,
//                 whose bits 2k and 2k + 1 are the fifth bits of inputs 64k + 4c..+3 and
//                 64k + 32 + 4c..+3
//    [768, 2816)  qs[b] at 768 + (b/4)*64 + 4o + b%4 (chunks as Q4_K)
//  Q6_K (ggml block_q6_K: ql[128], qh[64], scales[16] int8, d f16; 3360-byte blocks):
//    [0, 32)      d of row o at 2o
//    [32, 288)    scales[j] at 32 + 16j + o
//    [288, 3360)  16 groups of 192 bytes, group (n, c) = n*8 + c for half n (0, 1), chunk c (0..7):
//                 ql[64n + 4c + i] at +4o + i, ql[64n + 32 + 4c + i] at +64 + 4o + i,
//                 qh[32n + 4c + i] at +128 + 4o + i (i = 0..3)
//    One group gives the 6-bit quants of inputs 128n + 32m + 4c..+3 for m = 0..3 (ggml's split
//    of ql nibbles and qh bit pairs), 16 rows each.
//  Q5_0 (ggml block_q5_0: d f16, qh[4], qs[16]; 32 inputs; 352-byte blocks):
//    [0, 32)      d of row o at 2o
//    [32, 96)     qh (the 32 fifth bits, a little-endian uint32) at 32 + 4o: one 32-bit lane per row
//    [96, 352)    qs[b] at 96 + (b/4)*64 + 4o + b%4: chunk c holds the low nibbles of inputs
//                 4c..4c+3 and the high nibbles of inputs 16 + 4c..+3 (bits 4c.. and 16 + 4c.. of qh)
//  Q4_1 (ggml block_q4_1: d f16, m f16, qs[16]; 32 inputs; 320-byte blocks):
//    [0, 32)      d of row o at 2o
//    [32, 64)     m of row o at 32 + 2o
//    [64, 320)    qs[b] at 64 + (b/4)*64 + 4o + b%4 (chunks as Q5_0)
//  Q8_0 (ggml block_q8_0: d f16, qs[32] int8; 32 inputs; 544-byte blocks):
//    [0, 32)      d of row o at 2o
//    [32, 544)    qs[b] at 32 + (b/4)*64 + 4o + b%4: chunk c (0..7) holds inputs 4c..4c+3
//  Q4_0 (ggml block_q4_0: d f16, qs[16]; 32 inputs; y = (q - 8) * d; 288-byte blocks):
//    [0, 32)      d of row o at 2o
//    [32, 288)    qs[b] at 32 + (b/4)*64 + 4o + b%4 (chunks as Q5_0)
//  F16 and BF16 (a "block" is 32 consecutive 2-byte values of a row; 1024-byte blocks):
//    value i (0..31) of row o at 32i + 2o: one 32-byte load holds input i of the 16 rows, which
//    the kernels widen to 16 FP32 lanes (vcvtph2ps, or a 16-bit shift for BF16).
//    These float formats are read against the FP32 activations (QActs::x), not the int8 ones:
//    the weights are exact and so are the activations, so the only error is the FP32 summation.
//  MXFP4 (ggml block_mxfp4: e (E8M0 shared exponent), qs[16]; 32 inputs; 272-byte blocks):
//    [0, 16)      e of row o at o
//    [16, 272)    qs[b] at 16 + (b/4)*64 + 4o + b%4 (chunks as Q5_0: low nibbles inputs 4c..+3,
//                 high nibbles 16 + 4c..+3)
//    y = kvalues_mxfp4[nibble] * 2^(e - 128): the nibble is an E2M1 code whose value ggml doubles
//    (0, ±1, ±2, ±3, ±4, ±6, ±8, ±12) and halves the E8M0 scale 2^(e - 127) to make up
//    (ggml_e8m0_to_fp32_half, subnormal for e < 2). e = 0xFF (NaN in the OCP MX spec) is rejected.
#pragma once

#include <bit>
#include <cstdint>
#include <vector>

#include "base/status.h"

namespace mr {

enum class KFormat : uint8_t {
  kQ4K = 0,
  kQ6K = 1,
  kQ5_0 = 2,
  kQ4_1 = 3,
  kQ8_0 = 4,
  kQ4_0 = 5,
  kQ5K = 6,
  kF16 = 7,
  kBF16 = 8,
  kMXFP4 = 9
};
constexpr int kKFormats = 10;
// Every format, in KFormat order (tests and benchmarks iterate over it).
constexpr KFormat kAllKFormats[] = {KFormat::kQ4K,  KFormat::kQ6K, KFormat::kQ5_0, KFormat::kQ4_1, KFormat::kQ8_0,
                                    KFormat::kQ4_0, KFormat::kQ5K, KFormat::kF16,  KFormat::kBF16, KFormat::kMXFP4};
static_assert(sizeof(kAllKFormats) / sizeof(kAllKFormats[0]) == kKFormats);
constexpr int64_t kKTile = 16;            // output rows per tile
constexpr int64_t kKSuper = 256;          // inputs per K-quant super-block (ggml QK_K)
constexpr int64_t kKBlock32 = 32;         // inputs per Q5_0 / Q4_1 / Q8_0 / Q4_0 / MXFP4 block (ggml QK5_0, ...)
constexpr int64_t kQ4KSuperBytes = 144;   // sizeof(block_q4_K)
constexpr int64_t kQ5KSuperBytes = 176;   // sizeof(block_q5_K)
constexpr int64_t kQ6KSuperBytes = 210;   // sizeof(block_q6_K)
constexpr int64_t kQ50BlockBytes = 22;    // sizeof(block_q5_0)
constexpr int64_t kQ41BlockBytes = 20;    // sizeof(block_q4_1)
constexpr int64_t kQ80BlockBytes = 34;    // sizeof(block_q8_0)
constexpr int64_t kQ40BlockBytes = 18;    // sizeof(block_q4_0)
constexpr int64_t kF16BlockBytes = 64;    // 32 F16 or BF16 values
constexpr int64_t kMXFP4BlockBytes = 17;  // sizeof(block_mxfp4)
constexpr int64_t kKMaxSuperBytes = kQ6KSuperBytes;

// Inputs per super-block (one ggml block of one row) of format f.
constexpr int64_t KSuperInputs(KFormat f) {
  return f == KFormat::kQ4K || f == KFormat::kQ6K || f == KFormat::kQ5K ? kKSuper : kKBlock32;
}
constexpr int64_t KSuperBytes(KFormat f) {
  switch (f) {
    case KFormat::kQ4K:
      return kQ4KSuperBytes;
    case KFormat::kQ6K:
      return kQ6KSuperBytes;
    case KFormat::kQ5_0:
      return kQ50BlockBytes;
    case KFormat::kQ4_1:
      return kQ41BlockBytes;
    case KFormat::kQ8_0:
      return kQ80BlockBytes;
    case KFormat::kQ4_0:
      return kQ40BlockBytes;
    case KFormat::kQ5K:
      return kQ5KSuperBytes;
    case KFormat::kF16:
    case KFormat::kBF16:
      return kF16BlockBytes;
    case KFormat::kMXFP4:
      return kMXFP4BlockBytes;
  }
  return 0;
}
// F16 / BF16: values, not quants; their kernels read FP32 activations (QActs::x).
constexpr bool KFormatIsFloat(KFormat f) {
  return f == KFormat::kF16 || f == KFormat::kBF16;
}
constexpr int64_t KBlockBytes(KFormat f) {
  return kKTile * KSuperBytes(f);
}
const char* KFormatName(KFormat f);

// Offset inside a tile block of byte `b` (0 <= b < KSuperBytes) of the ggml block of tile row
// `o` (0 <= o < 16). A bijection between (o, b) and [0, KBlockBytes) (kquant_test checks it).
int64_t KByteOffset(KFormat f, int64_t o, int64_t b);

struct KMatrix {
  KFormat format = KFormat::kQ4K;
  int64_t rows = 0;           // output features
  int64_t cols = 0;           // input features, multiple of KSuperInputs(format)
  std::vector<uint8_t> data;  // (tiles, supers, KBlockBytes) as described above

  int64_t supers() const { return cols / KSuperInputs(format); }
  int64_t tiles() const { return (rows + kKTile - 1) / kKTile; }
  const uint8_t* block(int64_t t, int64_t s) const { return data.data() + (t * supers() + s) * KBlockBytes(format); }
  // Bytes of weights read per use (padding rows excluded): the file's own size of the matrix.
  size_t bytes() const { return static_cast<size_t>(rows * supers() * KSuperBytes(format)); }
};

// An empty matrix (zeroed, padding included) to fill with PackKTiles.
KMatrix NewKMatrix(KFormat f, int64_t rows, int64_t cols);
// Copies the ggml blocks of the rows of tiles [t_begin, t_end) from `src` (row-major, row o at
// src + o * row_bytes, row_bytes = supers * KSuperBytes) into `dst`. Returns an error naming the
// row when a block's d or dmin (a value of an F16 / BF16 row) is NaN or infinite, or an MXFP4
// block's e is 0xFF or one of its values overflows to infinity (e >= 253; nothing after it is
// packed). Threads may fill
// disjoint tile ranges at once.
Status PackKTiles(const uint8_t* src, int64_t t_begin, int64_t t_end, KMatrix* dst);
// The ggml bytes of all real rows, row-major (the inverse permutation of PackKTiles).
std::vector<uint8_t> UnpackK(const KMatrix& m);
// Dequantizes output row o into dst[cols] with ggml's arithmetic (dequantize_row_q4_K, _q6_K,
// _q5_0, _q4_1, _q8_0, _q4_0, _q5_K, _mxfp4; F16 / BF16 widened exactly).
void DequantizeKRow(const KMatrix& m, int64_t o, float* dst);
// nb consecutive ggml blocks in file order -> nb * KSuperInputs(f) floats, bit-identical to
// ggml-quants.c
// (the GGUF reader, model/dequant.cpp, uses these too).
void DequantizeKBlocks(KFormat f, const uint8_t* x, float* y, int64_t nb);

// The inverse for writing files: nb * KSuperInputs(f) floats -> nb ggml blocks of format f, for
// Q4_K, Q6_K, Q8_0, F16 and MXFP4 (false for the others). Plain round-to-nearest per block (Q8_0
// is ggml's quantize_row_q8_0_ref, MXFP4 its quantize_row_mxfp4_ref: e = floor(log2(amax)) + 125,
// each value to the nearest of the 16 codes, the first on a tie, e = 0 below 2^-125; Q4_K / Q6_K
// use each sub-block's range, not ggml's iterative scale search, so they are valid files of
// those types at a little more error). Finite x only.
bool QuantizeKBlocks(KFormat f, const float* x, uint8_t* y, int64_t nb);

// 6-bit scale and min of sub-block j (0..7) from the 12 packed scale bytes of a Q4_K / Q5_K
// block (ggml get_scale_min_k4): sub-blocks 0..3 keep their 6 bits in the low bits of bytes j
// and j+4; sub-blocks 4..7 keep their low 4 bits in the nibbles of byte j+4 and their top 2 bits
// in the top bits of bytes j-4 (scale) and j (min).
inline void KScaleMin(int j, const uint8_t* q, uint8_t* sc, uint8_t* mn) {
  if (j < 4) {
    *sc = q[j] & 63;
    *mn = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4));
    *mn = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// MXFP4: the E2M1 value of nibble q, doubled (ggml kvalues_mxfp4: sign bit 3, then 0, 0.5, 1,
// 1.5, 2, 3, 4, 6 times 2), and the E8M0 exponent e as the matching half scale 2^(e - 128)
// (ggml_e8m0_to_fp32_half's bits: subnormal 2^-128 and 2^-127 for e = 0 and 1).
constexpr int8_t kMXFP4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
constexpr float E8M0Half(uint8_t e) {
  return std::bit_cast<float>(e < 2 ? uint32_t{0x00200000} << e : static_cast<uint32_t>(e - 1) << 23);
}

}  // namespace mr
