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

#include "kernels/x86/attention_pairs512.h"
#include "kernels/x86/kernels_x86.h"

#define MR_AMX_BF16_TARGET __attribute__((target("amx-tile,amx-bf16,avx512bf16")))

namespace {

constexpr int64_t kBlock = 32;  // cache positions per block
static_assert(kBlock == 32, "BlockMask32");
constexpr int64_t kPairs = 16;                // (row, head) pairs per tile
constexpr int64_t kTileWords = kKvTileWords;  // one tile: 16 rows x 64 bytes

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
  for (int64_t i = 0; i < np; ++i) {
    const int64_t p = p0 + i;
    const int64_t lo = st.lo[p] - b0, hi = st.hi[p] - b0;
    uint16_t* prow = pbuf + 32 * i;
    if (lo >= kBlock || hi <= 0) {  // no position here: zero probabilities, nothing to rescale
      _mm512_store_si512(prow, _mm512_setzero_si512());
      continue;
    }
    const uint32_t valid = BlockMask32(lo, hi);
    __m512 e0, e1;
    const float corr =
        BlockSoftmax(_mm512_load_ps(sbuf + 32 * i), _mm512_load_ps(sbuf + 32 * i + 16), static_cast<__mmask16>(valid),
                     static_cast<__mmask16>(valid >> 16), a.scale, a.softcap, st.m + p, &e0, &e1);
    st.l[p] = st.l[p] * corr + StoreProbsBf16(e0, e1, prow);
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
    const bool real = p < np;
    const int64_t r = p / n_q, h = p % n_q;
    m[p] = real && a.sinks ? a.sinks[h] : -INFINITY;  // a sink: a first position of value zero
    l[p] = real && a.sinks ? 1.0f : 0.0f;
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
    LoadKvBlockPairs(a, b0, j0, j1, kb, vb);
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
