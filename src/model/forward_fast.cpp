// The fast op set (forward_ops.h): quantized activations, the kernel table's weight formats,
// flash-style attention, RoPE tables.
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "model/forward_ops.h"

namespace mr {
namespace {

class FastOps final : public ForwardOps {
 public:
  FastOps(const ModelConfig& cfg, ThreadPool& pool, const KernelTable& kernels, bool activation_sums)
      : c_(cfg), pool_(pool), k_(kernels), sums_(activation_sums) {
    const int64_t hd = c_.head_dim, half = hd / 2;
    rope_inv_.resize(half);
    rope_inv_swa_.resize(half);
    rope_cs_.resize(hd);
    for (int64_t i = 0; i < half; ++i) {  // same float expression as ref::Rope
      const float e = -2.0f * static_cast<float>(i) / static_cast<float>(hd);
      rope_inv_[i] = std::pow(c_.rope_base, e);
      rope_inv_swa_[i] = std::pow(c_.rope_base_swa, e);
      if (!c_.rope_freq_factors.empty()) {  // Llama 3.x: per-pair factors divide the frequency
        rope_inv_[i] /= c_.rope_freq_factors[i];
        rope_inv_swa_[i] /= c_.rope_freq_factors[i];
      }
    }
  }

  void Embed(const WeightMatrix& table, TokenId tok, float* out) override { DequantizeWeightRow(table, tok, out); }

  // The normed input is quantized once for q, k and v, and the three projections are one parallel
  // op: the threads split the concatenated output tiles of the three matrices.
  void Qkv(const LayerWeights& L, const float* x, int64_t n, float* q, float* k, float* v) override {
    Quantize(x, n, L.wq.cols(), !(L.wq.float_format() && L.wk.float_format() && L.wv.float_format()));
    const int64_t tq = L.wq.tiles(), tk = L.wk.tiles(), tv = L.wv.tiles();
    pool_.ParallelForDynamic(tq + tk + tv, TileChunk(tq + tk + tv), [&](int64_t b, int64_t e, int) {
      auto part = [&](const WeightMatrix& w, int64_t off, float* y) {
        const int64_t lo = std::max(b, off) - off, hi = std::min(e, off + w.tiles()) - off;
        if (hi > lo) MatmulTiles(k_, w, qa_, n, y, w.rows(), lo, hi);
      };
      part(L.wq, 0, q);
      part(L.wk, tq, k);
      part(L.wv, tq + tk, v);
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
  // thus reads the cache 4 times instead of 64. Chunks are small enough that every thread gets
  // work (a verify step of 8 rows on 2 KV heads is 4 jobs), and threads claim jobs as they go.
  void Attention(int64_t layer, bool swa, const ForwardRows& rows, int64_t n, const float* q, float* out) override {
    constexpr int64_t kMaxChunkRows = 16;
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
    const int64_t scratch = AttentionScratchFloats(max_rows, group, hd);
    if (att_.size() < static_cast<size_t>(n_th * scratch)) att_.resize(static_cast<size_t>(n_th * scratch));
    const int64_t jobs = static_cast<int64_t>(chunks_.size()) * c_.n_head_kv;
    pool_.ParallelForDynamic(jobs, 1, [&](int64_t b, int64_t e, int th) {
      float* sc = att_.data() + th * scratch;
      for (int64_t job = b; job < e; ++job) {
        const auto [t0, m] = chunks_[static_cast<size_t>(job / c_.n_head_kv)];
        const int64_t kh = job % c_.n_head_kv;
        const KvCache& kv = *rows.kv[t0];
        const AttnChunk a{q + t0 * q_dim + kh * group * hd,
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
                          c_.attn_softcap};
        k_.attention(a, sc);
      }
    });
  }

  void Matmul(const WeightMatrix& w, const float* x, int64_t n, float* y) override {
    Quantize(x, n, w.cols(), !w.float_format());
    pool_.ParallelForDynamic(w.tiles(), TileChunk(w.tiles()),
                             [&](int64_t b, int64_t e, int) { MatmulTiles(k_, w, qa_, n, y, w.rows(), b, e); });
  }

  // Gate and up projections with the GLU in one pass.
  void Glu(const WeightMatrix& gate, const WeightMatrix& up, const float* x, int64_t n, GluAct act,
           float* out) override {
    Quantize(x, n, gate.cols(), !gate.float_format());
    pool_.ParallelForDynamic(gate.tiles(), TileChunk(gate.tiles()), [&](int64_t b, int64_t e, int) {
      MatmulGluTiles(k_, gate, up, qa_, n, act, out, gate.rows(), b, e);
    });
  }

 private:
  // x (n, cols) -> qa_: int8 per row and kActGroup inputs, plus the activation sums when
  // native K-quant matrices read them; x itself for the F16 / BF16 matrices. int8: false when every
  // matrix of the op is F16 / BF16 (they read x only).
  void Quantize(const float* x, int64_t n, int64_t cols, bool int8) {
    qa_.Resize(n, cols);
    qa_.x = x;
    if (!int8) return;
    const int64_t groups = cols / kActGroup;
    if (n <= 8) {  // decode and verify: cheaper than a hand-off to the workers
      k_.quantize_acts(x, n, cols, qa_.q.data(), qa_.scales.data());
      if (sums_) qa_.ComputeSums(0, n);
      return;
    }
    pool_.ParallelFor(n, [&](int64_t b, int64_t e, int) {
      k_.quantize_acts(x + b * cols, e - b, cols, qa_.q.data() + b * cols, qa_.scales.data() + b * groups);
      if (sums_) qa_.ComputeSums(b, e);
    });
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
  std::vector<float> att_;                                // (threads, AttentionScratchFloats) attention scratch
  std::vector<int64_t> lo_, hi_;                          // (rows) the cache positions a row attends
  std::vector<std::pair<int64_t, int64_t>> chunks_;       // (first row, rows): attention chunks
  std::vector<float> rope_inv_, rope_inv_swa_, rope_cs_;  // per-pair inverse frequencies; cos|sin
};

}  // namespace

std::unique_ptr<ForwardOps> NewFastOps(const ModelConfig& cfg, ThreadPool& pool, const KernelTable& kernels,
                                       bool activation_sums) {
  return std::make_unique<FastOps>(cfg, pool, kernels, activation_sums);
}

}  // namespace mr
