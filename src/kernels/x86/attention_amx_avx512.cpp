// Attention on AMX-BF16 tiles (KernelTable::attention of the amx variant, ops.h), for head sizes
// that are a multiple of 32 (up to 256); others, or a process without the tile state, run the
// AVX-512 kernel.
//
// The (row, head) pairs of the chunk are taken 16 at a time (a pair tile: 16 rows of an AMX
// tile); blocks of 32 cache positions aligned to multiples of 32 are visited once for all of them:
//   - K of the block becomes B tiles (dim pairs x 16 positions, the VNNI layout: the AVX-512
//     kernel's 16 x 16 transposes of BF16 pair words) and V becomes B tiles (position pairs x 16
//     dims, rows 2k and 2k+1 interleaved), once per block;
//   - per pair tile, TDPBF16PS gives the 16 x 32 scores from the query rounded to BF16 (once per
//     call); the online softmax runs per pair on the stored scores (the AVX-512 kernel's
//     arithmetic, 32 positions a row); the probabilities, rounded to BF16, are the A tile of
//     TDPBF16PS into the pairs' FP32 output rows, which are loaded as the C tile, accumulated and
//     stored back (rows whose running max moved are rescaled first).
// A tile element depends only on its own row's inputs, and every pair runs the same steps on the
// same blocks (a block where a pair has no position adds exact zeros and rescales by exactly 1),
// so a row's result does not depend on the rows that share its call. The rounding beyond the FP32
// kernel's is the query's and the probabilities' (relative 2^-9 each; products of two BF16 values
// are exact in FP32); the softmax divides by the sum of the rounded probabilities. kernels_test
// checks the result against that arithmetic done exactly.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/x86/kernels_x86.h"
#include "kernels/x86/vec_math512.h"

#define MR_AMX_BF16_TARGET __attribute__((target("amx-tile,amx-bf16,avx512bf16")))

namespace {

constexpr int64_t kBlock = 32;  // cache positions per block
static_assert(kBlock == 32, "BlockMask32");
constexpr int64_t kPairs = 16;       // (row, head) pairs per tile
constexpr int64_t kTileWords = 256;  // one tile: 16 rows x 64 bytes

// Palette 1, every tile 16 rows x 64 bytes: tmm0/1 scores of positions 0-15 / 16-31 (FP32),
// tmm2 query (32 dims, BF16), tmm3 K (16 dim pairs x 16 positions), tmm4 probabilities (32
// positions, BF16), tmm5 V (16 position pairs x 16 dims), tmm6/7 output rows (16 dims, FP32).
struct alignas(64) AmxAttnConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

// The block's K as B tiles: tile (c, h) (kb + (2c + h) * kTileWords) holds dims 32c..32c+31 of
// positions 16h..16h+15, row i the pair (32c + 2i, 32c + 2i + 1) of each position. V as B tiles:
// tile e (vb + e * kTileWords) holds dims 16e..16e+15, row k the pairs (V[2k][d], V[2k+1][d]).
// Positions outside [j0, j1) are zero (never read from memory).
MR_AMX_BF16_TARGET void LoadBlock(const mr::AttnChunk& a, int64_t b0, int64_t j0, int64_t j1, uint32_t* kb,
                                  uint32_t* vb) {
  const int64_t hd = a.hd;
  const uint16_t* kp = a.k + b0 * a.kv_stride;
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t i0 = 0; i0 < hd; i0 += 32) {
      __m512i r[16];
      LoadKPairs16(kp + 16 * h * a.kv_stride, a.kv_stride, i0, j0 - 16 * h, j1 - 16 * h, r);
      uint32_t* tile = kb + (2 * (i0 / 32) + h) * kTileWords;
#pragma GCC unroll 16
      for (int64_t i = 0; i < 16; ++i) _mm512_store_si512(tile + 16 * i, r[i]);
    }
  }
  // Word 2k of lo = x0[k], 2k + 1 = x1[k]; hi the same for k + 16 (index bit 5 picks x1).
  alignas(64) static constexpr uint16_t kLo[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                                   8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static constexpr uint16_t kHi[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                                   24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i lo_idx = _mm512_load_si512(kLo), hi_idx = _mm512_load_si512(kHi);
  const uint16_t* vp = a.v + b0 * a.kv_stride;
  for (int64_t k = 0; k < kBlock / 2; ++k) {
    const int64_t j = 2 * k;
    const bool in0 = j >= j0 && j < j1, in1 = j + 1 >= j0 && j + 1 < j1;
    const uint16_t* v0 = vp + j * a.kv_stride;
    const uint16_t* v1 = v0 + a.kv_stride;
    for (int64_t d = 0; d < hd; d += 32) {
      const __m512i x0 = in0 ? _mm512_loadu_si512(v0 + d) : _mm512_setzero_si512();
      const __m512i x1 = in1 ? _mm512_loadu_si512(v1 + d) : _mm512_setzero_si512();
      _mm512_store_si512(vb + (d / 16) * kTileWords + 16 * k, _mm512_permutex2var_epi16(x0, lo_idx, x1));
      _mm512_store_si512(vb + (d / 16 + 1) * kTileWords + 16 * k, _mm512_permutex2var_epi16(x0, hi_idx, x1));
    }
  }
}

// Per-pair state: the running max and sum, and the pair's valid positions.
struct PairState {
  float* m;
  float* l;
  const int64_t* lo;  // per pair: the row's first and last + 1 position
  const int64_t* hi;
};

// GCC's tileloadd asm does not say it reads memory: the vector stores of the buffers it loads
// (query, probabilities, outputs) must not move past it.
inline void MemoryBarrier() {
  __asm__ volatile("" ::: "memory");
}

// Issues the scores of the pair tile at p0 against the block into tmm0 (positions 0-15) and
// tmm1 (16-31); StoreScores writes them out. Apart, so that the tile unit computes a tile's
// scores while the vector units run the previous tile's softmax.
MR_AMX_BF16_TARGET void IssueScores(int64_t hd, int64_t p0, const uint16_t* qb, const uint32_t* kb) {
  _tile_zero(0);
  _tile_zero(1);
  for (int64_t c = 0; c < hd / 32; ++c) {
    _tile_loadd(2, qb + p0 * hd + 32 * c, hd * 2);
    _tile_loadd(3, kb + 2 * c * kTileWords, 64);
    _tile_dpbf16ps(0, 2, 3);
    _tile_loadd(3, kb + (2 * c + 1) * kTileWords, 64);
    _tile_dpbf16ps(1, 2, 3);
  }
}

MR_AMX_BF16_TARGET void StoreScores(float* sbuf) {
  _tile_stored(0, sbuf, 128);
  _tile_stored(1, sbuf + 16, 128);
}

// Online softmax of the pairs p0..p0+np-1 (np <= 16) on their stored scores: probabilities to
// pbuf (BF16, 16 rows of 32), outputs rescaled where the max moved.
MR_AMX_BF16_TARGET void Softmax(const mr::AttnChunk& a, int64_t b0, int64_t p0, int64_t np, float* ob,
                                const PairState& st, const float* sbuf, uint16_t* pbuf) {
  const int64_t hd = a.hd;
  const __m512 scale = _mm512_set1_ps(a.scale);
  for (int64_t i = 0; i < np; ++i) {
    const int64_t p = p0 + i;
    const int64_t lo = st.lo[p] - b0, hi = st.hi[p] - b0;
    uint16_t* prow = pbuf + 32 * i;
    if (lo >= kBlock || hi <= 0) {  // no position here: zero probabilities, nothing to rescale
      _mm512_store_si512(prow, _mm512_setzero_si512());
      continue;
    }
    const uint32_t valid = BlockMask32(lo, hi);
    const __mmask16 v0 = static_cast<__mmask16>(valid), v1 = static_cast<__mmask16>(valid >> 16);
    __m512 s0 = _mm512_mul_ps(_mm512_load_ps(sbuf + 32 * i), scale);
    __m512 s1 = _mm512_mul_ps(_mm512_load_ps(sbuf + 32 * i + 16), scale);
    if (a.softcap > 0) {
      s0 = SoftCap16(s0, a.softcap);
      s1 = SoftCap16(s1, a.softcap);
    }
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    s0 = _mm512_mask_blend_ps(v0, ninf, s0);
    s1 = _mm512_mask_blend_ps(v1, ninf, s1);
    const float m_old = st.m[p];
    const float bm = std::max(m_old, _mm512_reduce_max_ps(_mm512_max_ps(s0, s1)));
    const float corr = bm == m_old ? 1.0f : std::exp(m_old - bm);  // exp(-inf) = 0 on the first block
    st.m[p] = bm;
    const __m512 bmv = _mm512_set1_ps(bm);
    const __m512 e0 = _mm512_maskz_mov_ps(v0, Exp16(_mm512_sub_ps(s0, bmv)));
    const __m512 e1 = _mm512_maskz_mov_ps(v1, Exp16(_mm512_sub_ps(s1, bmv)));
    const __m512bh pb = _mm512_cvtne2ps_pbh(e1, e0);  // positions 0-15 low, 16-31 high: in order
    __m512i pw;
    std::memcpy(&pw, &pb, sizeof(pw));
    _mm512_store_si512(prow, pw);
    const __m512 r0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(pw)), 16));
    const __m512 r1 =
        _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(pw, 1)), 16));
    st.l[p] = st.l[p] * corr + _mm512_reduce_add_ps(_mm512_add_ps(r0, r1));
    if (corr != 1.0f) {
      const __m512 cv = _mm512_set1_ps(corr);
      float* o = ob + p * hd;
      for (int64_t d = 0; d < hd; d += 16) _mm512_store_ps(o + d, _mm512_mul_ps(_mm512_load_ps(o + d), cv));
    }
  }
  for (int64_t i = np; i < kPairs; ++i) _mm512_store_si512(pbuf + 32 * i, _mm512_setzero_si512());
}

// The pair tile's output rows += probabilities x V, 16 dims a tile, two tiles in flight.
MR_AMX_BF16_TARGET void AccumulateV(int64_t hd, int64_t p0, float* ob, const uint32_t* vb, const uint16_t* pbuf) {
  MemoryBarrier();
  _tile_loadd(4, pbuf, 64);
  float* o = ob + p0 * hd;
  for (int64_t e = 0; e < hd / 16; e += 2) {
    _tile_loadd(6, o + 16 * e, hd * 4);
    _tile_loadd(5, vb + e * kTileWords, 64);
    _tile_dpbf16ps(6, 4, 5);
    _tile_loadd(7, o + 16 * (e + 1), hd * 4);
    _tile_loadd(5, vb + (e + 1) * kTileWords, 64);
    _tile_dpbf16ps(7, 4, 5);
    _tile_stored(6, o + 16 * e, hd * 4);
    _tile_stored(7, o + 16 * (e + 1), hd * 4);
  }
}

MR_AMX_BF16_TARGET void AttentionAmx(const mr::AttnChunk& a, float* scratch) {
  const int64_t hd = a.hd, n_q = a.n_q, n_rows = a.n_rows, np = n_rows * n_q;
  const int64_t padded = (np + kPairs - 1) / kPairs * kPairs;
  // Scratch: K and V tiles of the block, scores and probabilities of a pair tile, then per pair
  // (padded to whole tiles) the BF16 query, FP32 output, running max and sum, positions.
  auto* kb = reinterpret_cast<uint32_t*>(mr::AlignAttentionScratch(scratch));
  uint32_t* vb = kb + hd / 32 * 2 * kTileWords;
  float* sbuf = reinterpret_cast<float*>(vb + hd / 16 * kTileWords);
  auto* pbuf = reinterpret_cast<uint16_t*>(sbuf + kPairs * kBlock);
  auto* qb = reinterpret_cast<uint16_t*>(mr::AlignAttentionScratch(reinterpret_cast<float*>(pbuf + kPairs * kBlock)));
  float* ob = mr::AlignAttentionScratch(reinterpret_cast<float*>(qb + padded * hd));
  float* m = ob + padded * hd;
  float* l = m + padded;
  auto* plo = reinterpret_cast<int64_t*>(l + padded);
  int64_t* phi = plo + padded;
  int64_t jmin = a.lo[0], jmax = a.hi[0];
  for (int64_t r = 0; r < n_rows; ++r) {
    jmin = std::min(jmin, a.lo[r]);
    jmax = std::max(jmax, a.hi[r]);
  }
  for (int64_t p = 0; p < padded; ++p) {
    uint16_t* qr = qb + p * hd;
    float* orow = ob + p * hd;
    m[p] = -INFINITY;
    l[p] = 0;
    const bool real = p < np;
    const int64_t r = p / n_q, h = p % n_q;
    plo[p] = real ? a.lo[r] : 0;
    phi[p] = real ? a.hi[r] : 0;
    for (int64_t d = 0; d < hd; d += 32) {
      __m512i w = _mm512_setzero_si512();
      if (real) {
        const float* q = a.q + r * a.q_stride + h * hd + d;
        const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(q + 16), _mm512_loadu_ps(q));
        std::memcpy(&w, &b, sizeof(w));
      }
      _mm512_storeu_si512(qr + d, w);
      _mm512_store_ps(orow + d, _mm512_setzero_ps());
      _mm512_store_ps(orow + d + 16, _mm512_setzero_ps());
    }
  }
  static const AmxAttnConfig kConfig;
  _tile_loadconfig(&kConfig);
  const PairState st{m, l, plo, phi};
  for (int64_t b0 = jmin / kBlock * kBlock; b0 < jmax; b0 += kBlock) {
    const int64_t j0 = std::max(b0, jmin) - b0, j1 = std::min(b0 + kBlock, jmax) - b0;
    LoadBlock(a, b0, j0, j1, kb, vb);
    MemoryBarrier();
    // The pair tiles that read the block (the others would add exact zeros), pipelined: the
    // next tile's scores are issued before this tile's softmax.
    auto next_tile = [&](int64_t from) {  // the first pair tile at or after from that reads the block
      for (int64_t p0 = from; p0 < np; p0 += kPairs) {
        for (int64_t i = p0; i < std::min(np, p0 + kPairs); ++i) {
          if (plo[i] < b0 + kBlock && phi[i] > b0) return p0;
        }
      }
      return np;
    };
    int64_t cur = next_tile(0);
    if (cur == np) continue;
    IssueScores(hd, cur, qb, kb);
    StoreScores(sbuf);
    while (cur < np) {
      const int64_t nxt = next_tile(cur + kPairs);
      if (nxt < np) IssueScores(hd, nxt, qb, kb);
      Softmax(a, b0, cur, std::min(kPairs, np - cur), ob, st, sbuf, pbuf);
      AccumulateV(hd, cur, ob, vb, pbuf);
      if (nxt < np) StoreScores(sbuf);
      cur = nxt;
    }
  }
  _tile_release();
  for (int64_t p = 0; p < np; ++p) {
    const int64_t r = p / n_q, h = p % n_q;
    float* out = a.out + r * a.out_stride + h * hd;
    const __m512 inv = _mm512_set1_ps(l[p] > 0 ? 1.0f / l[p] : 0.0f);
    for (int64_t d = 0; d < hd; d += 16) _mm512_storeu_ps(out + d, _mm512_mul_ps(_mm512_load_ps(ob + p * hd + d), inv));
  }
}

}  // namespace

namespace mr::x86 {

void AttentionGqaAmx(const AttnChunk& a, float* scratch) {
  if (a.hd % 32 != 0 || a.hd > 256 || !AmxPermitted()) return AttentionGqaAvx512(a, scratch);
  AttentionAmx(a, scratch);
}

}  // namespace mr::x86
