// The backend seam of the forward pass: the operations whose arithmetic differs between the
// reference path and the fast path. forward.cpp runs the block structure every architecture
// shares (norms, biases, QK-norm, KV writes, residuals) once, over the op set chosen at load:
// - reference (forward_ref.cpp): FP32 activations against the GGUF weights dequantized row by
//   row from their stored type, exact softmax attention per (row, head), ref::Rope. No
//   quantization is involved: the oracle of the fast path and of qualification.
// - fast (forward_fast.cpp): activations quantized once per input and reused by every matrix
//   that reads it, the kernel table's formats (WeightMatrix: native tiles or Q8/g64) with fused
//   GLU, flash-style attention over chunks of rows, RoPE from tables computed at load.
// Weight formats and ISAs live below this seam (kernels/: a WeightMatrix format tag and a
// KernelTable per CPU variant); another backend (a GPU) would be another op set.
//
// Internal to model/: not part of the layer's interface.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/ops.h"
#include "kernels/weight_matrix.h"
#include "model/kv_cache.h"
#include "model/model.h"

namespace mr {

// The rows of one ForwardBatch: row t runs at position pos[t] of cache kv[t] (a sequence's rows
// are consecutive positions of one cache).
struct ForwardRows {
  std::span<KvCache* const> kv;
  std::span<const int64_t> pos;
};

class ForwardOps {
 public:
  virtual ~ForwardOps() = default;
  // out (d_model) = row tok of the embedding table.
  virtual void Embed(const WeightMatrix& table, TokenId tok, float* out) = 0;
  // q, k, v (n rows each) = x (n, d_model) times the layer's q, k and v projections.
  virtual void Qkv(const LayerWeights& L, const float* x, int64_t n, float* q, float* k, float* v) = 0;
  // Rotary embedding of one row's n_heads heads at position pos, with the base of a global or a
  // sliding-window layer.
  virtual void Rope(float* x, int64_t n_heads, int64_t pos, bool swa) = 0;
  // out (n, n_head * head_dim) = causal attention of each row's q heads over its own cache at
  // layer (positions up to the row's own are written), within the sliding window on swa layers.
  // sinks: null, or one logit per query head that joins each softmax's denominator (gpt-oss).
  virtual void Attention(int64_t layer, bool swa, const float* sinks, const ForwardRows& rows, int64_t n,
                         const float* q, float* out) = 0;
  // y (n, w.rows) = x (n, w.cols) · wᵀ.
  virtual void Matmul(const WeightMatrix& w, const float* x, int64_t n, float* y) = 0;
  // y (n, w.rows) = the logits of x (n, w.cols) against the output matrix w: Matmul, and with
  // `top` each row's kTopLogits highest recomputed exactly (model.h kActTop).
  virtual void Logits(const WeightMatrix& w, const float* x, int64_t n, bool top, float* y) {
    (void)top;
    Matmul(w, x, n, y);
  }
  // out (n, gate.rows) = act(x · gateᵀ) * (x · upᵀ).
  virtual void Glu(const WeightMatrix& gate, const WeightMatrix& up, const float* x, int64_t n, GluAct act,
                   float* out) = 0;
};

// The candidates of the exact top logits (FastOps::Logits): of the ids i of y (vocab) with
// y[i] >= max(y) - margin, the k highest by value (the lower id first among equal values), in no
// particular order.
void TopLogitCandidates(const float* y, int64_t vocab, int k, float margin, std::vector<int32_t>* ids);

// activation_sums: the model has native K-quant matrices, whose kernels read per-row sums of
// the quantized activations (QActs::ComputeSums).
std::unique_ptr<ForwardOps> NewFastOps(const ModelConfig& cfg, ThreadPool& pool, const KernelTable& kernels,
                                       bool activation_sums);
// source: the GGUF tensor each WeightMatrix was loaded from (read again, row by row, per call).
std::unique_ptr<ForwardOps> NewRefOps(const ModelConfig& cfg, ThreadPool& pool,
                                      const std::unordered_map<const WeightMatrix*, const gguf::TensorInfo*>& source);

}  // namespace mr
