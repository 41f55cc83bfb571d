// The forward pass: the block structure every architecture shares, run over the op set chosen
// at load (forward_ops.h: reference or fast). Architecture differences are configuration
// (ModelConfig: biases, QK-norm, post-norms, activation, embedding scale, sliding windows) read by
// the arch_*.cpp files; nothing here depends on the path.
#include <algorithm>
#include <cmath>

#include "base/half.h"
#include "kernels/ref/ops_ref.h"
#include "model/forward_ops.h"
#include "model/model.h"

namespace mr {

namespace {

// gpt-oss's expert activation (llama.cpp's swiglu_oai with alpha 1.702 and limit 7): the gate
// clamped above, the up projection clamped both ways and shifted by one.
float SwigluOai(float g, float u) {
  constexpr float kAlpha = 1.702f, kLimit = 7.0f;
  const float x = std::min(g, kLimit);
  const float y = std::clamp(u, -kLimit, kLimit);
  return x / (1.0f + std::exp(-kAlpha * x)) * (y + 1.0f);
}

}  // namespace

// Validates a batch before anything is touched. Messages name the sequence when there are
// several; a batch of one (Forward) gets Forward's messages.
Status Model::CheckBatch(std::span<const BatchSeq> seqs) const {
  if (vocab_only_)
    return InvalidArgument("[model] loaded vocabulary only (LoadOptions::vocab_only): no weights to run");
  if (seqs.empty()) return InvalidArgument("[model] ForwardBatch called with no sequences");
  const bool many = seqs.size() > 1;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const BatchSeq& s = seqs[i];
    // Built only on failure: validation of a good batch allocates nothing.
    auto which = [&] {
      return many ? " (sequence " + std::to_string(i) + " of " + std::to_string(seqs.size()) + ")" : std::string();
    };
    if (s.kv == nullptr) return InvalidArgument("[model] ForwardBatch: null KV cache" + which());
    if (s.n <= 0) {
      return InvalidArgument(many ? "[model] ForwardBatch: " + std::to_string(s.n) + " tokens" + which() +
                                        ", expected at least 1"
                                  : std::string("[model] Forward called with no tokens"));
    }
    if (s.tokens == nullptr) return InvalidArgument("[model] ForwardBatch: null tokens" + which());
    for (size_t j = 0; j < i; ++j) {
      if (seqs[j].kv == s.kv) {
        return InvalidArgument("[model] ForwardBatch: sequences " + std::to_string(j) + " and " + std::to_string(i) +
                               " share a KV cache; each sequence needs its own");
      }
    }
    if (s.kv->n_past < 0 || s.kv->n_past + s.n > s.kv->n_ctx) {
      return OutOfRange("[model] context overflow: " + std::to_string(s.kv->n_past + s.n) + " positions > " +
                        std::to_string(s.kv->n_ctx) + which());
    }
    if (static_cast<int64_t>(s.kv->k.size()) != cfg_.n_layer || s.kv->kv_dim != cfg_.n_head_kv * cfg_.head_dim) {
      return InvalidArgument("[model] KV cache" + which() +
                             " was not made for this model: " + std::to_string(s.kv->k.size()) + " layers of " +
                             std::to_string(s.kv->kv_dim) + ", expected " + std::to_string(cfg_.n_layer) + " of " +
                             std::to_string(cfg_.n_head_kv * cfg_.head_dim));
    }
    for (int64_t t = 0; t < s.n; ++t) {
      if (s.tokens[t] < 0 || s.tokens[t] >= cfg_.n_vocab) {
        return InvalidArgument("[model] token id " + std::to_string(s.tokens[t]) + " out of range [0, " +
                               std::to_string(cfg_.n_vocab) + ")" + which());
      }
    }
  }
  return Status::Ok();
}

Status Model::Forward(KvCache& kv, const TokenId* tokens, int64_t n, bool all_logits, float* logits, float* hidden) {
  const BatchSeq all{&kv, tokens, n, all_logits, hidden};
  MR_RETURN_IF_ERROR(CheckBatch(std::span<const BatchSeq>(&all, 1)));
  // Earlier passes of a last-row-only call need no logits: only the last pass computes them.
  for (int64_t r0 = 0; r0 < n; r0 += kForwardChunk) {
    const int64_t m = std::min(kForwardChunk, n - r0);
    const BatchSeq part{&kv, tokens + r0, m, all_logits, hidden != nullptr ? hidden + r0 * cfg_.d_model : nullptr};
    float* out = all_logits ? logits + r0 * cfg_.n_vocab : (r0 + m == n ? logits : nullptr);
    RunBatch(std::span<const BatchSeq>(&part, 1), out);
  }
  return Status::Ok();
}

// Mixture of experts (qwen3moe, as llama.cpp's build_moe_ffn with softmax gating and normalized
// weights; gpt-oss with its softmax-weight gating, biases and clamped SwiGLU): the router's logits in FP32 (the same on
// both paths, so both pick the same experts), softmax over all experts, the n_expert_used most probable (ties to the
// lower index), their probabilities renormalized. Each expert then runs once over every row that picked it (its rows
// gathered contiguously): a verify step or prefill chunk reads each chosen expert's weights once, however many rows
// chose it. Rows add their experts' outputs in expert order, so a row's result does not depend on the other rows of the
// batch.
void Model::MoeFfn(const LayerWeights& L, const float* x, int64_t n, float* out) {
  const ModelConfig& c = cfg_;
  const int64_t d = c.d_model, n_exp = c.n_expert, k = c.n_expert_used, ff = c.d_ff_expert;
  const GluAct act = c.act == Activation::kGeluTanh ? GluAct::kGeluTanh : GluAct::kSilu;
  moe_probs_.resize(static_cast<size_t>(n * n_exp));
  pool_->ParallelFor(n * n_exp, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) {
      const float* xr = x + (i / n_exp) * d;
      const float* wr = L.router.data() + (i % n_exp) * d;
      float acc = 0;
      for (int64_t j = 0; j < d; ++j) acc += xr[j] * wr[j];
      moe_probs_[static_cast<size_t>(i)] = L.router_b.empty() ? acc : acc + L.router_b[static_cast<size_t>(i % n_exp)];
    }
  });
  moe_rows_.resize(static_cast<size_t>(n_exp));
  for (auto& rows : moe_rows_) rows.clear();
  std::vector<int64_t>& order = moe_order_;
  order.resize(static_cast<size_t>(n_exp));
  for (int64_t t = 0; t < n; ++t) {
    float* p = moe_probs_.data() + t * n_exp;
    // Softmax gating ranks by probability, softmax-weight gating (gpt-oss) by logit: the same order.
    if (!c.moe_softmax_weight) ref::Softmax(p, n_exp);
    for (int64_t e = 0; e < n_exp; ++e) order[static_cast<size_t>(e)] = e;
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int64_t a, int64_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    if (c.moe_softmax_weight) {  // weights: the softmax over the picked logits (p[order[0]] is their max)
      const float mx = p[order[0]];
      for (int64_t j = 0; j < k; ++j)
        p[order[static_cast<size_t>(j)]] = std::exp(p[order[static_cast<size_t>(j)]] - mx);
    }
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += p[order[static_cast<size_t>(j)]];
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = order[static_cast<size_t>(j)];
      moe_rows_[static_cast<size_t>(e)].emplace_back(t, static_cast<float>(p[e] / sum));
    }
  }
  std::fill(out, out + n * d, 0.0f);
  for (int64_t e = 0; e < n_exp; ++e) {
    const auto& rows = moe_rows_[static_cast<size_t>(e)];
    const int64_t m = static_cast<int64_t>(rows.size());
    if (m == 0) continue;
    moe_x_.resize(static_cast<size_t>(m * d));
    moe_g_.resize(static_cast<size_t>(m * ff));
    moe_y_.resize(static_cast<size_t>(m * d));
    for (int64_t j = 0; j < m; ++j)
      std::copy(x + rows[j].first * d, x + (rows[j].first + 1) * d, moe_x_.data() + j * d);
    if (c.moe_biases) {  // gpt-oss: biases before the activation, so no fused GLU
      moe_u_.resize(static_cast<size_t>(m * ff));
      ops_->Matmul(L.exp_gate[e], moe_x_.data(), m, moe_g_.data());
      ops_->Matmul(L.exp_up[e], moe_x_.data(), m, moe_u_.data());
      const float* bg = L.exp_gate_b.data() + e * ff;
      const float* bu = L.exp_up_b.data() + e * ff;
      for (int64_t j = 0; j < m; ++j) {
        float* g = moe_g_.data() + j * ff;
        const float* u = moe_u_.data() + j * ff;
        for (int64_t i = 0; i < ff; ++i) g[i] = SwigluOai(g[i] + bg[i], u[i] + bu[i]);
      }
    } else {
      ops_->Glu(L.exp_gate[e], L.exp_up[e], moe_x_.data(), m, act, moe_g_.data());
    }
    ops_->Matmul(L.exp_down[e], moe_g_.data(), m, moe_y_.data());
    const float* bd = c.moe_biases ? L.exp_down_b.data() + e * d : nullptr;
    for (int64_t j = 0; j < m; ++j) {
      float* o = out + rows[j].first * d;
      const float* y = moe_y_.data() + j * d;
      const float w = rows[j].second;
      if (bd != nullptr) {
        for (int64_t i = 0; i < d; ++i) o[i] += w * (y[i] + bd[i]);
      } else {
        for (int64_t i = 0; i < d; ++i) o[i] += w * y[i];
      }
    }
  }
}

// The rows of all sequences are concatenated (sequence order, then position): every matmul
// runs once over all of them, so each weight matrix is streamed once per step whatever the
// number of sequences. Row-wise ops (norms, biases, RoPE at the row's own position, KV writes
// into the row's own cache) and attention (each row against its own cache) are per row, so a
// row's numbers do not depend on the batch it is in.
Status Model::ForwardBatch(std::span<const BatchSeq> seqs, float* logits) {
  MR_RETURN_IF_ERROR(CheckBatch(seqs));
  RunBatch(seqs, logits);
  return Status::Ok();
}

void Model::RunBatch(std::span<const BatchSeq> seqs, float* logits) {
  const ModelConfig& c = cfg_;
  ForwardOps& ops = *ops_;
  int64_t n = 0, n_out = 0;
  for (const BatchSeq& s : seqs) {
    n += s.n;
    n_out += s.all_logits ? s.n : 1;
  }
  const int64_t d = c.d_model, hd = c.head_dim, q_dim = c.n_head * hd, kv_dim = c.n_head_kv * hd;
  // Workspaces only grow: steady decode allocates nothing.
  auto grow = [](auto& v, int64_t size) {
    if (v.size() < static_cast<size_t>(size)) v.resize(static_cast<size_t>(size));
  };
  grow(x_, n * d);
  grow(h_, n * std::max(d, q_dim));
  grow(q_, n * q_dim);
  grow(k_, n * kv_dim);
  grow(v_, n * kv_dim);
  grow(tmp_, n * std::max(d, q_dim));
  grow(gate_, n * c.d_ff);  // dense FFN only: MoeFfn has its own per-expert buffers
  grow(row_kv_, n);
  grow(row_pos_, n);

  {
    int64_t r = 0;
    for (const BatchSeq& s : seqs) {
      for (int64_t t = 0; t < s.n; ++t, ++r) {
        row_kv_[r] = s.kv;
        row_pos_[r] = s.kv->n_past + t;
        float* xr = x_.data() + r * d;
        ops.Embed(w_.tok_embd, s.tokens[t], xr);
        if (c.embed_scale != 1.0f)
          for (int64_t i = 0; i < d; ++i) xr[i] *= c.embed_scale;
      }
    }
  }
  const ForwardRows rows{std::span<KvCache* const>(row_kv_.data(), static_cast<size_t>(n)),
                         std::span<const int64_t>(row_pos_.data(), static_cast<size_t>(n))};
  const GluAct act = c.act == Activation::kSilu ? GluAct::kSilu : GluAct::kGeluTanh;

  for (int64_t l = 0; l < c.n_layer; ++l) {
    const LayerWeights& L = w_.layers[l];
    for (int64_t t = 0; t < n; ++t)
      ref::RmsNorm(x_.data() + t * d, L.attn_norm.data(), d, c.rms_eps, h_.data() + t * d);
    ops.Qkv(L, h_.data(), n, q_.data(), k_.data(), v_.data());
    const bool swa = c.layer_is_swa[l];
    for (int64_t t = 0; t < n; ++t) {
      float* qr = q_.data() + t * q_dim;
      float* kr = k_.data() + t * kv_dim;
      float* vr = v_.data() + t * kv_dim;
      const int64_t pos = row_pos_[t];
      if (c.qkv_bias) {
        for (int64_t i = 0; i < q_dim; ++i) qr[i] += L.bq[i];
        for (int64_t i = 0; i < kv_dim; ++i) {
          kr[i] += L.bk[i];
          vr[i] += L.bv[i];
        }
      }
      if (c.qk_norm) {
        for (int64_t h = 0; h < c.n_head; ++h) ref::RmsNorm(qr + h * hd, L.q_norm.data(), hd, c.rms_eps, qr + h * hd);
        for (int64_t h = 0; h < c.n_head_kv; ++h)
          ref::RmsNorm(kr + h * hd, L.k_norm.data(), hd, c.rms_eps, kr + h * hd);
      }
      if (!c.layer_no_rope[l]) {
        ops.Rope(qr, c.n_head, pos, swa);
        ops.Rope(kr, c.n_head_kv, pos, swa);
      }
      KvCache& kv = *row_kv_[t];
      uint16_t* kc = kv.k[l].data() + pos * kv_dim;
      uint16_t* vc = kv.v[l].data() + pos * kv_dim;
      for (int64_t i = 0; i < kv_dim; ++i) {
        kc[i] = F32ToBf16(kr[i]);
        vc[i] = F32ToBf16(vr[i]);
      }
      kv.InvalidatePairs(l, pos);
    }
    ops.Attention(l, swa && c.sliding_window > 0, c.attn_sinks ? L.sinks.data() : nullptr, rows, n, q_.data(),
                  h_.data());
    ops.Matmul(L.wo, h_.data(), n, tmp_.data());
    for (int64_t t = 0; t < n; ++t) {
      float* o = tmp_.data() + t * d;
      if (c.attn_out_bias)
        for (int64_t i = 0; i < d; ++i) o[i] += L.bo[i];
      if (c.post_norms) ref::RmsNorm(o, L.post_attn_norm.data(), d, c.rms_eps, o);
      for (int64_t i = 0; i < d; ++i) x_[t * d + i] += o[i];
      ref::RmsNorm(x_.data() + t * d, L.ffn_norm.data(), d, c.rms_eps, h_.data() + t * d);
    }
    if (c.n_expert > 0) {
      MoeFfn(L, h_.data(), n, tmp_.data());
    } else {
      ops.Glu(L.w_gate, L.w_up, h_.data(), n, act, gate_.data());
      ops.Matmul(L.w_down, gate_.data(), n, tmp_.data());
    }
    for (int64_t t = 0; t < n; ++t) {
      float* o = tmp_.data() + t * d;
      if (c.post_norms) ref::RmsNorm(o, L.post_ffn_norm.data(), d, c.rms_eps, o);
      for (int64_t i = 0; i < d; ++i) x_[t * d + i] += o[i];
    }
  }

  // Hidden states for embeddings: the output norm of every row of the sequences that want them.
  {
    int64_t r = 0;
    for (const BatchSeq& s : seqs) {
      if (s.hidden != nullptr)
        for (int64_t t = 0; t < s.n; ++t)
          ref::RmsNorm(x_.data() + (r + t) * d, w_.output_norm.data(), d, c.rms_eps, s.hidden + t * d);
      r += s.n;
    }
  }
  // Output norm and matmul only on the rows whose logits are wanted, gathered contiguously in
  // sequence order: every row of an all_logits sequence, the last row of the others.
  if (logits != nullptr) {
    int64_t r = 0, o = 0;
    for (const BatchSeq& s : seqs) {
      for (int64_t t = s.all_logits ? 0 : s.n - 1; t < s.n; ++t, ++o) {
        ref::RmsNorm(x_.data() + (r + t) * d, w_.output_norm.data(), d, c.rms_eps, h_.data() + o * d);
      }
      r += s.n;
    }
    ops.Logits(c.tied_embeddings ? w_.tok_embd : w_.output, h_.data(), n_out, (fine_acts_ & kActTop) != 0, logits);
    if (c.final_softcap > 0) {  // gemma2
      const float cap = c.final_softcap;
      for (int64_t i = 0; i < n_out * c.n_vocab; ++i) logits[i] = cap * std::tanh(logits[i] / cap);
    }
  }
  for (const BatchSeq& s : seqs) s.kv->n_past += s.n;
}

}  // namespace mr
