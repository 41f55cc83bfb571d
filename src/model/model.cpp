#include "model/model.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "base/log.h"
#include "model/dequant.h"
#include "model/forward_ops.h"
#include "model/gguf.h"

namespace mr {

namespace {
std::atomic<int> g_default_weights{static_cast<int>(WeightMode::kNative)};
std::atomic<bool> g_default_ref_path{false};
std::atomic<uint8_t> g_default_fine_acts{kActQkv | kActO | kActTop | kActArch};  // model.h: DefaultFineActs
constexpr std::pair<ActRole, const char*> kActRoleNames[] = {
    {kActQkv, "qkv"}, {kActO, "o"}, {kActGlu, "glu"}, {kActDown, "down"}, {kActLogits, "logits"}, {kActTop, "top"}};
}  // namespace

uint8_t DefaultFineActs() {
  return g_default_fine_acts.load();
}
void SetDefaultFineActs(uint8_t roles) {
  g_default_fine_acts.store(roles & (kActAllRoles | kActArch));
}

bool ParseFineActs(const std::string& name, uint8_t* roles) {
  if (name == "int8") {
    *roles = 0;
    return true;
  }
  if (name == "fine") {
    *roles = kActFineRoles;
    return true;
  }
  uint8_t r = 0;
  size_t at = 0;
  while (at <= name.size()) {
    const size_t comma = std::min(name.find('+', at), name.size());
    const std::string item = name.substr(at, comma - at);
    bool known = false;
    for (const auto& [role, role_name] : kActRoleNames) {
      if (item == role_name) {
        r |= role;
        known = true;
      }
    }
    if (!known) return false;
    at = comma + 1;
  }
  *roles = r;
  return true;
}

std::string FineActsName(uint8_t roles) {
  roles &= kActAllRoles;
  if (roles == 0) return "int8";
  if (roles == kActFineRoles) return "fine";
  std::string s;
  for (const auto& [role, role_name] : kActRoleNames) {
    if (roles & role) s += (s.empty() ? "" : "+") + std::string(role_name);
  }
  return s;
}

WeightMode DefaultWeightMode() {
  return static_cast<WeightMode>(g_default_weights.load());
}
void SetDefaultWeightMode(WeightMode m) {
  g_default_weights.store(static_cast<int>(m));
}
bool DefaultReferencePath() {
  return g_default_ref_path.load();
}
void SetDefaultReferencePath(bool ref) {
  g_default_ref_path.store(ref);
}

bool ParseWeightMode(const std::string& name, WeightMode* m) {
  for (WeightMode w : {WeightMode::kNative, WeightMode::kQ8G64}) {
    if (name == WeightModeName(w)) {
      *m = w;
      return true;
    }
  }
  return false;
}

const char* WeightModeName(WeightMode m) {
  return m == WeightMode::kNative ? "native" : "q8g64";
}

Model::Model() = default;
Model::~Model() = default;

Result<std::unique_ptr<Model>> Model::Load(const std::string& path, const LoadOptions& opts) {
  std::unique_ptr<Model> m(new Model());
  MR_ASSIGN_OR_RETURN(m->file_, gguf::GgufFile::Open(path));
  const gguf::GgufFile& f = *m->file_;
  const std::string arch = f.GetString("general.architecture").value_or("");
  if (arch == "llama") {
    MR_RETURN_IF_ERROR(ReadLlamaConfig(f, &m->cfg_));
  } else if (arch == "qwen2") {
    MR_RETURN_IF_ERROR(ReadQwen2Config(f, &m->cfg_));
  } else if (arch == "qwen3") {
    MR_RETURN_IF_ERROR(ReadQwen3Config(f, &m->cfg_));
  } else if (arch == "qwen3moe") {
    MR_RETURN_IF_ERROR(ReadQwen3MoeConfig(f, &m->cfg_));
  } else if (arch == "phi3") {
    MR_RETURN_IF_ERROR(ReadPhi3Config(f, &m->cfg_));
  } else if (arch == "gemma2") {
    MR_RETURN_IF_ERROR(ReadGemma2Config(f, &m->cfg_));
  } else if (arch == "gemma3") {
    MR_RETURN_IF_ERROR(ReadGemma3Config(f, &m->cfg_));
  } else if (arch == "smollm3") {
    MR_RETURN_IF_ERROR(ReadSmolLM3Config(f, &m->cfg_));
  } else if (arch == "gpt-oss") {
    MR_RETURN_IF_ERROR(ReadGptOssConfig(f, &m->cfg_));
  } else {
    return Unsupported("[model] architecture '" + arch +
                       "' is not supported (supported: llama, qwen2, qwen3, qwen3moe, phi3, gemma2, gemma3, smollm3, "
                       "gpt-oss)");
  }
  // YaRN's magnitude scale multiplies the rotated q and k alike: the scores by its square.
  m->cfg_.attn_scale *= m->cfg_.rope_mscale * m->cfg_.rope_mscale;
  m->pool_ = std::make_unique<ThreadPool>(opts.n_threads > 0 ? opts.n_threads : ThreadPool::DefaultThreads());
  m->ref_path_ = opts.ref_path || DefaultReferencePath();
  m->kernels_ = &GetKernels(CpuSupports(opts.cpu) ? opts.cpu : DetectCpuVariant());
  m->native_weights_ = opts.weights == WeightMode::kNative;
  const uint8_t roles = opts.fine_acts & kActArch ? opts.fine_acts | m->cfg_.arch_fine_acts : opts.fine_acts;
  m->fine_acts_ = m->ref_path_ ? 0 : roles & kActAllRoles;
  MR_ASSIGN_OR_RETURN(m->tokenizer_, Tokenizer::FromGguf(f));
  if (opts.vocab_only) {
    m->vocab_only_ = true;
    MR_LOGI("model", "loaded %s: %s, vocabulary only (%lld tokens), no weights", path.c_str(), arch.c_str(),
            (long long)m->tokenizer_->vocab_size());
    return m;
  }
  MR_RETURN_IF_ERROR(m->LoadWeights());
  m->MarkFineActs();
  if (m->ref_path_) {
    m->ops_ = NewRefOps(m->cfg_, *m->pool_, m->source_);
  } else {
    m->ops_ = NewFastOps(m->cfg_, *m->pool_, *m->kernels_, m->n_native_ > 0);
  }
  MR_LOGI("model",
          "loaded %s: %s, %lld layers, d_model %lld, %lld heads (%lld kv), vocab %lld, %.1f MiB weights (%s: %lld "
          "matrices native, rest q8/g64), %s path, %s, activations %s, %d threads",
          path.c_str(), arch.c_str(), (long long)m->cfg_.n_layer, (long long)m->cfg_.d_model, (long long)m->cfg_.n_head,
          (long long)m->cfg_.n_head_kv, (long long)m->cfg_.n_vocab, m->weight_bytes() / 1048576.0,
          WeightModeName(m->weight_mode()), (long long)m->n_native_, m->ref_path_ ? "reference" : "fast",
          CpuVariantName(m->kernels_->variant), FineActsName(m->fine_acts_).c_str(), m->pool_->size());
  return m;
}

namespace {

Status FindTensor(const gguf::GgufFile& f, const std::string& name, const gguf::TensorInfo** out) {
  *out = f.FindTensor(name);
  if (!*out) return InvalidArgument("[model] missing tensor '" + name + "'");
  return Status::Ok();
}

Status CheckShape(const gguf::TensorInfo& t, int64_t cols, int64_t rows) {
  const int64_t got_rows = t.rows();
  if (t.cols() != cols || got_rows != rows) {
    return InvalidArgument("[model] tensor '" + t.name + "': shape (" + std::to_string(got_rows) + ", " +
                           std::to_string(t.cols()) + "), expected (" + std::to_string(rows) + ", " +
                           std::to_string(cols) + ")");
  }
  return Status::Ok();
}

// Index of the first NaN or infinity in x[0..n), or -1. A weight file with one (a corrupted
// or hostile FP16/FP32 value, or a block scale of a quantized type) would turn every logit
// into NaN; the loader rejects it instead. Branch-free over the bits, so it vectorizes.
int64_t FirstNonFinite(const float* x, int64_t n) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, x + i, 4);
    bad |= (b & 0x7f800000u) == 0x7f800000u;
  }
  if (!bad) return -1;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) return i;
  }
  return -1;
}

Status NonFiniteError(const gguf::TensorInfo& t, int64_t row, int64_t col, float value) {
  return InvalidArgument("[model] tensor '" + t.name + "' (" + gguf::TypeName(t.type) + "): row " +
                         std::to_string(row) + ", column " + std::to_string(col) + " dequantizes to " +
                         std::to_string(value) + ", expected a finite value");
}

// The dequantization of a tensor's rows, with the tensor named in any error.
Status DequantizeRows(const gguf::TensorInfo& t, const uint8_t* src, float* dst, int64_t n) {
  Status st = DequantizeRow(t.type, src, dst, n);
  if (!st.ok()) return Status(st.code(), "[model] tensor '" + t.name + "': " + st.message());
  return Status::Ok();
}

Status LoadVector(const gguf::GgufFile& f, const std::string& name, int64_t n, std::vector<float>* out) {
  const gguf::TensorInfo* t;
  MR_RETURN_IF_ERROR(FindTensor(f, name, &t));
  if (t->n_elements != n) {
    return InvalidArgument("[model] tensor '" + name + "': " + std::to_string(t->n_elements) + " elements, expected " +
                           std::to_string(n));
  }
  if (!CanDequantize(t->type)) {
    return Unsupported("[model] tensor '" + name + "' has type " + gguf::TypeName(t->type) +
                       ", which cannot be converted");
  }
  out->resize(n);
  MR_RETURN_IF_ERROR(DequantizeRows(*t, t->data, out->data(), n));
  if (const int64_t i = FirstNonFinite(out->data(), n); i >= 0)
    return NonFiniteError(*t, i / t->cols(), i % t->cols(), (*out)[i]);
  return Status::Ok();
}

}  // namespace

namespace {

// The native K-quant format of a GGUF tensor type, if it has one.
bool NativeFormat(const gguf::TensorInfo& t, KFormat* f) {
  switch (static_cast<gguf::TensorType>(t.type)) {
    case gguf::TensorType::kQ4_K:
      *f = KFormat::kQ4K;
      return true;
    case gguf::TensorType::kQ5_K:
      *f = KFormat::kQ5K;
      return true;
    case gguf::TensorType::kQ6_K:
      *f = KFormat::kQ6K;
      return true;
    case gguf::TensorType::kQ5_0:
      *f = KFormat::kQ5_0;
      return true;
    case gguf::TensorType::kQ4_1:
      *f = KFormat::kQ4_1;
      return true;
    case gguf::TensorType::kQ8_0:
      *f = KFormat::kQ8_0;
      return true;
    case gguf::TensorType::kQ4_0:
      *f = KFormat::kQ4_0;
      return true;
    case gguf::TensorType::kF16:
      *f = KFormat::kF16;
      return true;
    case gguf::TensorType::kBF16:
      *f = KFormat::kBF16;
      return true;
    case gguf::TensorType::kMXFP4:
      *f = KFormat::kMXFP4;
      return true;
    default:
      return false;
  }
}

}  // namespace

// A GGUF matrix (rows outputs of cols inputs) in its fast-path format: tensors of a native type
// (kquant.h: Q4_K, Q5_K, Q6_K, Q5_0, Q4_1, Q8_0, Q4_0, F16, BF16, MXFP4) stay
// native when allowed (native_weights_ and allow_native); others are converted to Q8/g64 in row
// chunks so peak memory stays small, chunks spread over the pool.
Status Model::LoadMatrix(const std::string& name, int64_t rows, int64_t cols, bool allow_native, WeightMatrix* out) {
  const gguf::TensorInfo* t;
  MR_RETURN_IF_ERROR(FindTensor(*file_, name, &t));
  MR_RETURN_IF_ERROR(CheckShape(*t, cols, rows));
  return LoadMatrixFrom(*t, allow_native, out);
}

// Rows [row0, row0 + rows) of a tensor seen as a matrix of cols inputs: a view with its own
// name, kept in tensor_views_ (the reference path reads the view's rows again per call).
const gguf::TensorInfo& Model::RowView(const gguf::TensorInfo& t, const std::string& name, int64_t row0, int64_t rows) {
  auto view = std::make_unique<gguf::TensorInfo>(t);
  const uint64_t row_bytes = t.row_bytes();
  view->name = name;
  view->dims = {t.cols(), rows};
  view->n_elements = rows * t.cols();
  view->n_bytes = row_bytes * static_cast<uint64_t>(rows);
  view->offset = t.offset + row_bytes * static_cast<uint64_t>(row0);
  view->data = t.data + row_bytes * static_cast<uint64_t>(row0);
  tensor_views_.push_back(std::move(view));
  return *tensor_views_.back();
}

// The experts of a 3-D GGUF tensor (ggml dims: cols, rows, n_expert): expert e is rows
// [e * rows, (e + 1) * rows) of the tensor seen as a matrix, each loaded as its own matrix.
Status Model::LoadExperts(const std::string& name, int64_t rows, int64_t cols, bool allow_native,
                          std::vector<WeightMatrix>* out) {
  const gguf::TensorInfo* t;
  MR_RETURN_IF_ERROR(FindTensor(*file_, name, &t));
  const int64_t n_exp = cfg_.n_expert;
  if (t->dims.size() != 3 || t->dims[0] != cols || t->dims[1] != rows || t->dims[2] != n_exp) {
    std::string got;
    for (int64_t x : t->dims) got += (got.empty() ? "" : ", ") + std::to_string(x);
    return InvalidArgument("[model] tensor '" + name + "': dims (" + got + "), expected (" + std::to_string(cols) +
                           ", " + std::to_string(rows) + ", " + std::to_string(n_exp) + ")");
  }
  out->resize(static_cast<size_t>(n_exp));  // sized once: source_ keys on the elements' addresses
  for (int64_t e = 0; e < n_exp; ++e) {
    const gguf::TensorInfo& view = RowView(*t, name + "[" + std::to_string(e) + "]", e * rows, rows);
    MR_RETURN_IF_ERROR(LoadMatrixFrom(view, allow_native, &(*out)[static_cast<size_t>(e)]));
  }
  return Status::Ok();
}

Status Model::LoadMatrixFrom(const gguf::TensorInfo& tensor, bool allow_native, WeightMatrix* out) {
  const gguf::GgufFile& f = *file_;
  const gguf::TensorInfo* t = &tensor;
  const std::string& name = t->name;
  const int64_t rows = t->rows(), cols = t->cols();
  allow_native = allow_native && native_weights_;
  source_[out] = t;
  KFormat kf = KFormat::kQ4K;
  if (allow_native && NativeFormat(*t, &kf) && cols % KSuperInputs(kf) == 0 && cols % kActGroup == 0) {
    // The file's own words, reordered into tiles (kquant.h), tiles spread over the pool.
    out->format = NativeWeightFormat(kf);
    out->k = NewKMatrix(kf, rows, cols);
    MR_CHECK(t->row_bytes() == static_cast<uint64_t>(out->k.supers() * KSuperBytes(kf)));
    std::vector<Status> errors(pool_->size());
    pool_->ParallelFor(out->k.tiles(), [&](int64_t b, int64_t e, int th) {
      Status st = PackKTiles(t->data, b, e, &out->k);
      if (!st.ok()) errors[th] = st;
    });
    for (const Status& st : errors) {
      if (!st.ok()) {
        return InvalidArgument("[model] tensor '" + name + "' (" + gguf::TypeName(t->type) + "): " + st.message());
      }
    }
    ++n_native_;
    MR_LOGD("convert", "%-28s %-5s -> native tiles (no requantization)", name.c_str(), gguf::TypeName(t->type).c_str());
    f.ReleasePages(*t);  // the tiles are a copy: the file's pages need not stay resident
    return Status::Ok();
  }
  if (!CanDequantize(t->type)) {
    return Unsupported("[model] tensor '" + name + "' has type " + gguf::TypeName(t->type) +
                       ", which cannot be converted");
  }
  if (cols % kQ8Group != 0) {
    return Unsupported("[model] tensor '" + name + "': input size " + std::to_string(cols) +
                       " is not a multiple of 64");
  }
  const size_t row_bytes = t->row_bytes();
  out->format = WeightFormat::kQ8G64;
  out->q8 = NewPackedQ8(rows, cols);  // tile-interleaved for the kernels (q8.h)
  constexpr int64_t kChunk = 64;      // a multiple of kQ8Tile
  const int64_t n_chunks = (rows + kChunk - 1) / kChunk;
  std::vector<Status> errors(pool_->size());
  const bool want_stats = MR_LOG_ENABLED(kDebug);
  std::vector<double> err_sq(pool_->size(), 0), w_sq(pool_->size(), 0), err_max(pool_->size(), 0);
  pool_->ParallelFor(n_chunks, [&](int64_t b, int64_t e, int th) {
    std::vector<float> buf(static_cast<size_t>(kChunk * cols));
    for (int64_t ch = b; ch < e; ++ch) {
      const int64_t r0 = ch * kChunk, nr = std::min(kChunk, rows - r0);
      for (int64_t r = 0; r < nr; ++r) {
        Status st = DequantizeRows(*t, t->data + (r0 + r) * row_bytes, buf.data() + r * cols, cols);
        if (!st.ok()) {
          errors[th] = st;
          return;
        }
      }
      if (const int64_t i = FirstNonFinite(buf.data(), nr * cols); i >= 0) {
        errors[th] = NonFiniteError(*t, r0 + i / cols, i % cols, buf[i]);
        return;
      }
      QuantError qe;  // conversion error statistics cost a pass of doubles: only for debug logs
      QMatrix part = QuantizeQ8(buf.data(), nr, cols, want_stats ? &qe : nullptr);
      PackRowsInto(part, r0, &out->q8);
      const double n = static_cast<double>(nr * cols);
      err_sq[th] += qe.rms * qe.rms * n;
      w_sq[th] += qe.rms_w * qe.rms_w * n;
      err_max[th] = std::max(err_max[th], qe.max_abs);
    }
  });
  for (const Status& st : errors) MR_RETURN_IF_ERROR(st);
  if (MR_LOG_ENABLED(kDebug)) {
    double es = 0, ws = 0, em = 0;
    for (size_t i = 0; i < err_sq.size(); ++i) {
      es += err_sq[i];
      ws += w_sq[i];
      em = std::max(em, err_max[i]);
    }
    const double n = static_cast<double>(rows * cols);
    MR_LOGD("convert", "%-28s %-5s -> q8/g64: max err %.3g, rms err %.3g (%.3f%% of rms w)", name.c_str(),
            gguf::TypeName(t->type).c_str(), em, std::sqrt(es / n), 100.0 * std::sqrt(es / ws));
  }
  f.ReleasePages(*t);
  return Status::Ok();
}

void Model::MarkFineActs() {
  auto mark = [&](WeightMatrix& w, ActRole role) { w.fine_acts = (fine_acts_ & role) != 0 && !w.float_format(); };
  for (LayerWeights& L : w_.layers) {
    for (WeightMatrix* w : {&L.wq, &L.wk, &L.wv}) mark(*w, kActQkv);
    mark(L.wo, kActO);
    for (WeightMatrix* w : {&L.w_gate, &L.w_up}) mark(*w, kActGlu);
    mark(L.w_down, kActDown);
    for (auto* experts : {&L.exp_gate, &L.exp_up}) {
      for (WeightMatrix& w : *experts) mark(w, kActGlu);
    }
    for (WeightMatrix& w : L.exp_down) mark(w, kActDown);
  }
  mark(cfg_.tied_embeddings ? w_.tok_embd : w_.output, kActLogits);
}

Status Model::LoadWeights() {
  const gguf::GgufFile& f = *file_;
  const ModelConfig& c = cfg_;
  const int64_t d = c.d_model, hd = c.head_dim, q_dim = c.n_head * hd, kv_dim = c.n_head_kv * hd;
  MR_RETURN_IF_ERROR(LoadMatrix("token_embd.weight", c.n_vocab, d, true, &w_.tok_embd));
  MR_RETURN_IF_ERROR(LoadVector(f, "output_norm.weight", d, &w_.output_norm));
  if (f.FindTensor("output.weight")) {
    MR_RETURN_IF_ERROR(LoadMatrix("output.weight", c.n_vocab, d, true, &w_.output));
  } else {
    cfg_.tied_embeddings = true;
  }
  if (f.FindTensor("rope_freqs.weight")) {  // Llama 3.x rope scaling, one factor per pair
    if (!cfg_.rope_freq_factors.empty()) {
      return Unsupported("[model] tensor 'rope_freqs.weight' together with rope.scaling metadata is not supported");
    }
    MR_RETURN_IF_ERROR(LoadVector(f, "rope_freqs.weight", hd / 2, &cfg_.rope_freq_factors));
    for (size_t i = 0; i < cfg_.rope_freq_factors.size(); ++i) {
      if (!(cfg_.rope_freq_factors[i] > 0)) {
        return InvalidArgument("[model] tensor 'rope_freqs.weight': factor " + std::to_string(i) + " is " +
                               std::to_string(cfg_.rope_freq_factors[i]) + ", expected a positive number");
      }
    }
  }
  w_.layers.resize(c.n_layer);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    LayerWeights& L = w_.layers[l];
    const std::string p = "blk." + std::to_string(l) + ".";
    MR_RETURN_IF_ERROR(LoadVector(f, p + "attn_norm.weight", d, &L.attn_norm));
    // gpt-oss stores the FFN's (pre-)norm under the name of a post-attention norm.
    MR_RETURN_IF_ERROR(LoadVector(f, p + (c.arch == Arch::kGptOss ? "post_attention_norm.weight" : "ffn_norm.weight"),
                                  d, &L.ffn_norm));
    if (const gguf::TensorInfo* qkv = f.FindTensor(p + "attn_qkv.weight")) {  // phi3: q, k, v rows in one tensor
      MR_RETURN_IF_ERROR(CheckShape(*qkv, d, q_dim + 2 * kv_dim));
      MR_RETURN_IF_ERROR(LoadMatrixFrom(RowView(*qkv, qkv->name + "[q]", 0, q_dim), true, &L.wq));
      MR_RETURN_IF_ERROR(LoadMatrixFrom(RowView(*qkv, qkv->name + "[k]", q_dim, kv_dim), true, &L.wk));
      MR_RETURN_IF_ERROR(LoadMatrixFrom(RowView(*qkv, qkv->name + "[v]", q_dim + kv_dim, kv_dim), true, &L.wv));
    } else {
      MR_RETURN_IF_ERROR(LoadMatrix(p + "attn_q.weight", q_dim, d, true, &L.wq));
      MR_RETURN_IF_ERROR(LoadMatrix(p + "attn_k.weight", kv_dim, d, true, &L.wk));
      MR_RETURN_IF_ERROR(LoadMatrix(p + "attn_v.weight", kv_dim, d, true, &L.wv));
    }
    MR_RETURN_IF_ERROR(LoadMatrix(p + "attn_output.weight", d, q_dim, true, &L.wo));
    // The fused GLU kernel reads gate and up in one format: native only when both tensors agree.
    auto same_type = [&](const std::string& a, const std::string& b) {
      const gguf::TensorInfo* ta = f.FindTensor(a);
      const gguf::TensorInfo* tb = f.FindTensor(b);
      return ta && tb && ta->type == tb->type;
    };
    if (c.n_expert > 0) {
      MR_RETURN_IF_ERROR(LoadVector(f, p + "ffn_gate_inp.weight", c.n_expert * d, &L.router));
      if (c.moe_biases) {
        MR_RETURN_IF_ERROR(LoadVector(f, p + "ffn_gate_inp.bias", c.n_expert, &L.router_b));
        MR_RETURN_IF_ERROR(LoadVector(f, p + "ffn_gate_exps.bias", c.n_expert * c.d_ff_expert, &L.exp_gate_b));
        MR_RETURN_IF_ERROR(LoadVector(f, p + "ffn_up_exps.bias", c.n_expert * c.d_ff_expert, &L.exp_up_b));
        MR_RETURN_IF_ERROR(LoadVector(f, p + "ffn_down_exps.bias", c.n_expert * d, &L.exp_down_b));
      }
      const bool same = same_type(p + "ffn_gate_exps.weight", p + "ffn_up_exps.weight");
      MR_RETURN_IF_ERROR(LoadExperts(p + "ffn_gate_exps.weight", c.d_ff_expert, d, same, &L.exp_gate));
      MR_RETURN_IF_ERROR(LoadExperts(p + "ffn_up_exps.weight", c.d_ff_expert, d, same, &L.exp_up));
      MR_RETURN_IF_ERROR(LoadExperts(p + "ffn_down_exps.weight", d, c.d_ff_expert, true, &L.exp_down));
    } else if (f.FindTensor(p + "ffn_gate.weight") == nullptr && f.FindTensor(p + "ffn_up.weight") != nullptr) {
      // phi3: ffn_up holds the gate's rows, then the up projection's (llama.cpp's fused SwiGLU).
      const gguf::TensorInfo& up = *f.FindTensor(p + "ffn_up.weight");
      MR_RETURN_IF_ERROR(CheckShape(up, d, 2 * c.d_ff));
      MR_RETURN_IF_ERROR(LoadMatrixFrom(RowView(up, up.name + "[gate]", 0, c.d_ff), true, &L.w_gate));
      MR_RETURN_IF_ERROR(LoadMatrixFrom(RowView(up, up.name + "[up]", c.d_ff, c.d_ff), true, &L.w_up));
      MR_RETURN_IF_ERROR(LoadMatrix(p + "ffn_down.weight", d, c.d_ff, true, &L.w_down));
    } else {
      const bool same = same_type(p + "ffn_gate.weight", p + "ffn_up.weight");
      MR_RETURN_IF_ERROR(LoadMatrix(p + "ffn_gate.weight", c.d_ff, d, same, &L.w_gate));
      MR_RETURN_IF_ERROR(LoadMatrix(p + "ffn_up.weight", c.d_ff, d, same, &L.w_up));
      MR_RETURN_IF_ERROR(LoadMatrix(p + "ffn_down.weight", d, c.d_ff, true, &L.w_down));
    }
    if (c.qkv_bias) {
      MR_RETURN_IF_ERROR(LoadVector(f, p + "attn_q.bias", q_dim, &L.bq));
      MR_RETURN_IF_ERROR(LoadVector(f, p + "attn_k.bias", kv_dim, &L.bk));
      MR_RETURN_IF_ERROR(LoadVector(f, p + "attn_v.bias", kv_dim, &L.bv));
    }
    if (c.attn_out_bias) MR_RETURN_IF_ERROR(LoadVector(f, p + "attn_output.bias", d, &L.bo));
    if (c.attn_sinks) MR_RETURN_IF_ERROR(LoadVector(f, p + "attn_sinks.weight", c.n_head, &L.sinks));
    if (c.qk_norm) {
      MR_RETURN_IF_ERROR(LoadVector(f, p + "attn_q_norm.weight", hd, &L.q_norm));
      MR_RETURN_IF_ERROR(LoadVector(f, p + "attn_k_norm.weight", hd, &L.k_norm));
    }
    if (c.post_norms) {
      MR_RETURN_IF_ERROR(LoadVector(f, p + "post_attention_norm.weight", d, &L.post_attn_norm));
      MR_RETURN_IF_ERROR(LoadVector(f, p + "post_ffw_norm.weight", d, &L.post_ffn_norm));
    }
  }
  return Status::Ok();
}

size_t Model::weight_bytes() const {
  size_t b = w_.output.bytes() + (cfg_.tied_embeddings ? w_.tok_embd.bytes() : 0);
  for (const LayerWeights& L : w_.layers) {
    b += L.wq.bytes() + L.wk.bytes() + L.wv.bytes() + L.wo.bytes() + L.w_gate.bytes() + L.w_up.bytes() +
         L.w_down.bytes();
    // A token reads n_expert_used of the experts (counted at their mean size) and the router.
    size_t experts = 0;
    for (size_t e = 0; e < L.exp_gate.size(); ++e)
      experts += L.exp_gate[e].bytes() + L.exp_up[e].bytes() + L.exp_down[e].bytes();
    if (!L.exp_gate.empty()) {
      b += experts / L.exp_gate.size() * static_cast<size_t>(cfg_.n_expert_used) + L.router.size() * sizeof(float);
    }
  }
  return b;
}

KvCache Model::NewKvCache(int64_t n_ctx) const {
  return KvCache::Allocate(cfg_.n_layer, n_ctx, cfg_.n_head_kv * cfg_.head_dim);
}

}  // namespace mr
