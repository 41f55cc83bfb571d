// The fast op set (forward_ops.h): quantized activations, the kernel table's weight formats,
// flash-style attention, RoPE tables.
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "kernels/ref/ops_ref.h"
#include "model/forward_ops.h"

namespace mr {

void TopLogitCandidates(const float* y, int64_t vocab, int k, float margin, std::vector<int32_t>* ids) {
  // One pass: a candidate is kept while it could still be among the k best (by value, then
  // lower id); whenever 2k are held, the best k stay and the k-th's value becomes the bar, which
  // later ids (higher, so losing ties) must beat. The margin is applied to the k best at the end:
  // the same set as filtering by the margin first, since whatever the margin keeps beats
  // whatever it drops.
  const auto better = [y](int32_t a, int32_t c) { return y[a] > y[c] || (y[a] == y[c] && a < c); };
  const auto keep_best = [&] {
    std::nth_element(ids->begin(), ids->begin() + k, ids->end(), better);
    ids->resize(static_cast<size_t>(k));
  };
  ids->clear();
  ids->reserve(static_cast<size_t>(2 * k));
  float mx = -INFINITY, bar = -INFINITY;
  bool full = false;  // the bar is the k-th best so far (ties at it lose)
  for (int64_t i = 0; i < vocab; ++i) {
    const float v = y[i];
    mx = v > mx ? v : mx;
    if (v > bar || (v == bar && !full)) {
      ids->push_back(static_cast<int32_t>(i));
      if (ids->size() == static_cast<size_t>(2 * k)) {
        keep_best();
        bar = y[*std::min_element(ids->begin(), ids->end(), [&](int32_t a, int32_t c) { return better(c, a); })];
        full = true;
      }
    }
  }
  if (ids->size() > static_cast<size_t>(k)) keep_best();
  std::erase_if(*ids, [&](int32_t i) { return !(y[i] >= mx - margin); });
}

namespace {

class FastOps final : public ForwardOps {
 public:
  FastOps(const ModelConfig& cfg, ThreadPool& pool, const KernelTable& kernels, bool activation_sums)
      : c_(cfg), pool_(pool), k_(kernels), sums_(activation_sums) {
    pair_full_.reserve(64);  // a decode step's new blocks need no allocation (one per sequence)
    pair_jobs_.reserve(64);
    const int64_t hd = c_.head_dim, half = hd / 2;
    rope_inv_.resize(half);
    rope_inv_swa_.resize(half);
    rope_cs_.resize(hd);
    for (int64_t i = 0; i < half; ++i) {  // same float expression as ref::Rope
      const float e = -2.0f * static_cast<float>(i) / static_cast<float>(hd);
      rope_inv_[i] = std::pow(c_.rope_base, e);
      rope_inv_swa_[i] = std::pow(c_.rope_base_swa, e);
      if (!c_.rope_freq_factors.empty()) {  // Llama 3.x's or rope scaling's per-pair factors
        rope_inv_[i] /= c_.rope_freq_factors[i];
        if (c_.rope_factors_swa) rope_inv_swa_[i] /= c_.rope_freq_factors[i];
      }
    }
  }

  void Embed(const WeightMatrix& table, TokenId tok, float* out) override { DequantizeWeightRow(table, tok, out); }

  // The normed input is quantized once for q, k and v, and the three projections are one parallel
  // op: the threads split the concatenated output tiles of the three matrices.
  void Qkv(const LayerWeights& L, const float* x, int64_t n, float* q, float* k, float* v) override {
    Quantize(x, n, L.wq.cols(), !(L.wq.float_format() && L.wk.float_format() && L.wv.float_format()),
             L.wq.fine_acts || L.wk.fine_acts || L.wv.fine_acts);
    const int64_t tq = L.wq.tiles(), tk = L.wk.tiles(), tv = L.wv.tiles();
    if (qa_.n_rows > n) ReserveFine(n, L.wq.rows() + L.wk.rows() + L.wv.rows());
    float* fq = FineScratch(L.wq, n, 0);
    float* fk = FineScratch(L.wk, n, L.wq.rows());
    float* fv = FineScratch(L.wv, n, L.wq.rows() + L.wk.rows());
    pool_.ParallelForDynamic(tq + tk + tv, TileChunk(tq + tk + tv), [&](int64_t b, int64_t e, int) {
      auto part = [&](const WeightMatrix& w, int64_t off, float* y, float* fine) {
        const int64_t lo = std::max(b, off) - off, hi = std::min(e, off + w.tiles()) - off;
        if (hi > lo) Tiles(w, n, y, fine, lo, hi);
      };
      part(L.wq, 0, q, fq);
      part(L.wk, tq, k, fk);
      part(L.wv, tq + tk, v, fv);
    });
  }

  // Per-pair inverse frequencies computed at load (the same float expression as ref::Rope) and
  // one cos/sin per pair per row, shared by all heads.
  void Rope(float* x, int64_t n_heads, int64_t pos, bool swa) override {
    const int64_t hd = c_.head_dim, half = hd / 2;
    const float* inv = (swa ? rope_inv_swa_ : rope_inv_).data();
    float* cs = rope_cs_.data();
    for (int64_t i = 0; i < half; ++i) {
      const float theta = static_cast<float>(pos) * inv[i];
      cs[i] = std::cos(theta);
      cs[half + i] = std::sin(theta);
    }
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + h * hd;
      for (int64_t i = 0; i < half; ++i) {
        const int64_t a = c_.rope_neox ? i : 2 * i;
        const int64_t b = c_.rope_neox ? i + half : 2 * i + 1;
        const float x0 = v[a], x1 = v[b], cv = cs[i], sv = cs[half + i];
        v[a] = x0 * cv - x1 * sv;
        v[b] = x0 * sv + x1 * cv;
      }
    }
  }

  // The rows of each sequence are cut into chunks of consecutive positions, and one job per
  // (chunk, KV head) runs every row and query head of the chunk against each K/V block once
  // (kernels' attention: flash-style, online softmax, vectorized). A prefill chunk of 64 rows
  // thus reads the cache 2 times instead of 64. Chunks are small enough that every thread gets
  // work (a verify step of 8 rows on 2 KV heads is 4 jobs), and threads claim jobs as they go.
  // 32 rows: on AMX each K/V block's preparation then serves twice the pair tiles (+7 % prefill
  // at 6,000 tokens on Qwen 0.5B against 16 rows; the AVX-512 kernel measured the same either way).
  void Attention(int64_t layer, bool swa, const float* sinks, const ForwardRows& rows, int64_t n, const float* q,
                 float* out) override {
    constexpr int64_t kMaxChunkRows = 32;
    const int64_t hd = c_.head_dim, group = c_.n_head / c_.n_head_kv, q_dim = c_.n_head * hd;
    const int n_th = pool_.size();
    lo_.resize(static_cast<size_t>(n));
    hi_.resize(static_cast<size_t>(n));
    chunks_.clear();
    const int64_t min_chunks = (2 * n_th + c_.n_head_kv - 1) / c_.n_head_kv;
    for (int64_t t0 = 0; t0 < n;) {
      int64_t t1 = t0 + 1;  // a sequence's rows: same cache, consecutive positions
      while (t1 < n && rows.kv[t1] == rows.kv[t0] && rows.pos[t1] == rows.pos[t1 - 1] + 1) ++t1;
      const int64_t m = t1 - t0;
      const int64_t chunks = std::max((m + kMaxChunkRows - 1) / kMaxChunkRows, std::min(m, min_chunks));
      for (int64_t i = 0; i < chunks; ++i) {
        const int64_t b = t0 + m * i / chunks, e = t0 + m * (i + 1) / chunks;
        if (e > b) chunks_.emplace_back(b, e - b);
      }
      t0 = t1;
    }
    int64_t max_rows = 0;
    for (const auto& ch : chunks_) max_rows = std::max(max_rows, ch.second);
    for (int64_t t = 0; t < n; ++t) {
      hi_[t] = rows.pos[t] + 1;
      lo_[t] = swa ? std::max<int64_t>(0, rows.pos[t] - c_.sliding_window + 1) : 0;
    }
    const bool pairs = k_.kv_block_pairs != nullptr && !swa && PairLayoutHeadSize(hd);
    if (pairs) UpdatePairs(layer, rows, n);
    const int64_t scratch = AttentionScratchFloats(max_rows, group, hd);
    if (att_.size() < static_cast<size_t>(n_th * scratch)) att_.resize(static_cast<size_t>(n_th * scratch));
    const int64_t jobs = static_cast<int64_t>(chunks_.size()) * c_.n_head_kv;
    pool_.ParallelForDynamic(jobs, 1, [&](int64_t b, int64_t e, int th) {
      float* sc = att_.data() + th * scratch;
      for (int64_t job = b; job < e; ++job) {
        const auto [t0, m] = chunks_[static_cast<size_t>(job / c_.n_head_kv)];
        const int64_t kh = job % c_.n_head_kv;
        KvCache& kv = *rows.kv[t0];
        AttnChunk a{q + t0 * q_dim + kh * group * hd,
                    q_dim,
                    m,
                    group,
                    hd,
                    kv.k[layer].data() + kh * hd,
                    kv.v[layer].data() + kh * hd,
                    kv.kv_dim,
                    lo_.data() + t0,
                    hi_.data() + t0,
                    c_.attn_scale,
                    out + t0 * q_dim + kh * group * hd,
                    q_dim,
                    c_.attn_softcap,
                    sinks ? sinks + kh * group : nullptr};
        if (pairs) {
          a.kpairs = kv.KPairs(layer, kh, hd);
          a.vpairs = kv.VPairs(layer, kh, hd);
          a.pair_blocks = kv.pair_blocks[static_cast<size_t>(layer)];
        }
        k_.attention(a, sc);
      }
    });
  }

  // Brings each cache's pair-word copies of layer `layer` (KvCache::kp, vp) up to the full blocks
  // the rows read, every row's K and V of this layer being in the cache by now: one job per (new
  // block, KV head). A decode step then reads the blocks it has read before as they lie, where the
  // kernel's own conversion (a transpose of K) cost more than the dot products with the few query
  // heads of one row.
  void UpdatePairs(int64_t layer, const ForwardRows& rows, int64_t n) {
    const auto l = static_cast<size_t>(layer);
    pair_full_.clear();  // per cache: the full blocks its rows read
    for (int64_t t = 0; t < n; ++t) {
      const int64_t full = (rows.pos[t] + 1) / kAttnPairBlock;
      auto it =
          std::find_if(pair_full_.begin(), pair_full_.end(), [&](const auto& p) { return p.first == rows.kv[t]; });
      if (it == pair_full_.end()) {
        pair_full_.emplace_back(rows.kv[t], full);
      } else {
        it->second = std::max(it->second, full);
      }
    }
    pair_jobs_.clear();
    for (const auto& [kv, full] : pair_full_) {
      kv->AllocatePairs();
      for (int64_t b = kv->pair_blocks[l]; b < full; ++b) pair_jobs_.emplace_back(kv, b);
    }
    if (pair_jobs_.empty()) return;
    const int64_t hd = c_.head_dim, heads = c_.n_head_kv;
    const auto run = [&](int64_t b, int64_t e, int) {
      for (int64_t j = b; j < e; ++j) {
        const auto [kv, blk] = pair_jobs_[static_cast<size_t>(j / heads)];
        const int64_t kh = j % heads, kv_dim = kv->kv_dim;
        const int64_t row = blk * kAttnPairBlock * kv_dim + kh * hd, word = blk * 16 * hd;
        k_.kv_block_pairs(kv->k[l].data() + row, kv->v[l].data() + row, kv_dim, hd, kv->KPairs(layer, kh, hd) + word,
                          kv->VPairs(layer, kh, hd) + word);
      }
    };
    const auto jobs = static_cast<int64_t>(pair_jobs_.size()) * heads;
    if (jobs <= heads) {
      run(0, jobs, 0);  // decode: one block every 32 steps, cheaper than a hand-off
    } else {
      pool_.ParallelForDynamic(jobs, 1, run);
    }
    for (const auto& [kv, full] : pair_full_) kv->pair_blocks[l] = std::max(kv->pair_blocks[l], full);
  }

  void Matmul(const WeightMatrix& w, const float* x, int64_t n, float* y) override {
    Quantize(x, n, w.cols(), !w.float_format(), w.fine_acts);
    if (w.fine_acts) ReserveFine(n, w.rows());
    float* fine = FineScratch(w, n, 0);
    pool_.ParallelForDynamic(w.tiles(), TileChunk(w.tiles()),
                             [&](int64_t b, int64_t e, int) { Tiles(w, n, y, fine, b, e); });
  }

  // The int8 logits, then per row the kTopLogits highest recomputed in FP32 against the
  // dequantized weight rows (the reference path's arithmetic): the tokens that carry the
  // probability mass get exact logits for ~kTopLogits * d_model multiply-adds a row, where a
  // second activation row on the whole output matrix (the `logits` role) doubles its largest
  // matmul. Candidates: logits within kTopMargin of the row's maximum (e^-24 of its probability
  // is beyond any sampler's reach), the kTopLogits highest of them.
  void Logits(const WeightMatrix& w, const float* x, int64_t n, bool top, float* y) override {
    Matmul(w, x, n, y);
    if (!top) return;
    constexpr float kTopMargin = 24.0f;
    const int64_t vocab = w.rows(), d = w.cols();
    if (top_w_.size() < static_cast<size_t>(pool_.size() * d)) top_w_.resize(static_cast<size_t>(pool_.size() * d));
    if (top_ids_.size() < static_cast<size_t>(n)) top_ids_.resize(static_cast<size_t>(n));
    // Each row's candidates (rows in parallel when there are several), then every (row, token)
    // recomputation as one parallel op, so a decode step's kTopLogits rows are split between the
    // threads too. Each logit is the same expression whichever thread computes it.
    auto candidates = [&](int64_t b, int64_t e, int) {
      for (int64_t r = b; r < e; ++r)
        TopLogitCandidates(y + r * vocab, vocab, kTopLogits, kTopMargin, &top_ids_[static_cast<size_t>(r)]);
    };
    if (n == 1) {
      candidates(0, 1, 0);
    } else {
      pool_.ParallelFor(n, candidates);
    }
    top_pairs_.clear();
    for (int64_t r = 0; r < n; ++r) {
      for (const int32_t id : top_ids_[static_cast<size_t>(r)]) top_pairs_.emplace_back(static_cast<int32_t>(r), id);
    }
    pool_.ParallelForDynamic(static_cast<int64_t>(top_pairs_.size()), 16, [&](int64_t b, int64_t e, int th) {
      float* wrow = top_w_.data() + th * d;
      for (int64_t i = b; i < e; ++i) {
        const auto [r, id] = top_pairs_[static_cast<size_t>(i)];
        DequantizeWeightRow(w, id, wrow);
        y[r * vocab + id] = ref::Dot8(wrow, x + r * d, d);
      }
    });
  }

  // Gate and up projections with the GLU in one pass. Fine activations: gate and up each over
  // both int8 rows, summed, then the GLU.
  void Glu(const WeightMatrix& gate, const WeightMatrix& up, const float* x, int64_t n, GluAct act,
           float* out) override {
    const bool fine = gate.fine_acts || up.fine_acts;
    Quantize(x, n, gate.cols(), !gate.float_format(), fine);
    if (!fine) {
      pool_.ParallelForDynamic(gate.tiles(), TileChunk(gate.tiles()), [&](int64_t b, int64_t e, int) {
        MatmulGluTiles(k_, gate, up, qa_, n, act, out, gate.rows(), b, e);
      });
      return;
    }
    const int64_t rows = gate.rows();
    ReserveFine(n, 2 * rows);
    float* g = FineScratch(gate, n, 0);
    float* u = FineScratch(up, n, rows);
    pool_.ParallelForDynamic(gate.tiles(), TileChunk(gate.tiles()), [&](int64_t b, int64_t e, int) {
      Tiles(gate, n, g, g, b, e);
      Tiles(up, n, u, u, b, e);
      const auto [o0, o1] = TileOutputs(gate, b, e);
      for (int64_t r = 0; r < n; ++r) k_.glu(g + r * rows + o0, u + r * rows + o0, o1 - o0, act, out + r * rows + o0);
    });
  }

 private:
  // x (n, cols) -> qa_: int8 per row and kActGroup inputs, plus the activation sums when
  // native K-quant matrices read them; x itself for the F16 / BF16 matrices. int8: false when every
  // matrix of the op is F16 / BF16 (they read x only). fine: rows [n, 2n) of qa_ get the int8
  // quantization of what rows [0, n) leave over, x - scale·q (model.h ActRole).
  void Quantize(const float* x, int64_t n, int64_t cols, bool int8, bool fine) {
    qa_.Resize(fine ? 2 * n : n, cols);
    qa_.x = x;
    if (!int8) return;
    const int64_t groups = cols / kActGroup;
    if (fine && res_.size() < static_cast<size_t>(n * cols)) res_.resize(static_cast<size_t>(n * cols));
    auto rows = [&](int64_t b, int64_t e) {
      int8_t* q = qa_.q.data();
      float* s = qa_.scales.data();
      k_.quantize_acts(x + b * cols, e - b, cols, q + b * cols, s + b * groups);
      if (fine) {
        for (int64_t gi = b * groups; gi < e * groups; ++gi) {  // group gi of the rows, kActGroup inputs
          const float* xg = x + gi * kActGroup;
          const int8_t* qg = q + gi * kActGroup;
          float* rg = res_.data() + gi * kActGroup;
          const float sc = s[gi];
          for (int64_t i = 0; i < kActGroup; ++i) rg[i] = xg[i] - sc * static_cast<float>(qg[i]);
        }
        k_.quantize_acts(res_.data() + b * cols, e - b, cols, q + (n + b) * cols, s + (n + b) * groups);
      }
      if (sums_) {
        qa_.ComputeSums(b, e);
        if (fine) qa_.ComputeSums(n + b, n + e);
      }
    };
    if (n <= 8) {  // decode and verify: cheaper than a hand-off to the workers
      rows(0, n);
      return;
    }
    pool_.ParallelFor(n, [&](int64_t b, int64_t e, int) { rows(b, e); });
  }

  // y (n, w.rows) for the outputs of tiles [b, e): the kernel over n rows of qa_, or with fine
  // activations over its 2n rows into `fine` (2n, w.rows) and the two halves summed. y may be
  // `fine` itself (the sums land in its first n rows).
  void Tiles(const WeightMatrix& w, int64_t n, float* y, float* fine, int64_t b, int64_t e) {
    const int64_t rows = w.rows();
    if (!w.fine_acts) {
      MatmulTiles(k_, w, qa_, n, y, rows, b, e);
      return;
    }
    MatmulTiles(k_, w, qa_, 2 * n, fine, rows, b, e);
    const auto [o0, o1] = TileOutputs(w, b, e);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t o = o0; o < o1; ++o) y[r * rows + o] = fine[r * rows + o] + fine[(n + r) * rows + o];
    }
  }

  // The real outputs of tiles [b, e) of w.
  static std::pair<int64_t, int64_t> TileOutputs(const WeightMatrix& w, int64_t b, int64_t e) {
    const int64_t tile = w.native() ? kKTile : kQ8Tile;
    return {b * tile, std::min(e * tile, w.rows())};
  }

  // Room in fine_y_ for fine matrices of `rows` outputs in all over 2n activation rows.
  void ReserveFine(int64_t n, int64_t rows) {
    if (fine_y_.size() < static_cast<size_t>(2 * n * rows)) fine_y_.resize(static_cast<size_t>(2 * n * rows));
  }
  // A fine matrix's (2n, w.rows) outputs at `offset` output rows x 2n into fine_y_ (ReserveFine
  // made room; each matrix of an op gets its own range); nullptr when w is not fine.
  float* FineScratch(const WeightMatrix& w, int64_t n, int64_t offset) {
    return w.fine_acts ? fine_y_.data() + 2 * n * offset : nullptr;
  }

  // Matmul ops hand out their output tiles in chunks that the threads claim as they go (about 8
  // per thread): on a machine where a thread is descheduled or its memory stream is slower for a
  // while, the other takes over its share instead of waiting for it at the end of the op.
  int64_t TileChunk(int64_t tiles) const { return std::max<int64_t>(1, tiles / (8 * pool_.size())); }

  const ModelConfig& c_;
  ThreadPool& pool_;
  const KernelTable& k_;
  const bool sums_;
  QActs qa_;                                              // the quantized input of the current op
  std::vector<float> res_;                                // (n, cols) fine activations: x - scale·q
  std::vector<float> fine_y_;                             // outputs of fine matrices over 2n rows
  std::vector<float> att_;                                // (threads, AttentionScratchFloats) attention scratch
  std::vector<float> top_w_;                              // (threads, d_model) a dequantized output row
  std::vector<std::vector<int32_t>> top_ids_;             // per row: its candidate tokens
  std::vector<std::pair<int32_t, int32_t>> top_pairs_;    // (row, token) logits to recompute
  std::vector<int64_t> lo_, hi_;                          // (rows) the cache positions a row attends
  std::vector<std::pair<int64_t, int64_t>> chunks_;       // (first row, rows): attention chunks
  std::vector<std::pair<KvCache*, int64_t>> pair_full_;   // (cache, full blocks its rows read)
  std::vector<std::pair<KvCache*, int64_t>> pair_jobs_;   // (cache, block): pair copies to make
  std::vector<float> rope_inv_, rope_inv_swa_, rope_cs_;  // per-pair inverse frequencies; cos|sin
};

}  // namespace

std::unique_ptr<ForwardOps> NewFastOps(const ModelConfig& cfg, ThreadPool& pool, const KernelTable& kernels,
                                       bool activation_sums) {
  return std::make_unique<FastOps>(cfg, pool, kernels, activation_sums);
}

}  // namespace mr
