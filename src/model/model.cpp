#include "model/model.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <new>

#include "base/half.h"
#include "base/log.h"
#include "kernels/ref/ops_ref.h"
#include "model/dequant.h"
#include "model/gguf.h"

namespace mr {

KvBuffer::KvBuffer(size_t n) : n_(n) {
  if (n == 0) return;
  void* p = mmap(nullptr, n * sizeof(uint16_t), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  p_ = static_cast<uint16_t*>(p);
}

KvBuffer& KvBuffer::operator=(KvBuffer&& o) noexcept {
  if (this != &o) {
    if (p_) munmap(p_, n_ * sizeof(uint16_t));
    p_ = o.p_;
    n_ = o.n_;
    o.p_ = nullptr;
    o.n_ = 0;
  }
  return *this;
}

KvBuffer::~KvBuffer() {
  if (p_) munmap(p_, n_ * sizeof(uint16_t));
}

void KvBuffer::Release() {
  // The mapping starts on a page; the kernel rounds the length up to whole pages. Private
  // anonymous pages read as zero after MADV_DONTNEED, as in a fresh buffer.
  if (p_) MR_CHECK(madvise(p_, n_ * sizeof(uint16_t), MADV_DONTNEED) == 0);
}

KvCache KvCache::Allocate(int64_t n_layer, int64_t n_ctx, int64_t kv_dim) {
  MR_CHECK(n_layer >= 0 && n_ctx >= 0 && kv_dim >= 0);
  KvCache kv;
  kv.n_ctx = n_ctx;
  kv.kv_dim = kv_dim;
  kv.k.reserve(static_cast<size_t>(n_layer));
  kv.v.reserve(static_cast<size_t>(n_layer));
  for (int64_t l = 0; l < n_layer; ++l) {
    kv.k.emplace_back(static_cast<size_t>(n_ctx * kv_dim));
    kv.v.emplace_back(static_cast<size_t>(n_ctx * kv_dim));
  }
  return kv;
}

size_t KvCache::bytes() const {
  size_t b = 0;
  for (const auto& x : k) b += x.size() * 2;
  for (const auto& x : v) b += x.size() * 2;
  return b;
}

size_t KvCache::bytes_in_use() const {
  return static_cast<size_t>(n_past) * static_cast<size_t>(kv_dim) * 2 * 2 * k.size();
}

void KvCache::Release() {
  n_past = 0;
  for (auto& x : k) x.Release();
  for (auto& x : v) x.Release();
}

namespace {
std::atomic<int> g_default_weights{static_cast<int>(WeightMode::kNative)};
std::atomic<bool> g_default_ref_path{false};
}  // namespace

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
  } else if (arch == "gemma3") {
    MR_RETURN_IF_ERROR(ReadGemma3Config(f, &m->cfg_));
  } else {
    return Unsupported("[model] architecture '" + arch + "' is not supported (supported: llama, qwen2, gemma3)");
  }
  m->pool_ = std::make_unique<ThreadPool>(opts.n_threads > 0 ? opts.n_threads : ThreadPool::DefaultThreads());
  m->ref_path_ = opts.ref_path || DefaultReferencePath();
  m->kernels_ = &GetKernels(CpuSupports(opts.cpu) ? opts.cpu : DetectCpuVariant());
  m->native_weights_ = opts.weights == WeightMode::kNative;
  MR_ASSIGN_OR_RETURN(m->tokenizer_, Tokenizer::FromGguf(f));
  if (opts.vocab_only) {
    m->vocab_only_ = true;
    MR_LOGI("model", "loaded %s: %s, vocabulary only (%lld tokens), no weights", path.c_str(), arch.c_str(),
            (long long)m->tokenizer_->vocab_size());
    return m;
  }
  MR_RETURN_IF_ERROR(m->LoadWeights());
  m->InitRope();
  MR_LOGI("model",
          "loaded %s: %s, %lld layers, d_model %lld, %lld heads (%lld kv), vocab %lld, %.1f MiB weights (%s: %lld "
          "matrices native, rest q8/g64), %s path, %s, %d threads",
          path.c_str(), arch.c_str(), (long long)m->cfg_.n_layer, (long long)m->cfg_.d_model, (long long)m->cfg_.n_head,
          (long long)m->cfg_.n_head_kv, (long long)m->cfg_.n_vocab, m->weight_bytes() / 1048576.0,
          WeightModeName(m->weight_mode()), (long long)m->n_native_, m->ref_path_ ? "reference" : "fast",
          CpuVariantName(m->kernels_->variant), m->pool_->size());
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
    case gguf::TensorType::kQ6_K:
      *f = KFormat::kQ6K;
      return true;
    case gguf::TensorType::kQ5_0:
      *f = KFormat::kQ5_0;
      return true;
    case gguf::TensorType::kQ4_1:
      *f = KFormat::kQ4_1;
      return true;
    default:
      return false;
  }
}

}  // namespace

// A GGUF matrix (rows outputs of cols inputs) in its fast-path format: Q4_K / Q6_K tensors stay
// native when allowed (native_weights_ and allow_native); others are converted to Q8/g64 in row
// chunks so peak memory stays small, chunks spread over the pool.
Status Model::LoadMatrix(const std::string& name, int64_t rows, int64_t cols, bool allow_native, WeightMatrix* out) {
  const gguf::GgufFile& f = *file_;
  allow_native = allow_native && native_weights_;
  const gguf::TensorInfo* t;
  MR_RETURN_IF_ERROR(FindTensor(f, name, &t));
  MR_RETURN_IF_ERROR(CheckShape(*t, cols, rows));
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
      if (!st.ok()) return InvalidArgument("[model] tensor '" + name + "': " + st.message());
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
  w_.layers.resize(c.n_layer);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    LayerWeights& L = w_.layers[l];
    const std::string p = "blk." + std::to_string(l) + ".";
    MR_RETURN_IF_ERROR(LoadVector(f, p + "attn_norm.weight", d, &L.attn_norm));
    MR_RETURN_IF_ERROR(LoadVector(f, p + "ffn_norm.weight", d, &L.ffn_norm));
    MR_RETURN_IF_ERROR(LoadMatrix(p + "attn_q.weight", q_dim, d, true, &L.wq));
    MR_RETURN_IF_ERROR(LoadMatrix(p + "attn_k.weight", kv_dim, d, true, &L.wk));
    MR_RETURN_IF_ERROR(LoadMatrix(p + "attn_v.weight", kv_dim, d, true, &L.wv));
    MR_RETURN_IF_ERROR(LoadMatrix(p + "attn_output.weight", d, q_dim, true, &L.wo));
    {  // the fused GLU kernel reads gate and up in one format: native only when both files agree
      const gguf::TensorInfo* tg = f.FindTensor(p + "ffn_gate.weight");
      const gguf::TensorInfo* tu = f.FindTensor(p + "ffn_up.weight");
      const bool same = tg && tu && tg->type == tu->type;
      MR_RETURN_IF_ERROR(LoadMatrix(p + "ffn_gate.weight", c.d_ff, d, same, &L.w_gate));
      MR_RETURN_IF_ERROR(LoadMatrix(p + "ffn_up.weight", c.d_ff, d, same, &L.w_up));
    }
    MR_RETURN_IF_ERROR(LoadMatrix(p + "ffn_down.weight", d, c.d_ff, true, &L.w_down));
    if (c.qkv_bias) {
      MR_RETURN_IF_ERROR(LoadVector(f, p + "attn_q.bias", q_dim, &L.bq));
      MR_RETURN_IF_ERROR(LoadVector(f, p + "attn_k.bias", kv_dim, &L.bk));
      MR_RETURN_IF_ERROR(LoadVector(f, p + "attn_v.bias", kv_dim, &L.bv));
    }
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

void Model::InitRope() {
  const int64_t hd = cfg_.head_dim, half = hd / 2;
  rope_inv_.resize(half);
  rope_inv_swa_.resize(half);
  rope_cs_.resize(hd);
  for (int64_t i = 0; i < half; ++i) {  // same float expression as ref::Rope
    const float e = -2.0f * static_cast<float>(i) / static_cast<float>(hd);
    rope_inv_[i] = std::pow(cfg_.rope_base, e);
    rope_inv_swa_[i] = std::pow(cfg_.rope_base_swa, e);
  }
}

size_t Model::weight_bytes() const {
  size_t b = w_.output.bytes() + (cfg_.tied_embeddings ? w_.tok_embd.bytes() : 0);
  for (const LayerWeights& L : w_.layers) {
    b += L.wq.bytes() + L.wk.bytes() + L.wv.bytes() + L.wo.bytes() + L.w_gate.bytes() + L.w_up.bytes() +
         L.w_down.bytes();
  }
  return b;
}

KvCache Model::NewKvCache(int64_t n_ctx) const {
  return KvCache::Allocate(cfg_.n_layer, n_ctx, cfg_.n_head_kv * cfg_.head_dim);
}

void Model::QuantizeInput(const float* x, int64_t n_rows, int64_t cols) {
  qa_.Resize(n_rows, cols);
  const int64_t groups = cols / kActGroup;
  const bool sums = n_native_ > 0;  // the K-quant kernels' minimum / offset terms
  if (n_rows <= 8) {                // decode and verify: cheaper than a hand-off to the workers
    kernels_->quantize_acts(x, n_rows, cols, qa_.q.data(), qa_.scales.data());
    if (sums) qa_.ComputeSums(0, n_rows);
    return;
  }
  pool_->ParallelFor(n_rows, [&](int64_t b, int64_t e, int) {
    kernels_->quantize_acts(x + b * cols, e - b, cols, qa_.q.data() + b * cols, qa_.scales.data() + b * groups);
    if (sums) qa_.ComputeSums(b, e);
  });
}

// Matmul ops hand out their output tiles in chunks that the threads claim as they go (about 8
// per thread): on a machine where a thread is descheduled or its memory stream is slower for a
// while, the other takes over its share instead of waiting for it at the end of the op.
int64_t Model::TileChunk(int64_t tiles) const {
  return std::max<int64_t>(1, tiles / (8 * pool_->size()));
}

void Model::MatmulQuantized(const WeightMatrix& w, int64_t n_rows, float* y) {
  pool_->ParallelForDynamic(w.tiles(), TileChunk(w.tiles()), [&](int64_t b, int64_t e, int) {
    MatmulTiles(*kernels_, w, qa_, n_rows, y, w.rows(), b, e);
  });
}

// q, k and v projections of the quantized input in one parallel op: the threads split the
// concatenated output tiles of the three matrices.
void Model::MatmulQkv(const LayerWeights& L, int64_t n_rows) {
  const int64_t tq = L.wq.tiles(), tk = L.wk.tiles(), tv = L.wv.tiles();
  pool_->ParallelForDynamic(tq + tk + tv, TileChunk(tq + tk + tv), [&](int64_t b, int64_t e, int) {
    auto part = [&](const WeightMatrix& w, int64_t off, float* y) {
      const int64_t lo = std::max(b, off) - off, hi = std::min(e, off + w.tiles()) - off;
      if (hi > lo) MatmulTiles(*kernels_, w, qa_, n_rows, y, w.rows(), lo, hi);
    };
    part(L.wq, 0, q_.data());
    part(L.wk, tq, k_.data());
    part(L.wv, tq + tk, v_.data());
  });
}

// Reference matmul on the GGUF tensor itself: each weight row is dequantized from its stored
// type (exact to the block definitions) and dotted with FP32 activations in FP32. No Q8/g64
// rounding is involved, so this path is the oracle for the converted weights and kernels.
void Model::MatmulSource(const gguf::TensorInfo& t, const float* x, int64_t n_rows, float* y, int64_t ldy) {
  const int64_t cols = t.cols(), rows = t.rows();
  const size_t row_bytes = t.row_bytes();
  pool_->ParallelFor(rows, [&](int64_t b, int64_t e, int th) {
    float* wrow = ref_rows_.data() + th * cols;
    for (int64_t o = b; o < e; ++o) {
      MR_CHECK(DequantizeRow(t.type, t.data + o * row_bytes, wrow, cols).ok());
      for (int64_t r = 0; r < n_rows; ++r) {
        const float* xr = x + r * cols;
        float acc = 0;
        for (int64_t i = 0; i < cols; ++i) acc += wrow[i] * xr[i];
        y[r * ldy + o] = acc;
      }
    }
  });
}

// y (n_rows, w.rows) = x (n_rows, w.cols) · wᵀ.
void Model::Matmul(const WeightMatrix& w, const float* x, int64_t n_rows, float* y) {
  if (ref_path_) {
    ref_rows_.resize(static_cast<size_t>(pool_->size() * w.cols()));
    MatmulSource(*source_.at(&w), x, n_rows, y, w.rows());
    return;
  }
  QuantizeInput(x, n_rows, w.cols());
  MatmulQuantized(w, n_rows, y);
}

// out (n, n_head*hd): causal attention of the batch's q rows, row t at position row_pos_[t]
// over its own cache row_kv_[t] (positions up to row_pos_[t] are written for this layer).
// Reference path: exact softmax per head, scalar.
void Model::AttentionRef(int64_t layer, int64_t n, const float* q, float* out) {
  const ModelConfig& c = cfg_;
  const int64_t hd = c.head_dim, group = c.n_head / c.n_head_kv, q_dim = c.n_head * hd;
  const bool swa = c.layer_is_swa[layer] && c.sliding_window > 0;
  int64_t n_ctx = 0;
  for (int64_t t = 0; t < n; ++t) n_ctx = std::max(n_ctx, row_kv_[t]->n_ctx);
  if (att_.size() < static_cast<size_t>(pool_->size() * (n_ctx + hd)))
    att_.resize(static_cast<size_t>(pool_->size() * (n_ctx + hd)));
  pool_->ParallelFor(n * c.n_head, [&](int64_t b, int64_t e, int th) {
    float* scores = att_.data() + th * (n_ctx + hd);
    float* acc = scores + n_ctx;
    for (int64_t job = b; job < e; ++job) {
      const int64_t t = job / c.n_head, h = job % c.n_head, kh = h / group;
      const KvCache& kv = *row_kv_[t];
      const uint16_t* K = kv.k[layer].data();
      const uint16_t* V = kv.v[layer].data();
      const int64_t p = row_pos_[t];
      const int64_t lo = swa ? std::max<int64_t>(0, p - c.sliding_window + 1) : 0;
      const float* qv = q + t * q_dim + h * hd;
      for (int64_t j = lo; j <= p; ++j) {
        const uint16_t* kr = K + j * kv.kv_dim + kh * hd;
        float s = 0;
        for (int64_t i = 0; i < hd; ++i) s += qv[i] * Bf16ToF32(kr[i]);
        scores[j - lo] = s * c.attn_scale;
      }
      ref::Softmax(scores, p - lo + 1);
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

// Fast path: the rows of each sequence are cut into chunks of consecutive positions, and one job
// per (chunk, KV head) runs every row and query head of the chunk against each K/V block once
// (kernels' attention: flash-style, online softmax, vectorized). A prefill chunk of 64 rows
// thus reads the cache 4 times instead of 64. Chunks are small enough that every thread gets
// work (a verify step of 8 rows on 2 KV heads is 4 jobs), and threads claim jobs as they go.
void Model::Attention(int64_t layer, int64_t n, const float* q, float* out) {
  constexpr int64_t kMaxChunkRows = 16;
  const ModelConfig& c = cfg_;
  const int64_t hd = c.head_dim, group = c.n_head / c.n_head_kv, q_dim = c.n_head * hd;
  const bool swa = c.layer_is_swa[layer] && c.sliding_window > 0;
  const int n_th = pool_->size();
  if (att_lo_.size() < static_cast<size_t>(n)) {
    att_lo_.resize(static_cast<size_t>(n));
    att_hi_.resize(static_cast<size_t>(n));
  }
  att_chunks_.clear();
  const int64_t min_chunks = (2 * n_th + c.n_head_kv - 1) / c.n_head_kv;
  for (int64_t t0 = 0; t0 < n;) {
    int64_t t1 = t0 + 1;  // a sequence's rows: same cache, consecutive positions
    while (t1 < n && row_kv_[t1] == row_kv_[t0] && row_pos_[t1] == row_pos_[t1 - 1] + 1) ++t1;
    const int64_t rows = t1 - t0;
    const int64_t chunks = std::max((rows + kMaxChunkRows - 1) / kMaxChunkRows, std::min(rows, min_chunks));
    for (int64_t i = 0; i < chunks; ++i) {
      const int64_t b = t0 + rows * i / chunks, e = t0 + rows * (i + 1) / chunks;
      if (e > b) att_chunks_.emplace_back(b, e - b);
    }
    t0 = t1;
  }
  int64_t max_rows = 0;
  for (const auto& ch : att_chunks_) max_rows = std::max(max_rows, ch.second);
  for (int64_t t = 0; t < n; ++t) {
    att_hi_[t] = row_pos_[t] + 1;
    att_lo_[t] = swa ? std::max<int64_t>(0, row_pos_[t] - c.sliding_window + 1) : 0;
  }
  const int64_t scratch = AttentionScratchFloats(max_rows, group, hd);
  if (att_.size() < static_cast<size_t>(n_th * scratch)) att_.resize(static_cast<size_t>(n_th * scratch));
  const int64_t jobs = static_cast<int64_t>(att_chunks_.size()) * c.n_head_kv;
  pool_->ParallelForDynamic(jobs, 1, [&](int64_t b, int64_t e, int th) {
    float* sc = att_.data() + th * scratch;
    for (int64_t job = b; job < e; ++job) {
      const auto [t0, rows] = att_chunks_[static_cast<size_t>(job / c.n_head_kv)];
      const int64_t kh = job % c.n_head_kv;
      const KvCache& kv = *row_kv_[t0];
      const AttnChunk a{q + t0 * q_dim + kh * group * hd,
                        q_dim,
                        rows,
                        group,
                        hd,
                        kv.k[layer].data() + kh * hd,
                        kv.v[layer].data() + kh * hd,
                        kv.kv_dim,
                        att_lo_.data() + t0,
                        att_hi_.data() + t0,
                        c.attn_scale,
                        out + t0 * q_dim + kh * group * hd,
                        q_dim};
      kernels_->attention(a, sc);
    }
  });
}

// Rotary embedding of row t's heads at position pos with the layer's base, using per-base
// inverse frequencies computed at load (the same float expression as ref::Rope) and one
// cos/sin per pair shared by all heads of the row.
void Model::RopeRow(float* v, int64_t n_heads, int64_t pos, bool swa) {
  const int64_t hd = cfg_.head_dim, half = hd / 2;
  const float* inv = (swa ? rope_inv_swa_ : rope_inv_).data();
  float* cs = rope_cs_.data();
  for (int64_t i = 0; i < half; ++i) {
    const float theta = static_cast<float>(pos) * inv[i];
    cs[i] = std::cos(theta);
    cs[half + i] = std::sin(theta);
  }
  for (int64_t h = 0; h < n_heads; ++h) {
    float* x = v + h * hd;
    for (int64_t i = 0; i < half; ++i) {
      const int64_t a = cfg_.rope_neox ? i : 2 * i;
      const int64_t b = cfg_.rope_neox ? i + half : 2 * i + 1;
      const float x0 = x[a], x1 = x[b], cv = cs[i], sv = cs[half + i];
      x[a] = x0 * cv - x1 * sv;
      x[b] = x0 * sv + x1 * cv;
    }
  }
}

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

Status Model::Forward(KvCache& kv, const TokenId* tokens, int64_t n, bool all_logits, float* logits) {
  const BatchSeq one{&kv, tokens, n, all_logits};
  return ForwardBatch(std::span<const BatchSeq>(&one, 1), logits);
}

// The rows of all sequences are concatenated (sequence order, then position): every matmul
// runs once over all of them, so each weight matrix is streamed once per step whatever the
// number of sequences. Row-wise ops (norms, biases, RoPE at the row's own position, KV writes
// into the row's own cache) and attention (each row against its own cache, via row_kv_ and
// row_pos_) are per row, so a row's numbers do not depend on the batch it is in.
Status Model::ForwardBatch(std::span<const BatchSeq> seqs, float* logits) {
  MR_RETURN_IF_ERROR(CheckBatch(seqs));
  const ModelConfig& c = cfg_;
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
  grow(gate_, n * c.d_ff);
  grow(up_, n * c.d_ff);
  grow(row_kv_, n);
  grow(row_pos_, n);

  {
    int64_t r = 0;
    for (const BatchSeq& s : seqs) {
      for (int64_t t = 0; t < s.n; ++t, ++r) {
        row_kv_[r] = s.kv;
        row_pos_[r] = s.kv->n_past + t;
        float* xr = x_.data() + r * d;
        if (ref_path_) {
          const gguf::TensorInfo& e = *source_.at(&w_.tok_embd);
          MR_CHECK(DequantizeRow(e.type, e.data + s.tokens[t] * e.row_bytes(), xr, d).ok());
        } else {
          DequantizeWeightRow(w_.tok_embd, s.tokens[t], xr);
        }
        if (c.embed_scale != 1.0f)
          for (int64_t i = 0; i < d; ++i) xr[i] *= c.embed_scale;
      }
    }
  }
  const GluAct act = c.act == Activation::kSilu ? GluAct::kSilu : GluAct::kGeluTanh;

  for (int64_t l = 0; l < c.n_layer; ++l) {
    const LayerWeights& L = w_.layers[l];
    for (int64_t t = 0; t < n; ++t)
      ref::RmsNorm(x_.data() + t * d, L.attn_norm.data(), d, c.rms_eps, h_.data() + t * d);
    if (ref_path_) {
      Matmul(L.wq, h_.data(), n, q_.data());
      Matmul(L.wk, h_.data(), n, k_.data());
      Matmul(L.wv, h_.data(), n, v_.data());
    } else {  // quantize the normed input once for q, k and v; one parallel op for all three
      QuantizeInput(h_.data(), n, d);
      MatmulQkv(L, n);
    }
    const bool swa = c.layer_is_swa[l];
    const float base = swa ? c.rope_base_swa : c.rope_base;
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
      if (ref_path_) {
        for (int64_t h = 0; h < c.n_head; ++h) ref::Rope(qr + h * hd, hd, pos, base, c.rope_neox);
        for (int64_t h = 0; h < c.n_head_kv; ++h) ref::Rope(kr + h * hd, hd, pos, base, c.rope_neox);
      } else {
        RopeRow(qr, c.n_head, pos, swa);
        RopeRow(kr, c.n_head_kv, pos, swa);
      }
      KvCache& kv = *row_kv_[t];
      uint16_t* kc = kv.k[l].data() + pos * kv_dim;
      uint16_t* vc = kv.v[l].data() + pos * kv_dim;
      for (int64_t i = 0; i < kv_dim; ++i) {
        kc[i] = F32ToBf16(kr[i]);
        vc[i] = F32ToBf16(vr[i]);
      }
    }
    if (ref_path_) {
      AttentionRef(l, n, q_.data(), h_.data());
    } else {
      Attention(l, n, q_.data(), h_.data());
    }
    Matmul(L.wo, h_.data(), n, tmp_.data());
    for (int64_t t = 0; t < n; ++t) {
      float* o = tmp_.data() + t * d;
      if (c.post_norms) ref::RmsNorm(o, L.post_attn_norm.data(), d, c.rms_eps, o);
      for (int64_t i = 0; i < d; ++i) x_[t * d + i] += o[i];
      ref::RmsNorm(x_.data() + t * d, L.ffn_norm.data(), d, c.rms_eps, h_.data() + t * d);
    }
    const int64_t ff = c.d_ff;
    if (ref_path_) {
      Matmul(L.w_gate, h_.data(), n, gate_.data());
      Matmul(L.w_up, h_.data(), n, up_.data());
      for (int64_t i = 0; i < n * ff; ++i) {
        const float g = gate_[i];
        gate_[i] = (c.act == Activation::kSilu ? ref::Silu(g) : ref::GeluTanh(g)) * up_[i];
      }
    } else {  // gate and up projections with the GLU, one pass
      QuantizeInput(h_.data(), n, d);
      pool_->ParallelForDynamic(L.w_gate.tiles(), TileChunk(L.w_gate.tiles()), [&](int64_t b, int64_t e, int) {
        MatmulGluTiles(*kernels_, L.w_gate, L.w_up, qa_, n, act, gate_.data(), ff, b, e);
      });
    }
    Matmul(L.w_down, gate_.data(), n, tmp_.data());
    for (int64_t t = 0; t < n; ++t) {
      float* o = tmp_.data() + t * d;
      if (c.post_norms) ref::RmsNorm(o, L.post_ffn_norm.data(), d, c.rms_eps, o);
      for (int64_t i = 0; i < d; ++i) x_[t * d + i] += o[i];
    }
  }

  // Output norm and matmul only on the rows whose logits are wanted, gathered contiguously in
  // sequence order: every row of an all_logits sequence, the last row of the others.
  {
    int64_t r = 0, o = 0;
    for (const BatchSeq& s : seqs) {
      for (int64_t t = s.all_logits ? 0 : s.n - 1; t < s.n; ++t, ++o) {
        ref::RmsNorm(x_.data() + (r + t) * d, w_.output_norm.data(), d, c.rms_eps, h_.data() + o * d);
      }
      r += s.n;
    }
  }
  const WeightMatrix& out = c.tied_embeddings ? w_.tok_embd : w_.output;
  Matmul(out, h_.data(), n_out, logits);
  for (const BatchSeq& s : seqs) s.kv->n_past += s.n;
  return Status::Ok();
}

}  // namespace mr
