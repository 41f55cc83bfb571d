// The reference op set (forward_ops.h): FP32 activations against the GGUF tensors dequantized
// row by row from their stored type (exact to the block definitions), exact softmax attention,
// ref::Rope per head. No quantization is involved, so it is the oracle of the fast path.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/half.h"
#include "base/log.h"
#include "kernels/ref/ops_ref.h"
#include "model/dequant.h"
#include "model/forward_ops.h"
#include "model/gguf.h"

namespace mr {
namespace {

class RefOps final : public ForwardOps {
 public:
  RefOps(const ModelConfig& cfg, ThreadPool& pool,
         const std::unordered_map<const WeightMatrix*, const gguf::TensorInfo*>& source)
      : c_(cfg), pool_(pool), source_(source) {}

  void Embed(const WeightMatrix& table, TokenId tok, float* out) override {
    const gguf::TensorInfo& e = *source_.at(&table);
    MR_CHECK(DequantizeRow(e.type, e.data + tok * e.row_bytes(), out, e.cols()).ok());
  }

  void Qkv(const LayerWeights& L, const float* x, int64_t n, float* q, float* k, float* v) override {
    Matmul(L.wq, x, n, q);
    Matmul(L.wk, x, n, k);
    Matmul(L.wv, x, n, v);
  }

  void Rope(float* x, int64_t n_heads, int64_t pos, bool swa) override {
    const float base = swa ? c_.rope_base_swa : c_.rope_base;
    const float* factors =
        c_.rope_freq_factors.empty() || (swa && !c_.rope_factors_swa) ? nullptr : c_.rope_freq_factors.data();
    for (int64_t h = 0; h < n_heads; ++h) ref::Rope(x + h * c_.head_dim, c_.head_dim, pos, base, c_.rope_neox, factors);
  }

  // Exact softmax per (row, head), scalar.
  void Attention(int64_t layer, bool swa, const float* sinks, const ForwardRows& rows, int64_t n, const float* q,
                 float* out) override {
    const int64_t hd = c_.head_dim, group = c_.n_head / c_.n_head_kv, q_dim = c_.n_head * hd;
    int64_t n_ctx = 0;  // scores: up to n_ctx positions and a sink
    for (int64_t t = 0; t < n; ++t) n_ctx = std::max(n_ctx, rows.kv[t]->n_ctx + 1);
    if (att_.size() < static_cast<size_t>(pool_.size() * (n_ctx + hd)))
      att_.resize(static_cast<size_t>(pool_.size() * (n_ctx + hd)));
    pool_.ParallelFor(n * c_.n_head, [&](int64_t b, int64_t e, int th) {
      float* scores = att_.data() + th * (n_ctx + hd);
      float* acc = scores + n_ctx;
      for (int64_t job = b; job < e; ++job) {
        const int64_t t = job / c_.n_head, h = job % c_.n_head, kh = h / group;
        const KvCache& kv = *rows.kv[t];
        const uint16_t* K = kv.k[layer].data();
        const uint16_t* V = kv.v[layer].data();
        const int64_t p = rows.pos[t];
        const int64_t lo = swa ? std::max<int64_t>(0, p - c_.sliding_window + 1) : 0;
        const float* qv = q + t * q_dim + h * hd;
        for (int64_t j = lo; j <= p; ++j) {
          const uint16_t* kr = K + j * kv.kv_dim + kh * hd;
          float s = 0;
          for (int64_t i = 0; i < hd; ++i) s += qv[i] * Bf16ToF32(kr[i]);
          s *= c_.attn_scale;
          scores[j - lo] = c_.attn_softcap > 0 ? c_.attn_softcap * std::tanh(s / c_.attn_softcap) : s;
        }
        // A sink joins the softmax as one more score, of a position whose value is zero.
        const int64_t n_scores = p - lo + 1;
        if (sinks != nullptr) scores[n_scores] = sinks[h];
        ref::Softmax(scores, n_scores + (sinks != nullptr ? 1 : 0));
        std::fill(acc, acc + hd, 0.0f);
        for (int64_t j = lo; j <= p; ++j) {
          const uint16_t* vr = V + j * kv.kv_dim + kh * hd;
          const float wj = scores[j - lo];
          for (int64_t i = 0; i < hd; ++i) acc[i] += wj * Bf16ToF32(vr[i]);
        }
        std::memcpy(out + t * q_dim + h * hd, acc, hd * sizeof(float));
      }
    });
  }

  // Each weight row is dequantized from the tensor's stored type and dotted with the FP32
  // activations in FP32, in 8 interleaved partial sums (so the compiler vectorizes the loop)
  // added pairwise at the end. kBlockRows weight rows are dequantized at a time so that each
  // activation row meets them four per call (Dot8x4: Dot8's result for each, with four times the
  // independent additions in flight; Dot8 alone is latency-bound on its two accumulator chains).
  // The blocking alone measured no faster; the four-wide calls took a 1,850-position --ref pass
  // of the generated SmolLM3 file from 93.5 s to 65.6 s.
  void Matmul(const WeightMatrix& w, const float* x, int64_t n, float* y) override {
    constexpr int64_t kBlockRows = 16;
    const gguf::TensorInfo& t = *source_.at(&w);
    const int64_t cols = t.cols(), rows = t.rows();
    const size_t row_bytes = t.row_bytes();
    if (const auto need = static_cast<size_t>(pool_.size() * kBlockRows * cols); rows_.size() < need)
      rows_.resize(need);
    pool_.ParallelFor(rows, [&](int64_t b, int64_t e, int th) {
      float* block = rows_.data() + th * kBlockRows * cols;
      for (int64_t o0 = b; o0 < e; o0 += kBlockRows) {
        const int64_t nb = std::min(kBlockRows, e - o0);
        for (int64_t j = 0; j < nb; ++j)
          MR_CHECK(DequantizeRow(t.type, t.data + (o0 + j) * row_bytes, block + j * cols, cols).ok());
        for (int64_t r = 0; r < n; ++r) {
          const float* xr = x + r * cols;
          float* yr = y + r * rows + o0;
          int64_t j = 0;
          for (; j + 4 <= nb; j += 4) {
            const float* const a[4] = {block + j * cols, block + (j + 1) * cols, block + (j + 2) * cols,
                                       block + (j + 3) * cols};
            ref::Dot8x4(a, xr, cols, yr + j);
          }
          for (; j < nb; ++j) yr[j] = ref::Dot8(block + j * cols, xr, cols);
        }
      }
    });
  }

  void Glu(const WeightMatrix& gate, const WeightMatrix& up, const float* x, int64_t n, GluAct act,
           float* out) override {
    const int64_t ff = gate.rows();
    up_.resize(static_cast<size_t>(n * ff));
    Matmul(gate, x, n, out);
    Matmul(up, x, n, up_.data());
    for (int64_t i = 0; i < n * ff; ++i) {
      const float g = out[i];
      out[i] = (act == GluAct::kSilu ? ref::Silu(g) : ref::GeluTanh(g)) * up_[i];
    }
  }

 private:
  const ModelConfig& c_;
  ThreadPool& pool_;
  const std::unordered_map<const WeightMatrix*, const gguf::TensorInfo*>& source_;
  std::vector<float> att_;   // (threads, n_ctx + 1 + head_dim) scores (and a sink) and an output accumulator
  std::vector<float> rows_;  // (threads, 16, cols) dequantized weight rows
  std::vector<float> up_;    // (n, d_ff) the up projection
};

}  // namespace

std::unique_ptr<ForwardOps> NewRefOps(const ModelConfig& cfg, ThreadPool& pool,
                                      const std::unordered_map<const WeightMatrix*, const gguf::TensorInfo*>& source) {
  return std::make_unique<RefOps>(cfg, pool, source);
}

}  // namespace mr
