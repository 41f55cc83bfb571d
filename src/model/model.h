// A loaded model: hyperparameters, weights in their fast-path formats, tokenizer, and the
// forward pass over a KV cache. Architectures (one file each: arch_llama.cpp, arch_qwen2.cpp,
// arch_gemma3.cpp) read their hyperparameters into ModelConfig; model.cpp loads the weights,
// forward.cpp runs the shared block structure over an op set (forward_ops.h: reference or
// fast), kv_cache.h holds the per-sequence cache.
//
// Thread-safety: Forward mutates the KV cache and internal workspaces: call it from one
// thread (the engine thread). The model itself is read-only after Load.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "kernels/ops.h"
#include "kernels/q8.h"
#include "kernels/weight_matrix.h"
#include "model/kv_cache.h"
#include "model/tokenizer.h"

namespace mr {
namespace gguf {
class GgufFile;
struct TensorInfo;
}  // namespace gguf
class ForwardOps;

enum class Arch { kLlama, kQwen2, kQwen3, kQwen3Moe, kPhi3, kGemma2, kGemma3, kSmolLM3, kGptOss };
// kSwigluOai: gpt-oss's clamped SwiGLU, min(g, 7) * sigmoid(1.702 * min(g, 7)) * (clamp(u, -7, 7) + 1)
// (llama.cpp's swiglu_oai), on the gate and up projections with their biases.
enum class Activation { kSilu, kGeluTanh, kSwigluOai };
// How an embedding is pooled from the output-normed final hidden states of a sequence's rows
// (llama.cpp's llama_pooling_type, same values): kNone (per-token, no embedding of the
// sequence), the mean over every row, the first row (kCls) or the last (kLast). kRank
// (rerankers' classification head) is not supported.
enum class Pooling { kNone = 0, kMean = 1, kCls = 2, kLast = 3 };
const char* PoolingName(Pooling p);  // "none", "mean", "cls", "last"

struct ModelConfig {
  Arch arch = Arch::kLlama;
  std::string arch_name;
  int64_t n_layer = 0;
  int64_t d_model = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  int64_t d_ff = 0;
  int64_t n_vocab = 0;
  int64_t n_ctx_train = 0;
  float rms_eps = 1e-5f;
  float rope_base = 10000.0f;      // global layers
  float rope_base_swa = 10000.0f;  // sliding-window layers (gemma3)
  bool rope_neox = false;          // rotate (i, i+d/2) pairs instead of (2i, 2i+1)
  // Per-pair factors dividing each pair's frequency: Llama 3.x's rope_freqs.weight, or those that
  // linear and YaRN rope scaling come to (arch_common.cpp); empty when there are none.
  std::vector<float> rope_freq_factors;
  int64_t sliding_window = 0;       // 0: none
  std::vector<bool> layer_is_swa;   // per layer
  std::vector<bool> layer_no_rope;  // per layer: no rotary embedding (smollm3's NoPE layers)
  float attn_scale = 0.0f;          // multiplies q·k (YaRN's magnitude scale, squared, included)
  float rope_mscale = 1.0f;         // YaRN: cos and sin times this (folded into attn_scale at load)
  bool rope_yarn = false;           // the rope scaling metadata is YaRN's
  // Whether sliding-window layers use rope_freq_factors too: llama.cpp scales their RoPE only
  // where the architecture copies its scaling to them (gemma2, gpt-oss), not gemma3's.
  bool rope_factors_swa = false;
  float embed_scale = 1.0f;  // gemma2, gemma3: sqrt(d_model)
  // gemma2's logit soft-capping (c * tanh(x / c)) of the scaled attention scores and of the
  // output logits; 0: none.
  float attn_softcap = 0.0f;
  float final_softcap = 0.0f;
  bool qkv_bias = false;       // qwen2
  bool qk_norm = false;        // gemma3, qwen3: RMSNorm over each q/k head
  bool post_norms = false;     // gemma3: norms after attention and FFN outputs
  bool attn_out_bias = false;  // gpt-oss: attn_output.bias
  // gpt-oss: one learned logit per query head (attn_sinks.weight) joins each softmax's
  // denominator as a position every row sees and whose value is zero.
  bool attn_sinks = false;
  Activation act = Activation::kSilu;
  bool tied_embeddings = false;
  // Mixture of experts (qwen3moe): n_expert > 0 replaces each block's FFN by n_expert expert FFNs
  // of width d_ff_expert, of which a router picks n_expert_used per row (softmax over all
  // experts, the top n_expert_used, their probabilities renormalized to sum to 1).
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;
  int64_t d_ff_expert = 0;
  // gpt-oss: the router has a bias; the top n_expert_used are picked on the router's logits and
  // their weights are the softmax over those logits only (llama.cpp's SOFTMAX_WEIGHT gating);
  // each expert's gate, up and down projections have biases.
  bool moe_softmax_weight = false;
  bool moe_biases = false;
  // Activation roles (ActRole) read as two int8 rows by default on this architecture, on top of
  // the process default (kActArch): gpt-oss's expert inputs, where int8 alone left the fast path
  // further from the exact arithmetic than llama.cpp (docs/models.md).
  uint8_t arch_fine_acts = 0;
  // The file's `{arch}.pooling_type` (embedding models: Qwen3-Embedding says kLast); kNone when
  // absent, as in every generative model's file.
  Pooling pooling = Pooling::kNone;
};

struct LayerWeights {
  std::vector<float> attn_norm, ffn_norm;            // (d_model)
  std::vector<float> post_attn_norm, post_ffn_norm;  // gemma3 (d_model)
  std::vector<float> q_norm, k_norm;                 // gemma3 (head_dim)
  std::vector<float> bq, bk, bv;                     // qwen2 biases
  std::vector<float> bo;                             // gpt-oss: attention output bias (d_model)
  std::vector<float> sinks;                          // gpt-oss: attention sink logits (n_head)
  WeightMatrix wq, wk, wv, wo;                       // (n_head*hd, d) (n_kv*hd, d) (n_kv*hd, d) (d, n_head*hd)
  WeightMatrix w_gate, w_up, w_down;                 // (ff, d) (ff, d) (d, ff); gate and up share a format
  // Mixture of experts: the router (n_expert, d) in FP32 and each expert's FFN (as above, width
  // d_ff_expert); empty in dense models.
  std::vector<float> router;
  std::vector<WeightMatrix> exp_gate, exp_up, exp_down;
  // gpt-oss: the router's bias (n_expert) and the experts' (n_expert, d_ff_expert) gate and up
  // and (n_expert, d_model) down biases.
  std::vector<float> router_b, exp_gate_b, exp_up_b, exp_down_b;
};

struct ModelWeights {
  WeightMatrix tok_embd;  // (n_vocab, d_model); rows are dequantized on lookup
  std::vector<float> output_norm;
  WeightMatrix output;  // (n_vocab, d_model); empty when tied (tok_embd is used)
  std::vector<LayerWeights> layers;
};

// Fast-path weight formats. kNative: Q4_K and Q6_K tensors keep the file's words (kquant.h),
// other types are converted to Q8/g64; kQ8G64: every matrix is converted to Q8/g64.
enum class WeightMode { kNative, kQ8G64 };
// kNative unless SetDefaultWeightMode chose another (app/ maps MERERUN_WEIGHTS onto it).
WeightMode DefaultWeightMode();
void SetDefaultWeightMode(WeightMode m);
// "native" or "q8g64" (WeightModeName's names); false for anything else.
bool ParseWeightMode(const std::string& name, WeightMode* m);
// The reference path for every load (app/ maps MERERUN_PATH=ref onto it); false by default.
bool DefaultReferencePath();
void SetDefaultReferencePath(bool ref);
const char* WeightModeName(WeightMode m);  // "native" or "q8g64"

// Activation precision of the fast path, by matrix role. Every integer matrix (all but F16 /
// BF16, which read FP32) reads its input quantized to int8 per kActGroup inputs. A role in the
// "fine" set reads it as two int8 rows instead: the int8 row and the int8 quantization of what it
// left over (x = s·q + s'·q' + e, s' <= s/254, about 15 bits), the two rows run through the same
// weight loads and summed. One row costs little more (decode is bound by the weight stream); 8
// verify rows cost up to twice the arithmetic on the roles chosen.
enum ActRole : uint8_t {
  kActQkv = 1,      // q, k, v projections (input: the normed hidden state)
  kActO = 2,        // attention output projection
  kActGlu = 4,      // gate and up projections (dense and experts)
  kActDown = 8,     // down projection (input: the GLU's output, where outliers live)
  kActLogits = 16,  // output projection
  // Not a second row: after the output projection, each row's kTopLogits highest logits are
  // recomputed exactly (FP32 hidden state against the dequantized weight rows), so the tokens
  // that carry the probability mass get the reference path's logits; the tail keeps int8's.
  kActTop = 32,
  // Not a role: in the default set, "and the architecture's own (ModelConfig::arch_fine_acts)".
  // An explicit set (MERERUN_ACTS, ParseFineActs) never has it, so it is taken exactly.
  kActArch = 64
};
// "fine": every input as two rows (the top logits are then already as good as exact).
constexpr uint8_t kActFineRoles = kActQkv | kActO | kActGlu | kActDown | kActLogits;
constexpr uint8_t kActAllRoles = kActFineRoles | kActTop;
constexpr int kTopLogits = 256;
// The default set unless SetDefaultFineActs chose another (app/ maps MERERUN_ACTS onto it):
// qkv + o + top, chosen by measurement (docs/performance.md, stop 20). With every role on int8
// the fast path was further from the exact arithmetic than llama.cpp on the same file (SmolLM2
// Q4_1: KL 0.0090 against llama.cpp's 0.0050, top-1 0.947 against 0.962). The attention
// projections' input (the normed hidden state, with its outlier channels) as two rows and the
// top logits recomputed exactly bring every catalog model under llama.cpp's distance for ~1/8
// more integer work in prefill and verify; `down` would do as well but costs a third more.
// Plus kActArch: each architecture's own additions (ModelConfig::arch_fine_acts).
uint8_t DefaultFineActs();
void SetDefaultFineActs(uint8_t roles);
// "int8" (no role), "fine" (kActFineRoles) or a '+' list of qkv, o, glu, down, logits, top; false
// for anything else.
bool ParseFineActs(const std::string& name, uint8_t* roles);
std::string FineActsName(uint8_t roles);  // the canonical spelling ParseFineActs accepts

struct LoadOptions {
  int n_threads = 0;  // 0: ThreadPool::DefaultThreads()
  // Reference path (MERERUN_PATH=ref sets it): FP32 activations against the GGUF weights
  // dequantized from their stored type, no Q8/g64 conversion in the loop. Slow; the oracle.
  bool ref_path = false;
  CpuVariant cpu = SelectedCpuVariant();
  WeightMode weights = DefaultWeightMode();
  uint8_t fine_acts = DefaultFineActs();  // ActRole set read as two int8 rows
  // Metadata, hyperparameters and tokenizer only, no weights (weight_bytes() 0): for what only
  // tokenizes or renders (the fuzz targets). Forward and ForwardBatch refuse such a model.
  bool vocab_only = false;
};

class Model {
 public:
  static Result<std::unique_ptr<Model>> Load(const std::string& path, const LoadOptions& opts);
  ~Model();

  const ModelConfig& config() const { return cfg_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const gguf::GgufFile& file() const { return *file_; }
  size_t weight_bytes() const;  // bytes of fast-path weights read per token (their own formats)
  int64_t native_matrices() const { return n_native_; }  // matrices kept in a native K-quant format
  bool ref_path() const { return ref_path_; }
  bool vocab_only() const { return vocab_only_; }  // LoadOptions::vocab_only
  CpuVariant cpu_variant() const { return kernels_->variant; }
  int n_threads() const { return pool_->size(); }
  WeightMode weight_mode() const { return native_weights_ ? WeightMode::kNative : WeightMode::kQ8G64; }
  uint8_t fine_acts() const { return fine_acts_; }  // LoadOptions::fine_acts (fast path only)

  KvCache NewKvCache(int64_t n_ctx) const;

  // Run tokens[0..n) at positions kv.n_past .. kv.n_past+n-1, appending to the cache.
  // logits: if all_logits, (n, n_vocab) for every row; else (n_vocab) for the last row.
  // Fails (without touching the cache) when the context would overflow. ForwardBatch of one,
  // run in passes of at most kForwardChunk rows, so the workspaces (which grow with the rows of
  // a pass) stay bounded however long the prompt; the numbers are the same as in one pass.
  // hidden (optional): the output-normed final hidden state of every row, (n, d_model): what
  // embeddings pool (llama.cpp's "result_norm"), the input of the logits matmul.
  Status Forward(KvCache& kv, const TokenId* tokens, int64_t n, bool all_logits, float* logits,
                 float* hidden = nullptr);
  static constexpr int64_t kForwardChunk = 512;

  // Several sequences in one pass (batched decode, prefill chunks and verify rows together):
  // every weight matrix is applied once to the rows of all sequences. seqs[i] runs
  // tokens[0..n) at its cache's positions n_past.., as Forward would; the caches must be
  // distinct. logits: for each sequence in order, n rows (all_logits) or its last row, each
  // n_vocab wide. Fails without touching any cache when seqs is empty, a kv is null or
  // repeated, n <= 0, a cache would overflow or a token is out of range. Same numbers as
  // calling Forward per sequence (per-row arithmetic does not depend on the batch).
  struct BatchSeq {
    KvCache* kv = nullptr;
    const TokenId* tokens = nullptr;
    int64_t n = 0;
    bool all_logits = false;
    float* hidden = nullptr;  // optional: each row's output-normed hidden state, (n, d_model)
  };
  Status ForwardBatch(std::span<const BatchSeq> seqs, float* logits);

 private:
  Model();
  Status LoadWeights();
  void MarkFineActs();  // sets WeightMatrix::fine_acts by role from fine_acts_
  Status LoadMatrix(const std::string& name, int64_t rows, int64_t cols, bool allow_native, WeightMatrix* out);
  Status LoadMatrixFrom(const gguf::TensorInfo& t, bool allow_native, WeightMatrix* out);
  const gguf::TensorInfo& RowView(const gguf::TensorInfo& t, const std::string& name, int64_t row0, int64_t rows);
  Status LoadExperts(const std::string& name, int64_t rows, int64_t cols, bool allow_native,
                     std::vector<WeightMatrix>* out);
  Status CheckBatch(std::span<const BatchSeq> seqs) const;
  // ForwardBatch after CheckBatch; logits == nullptr skips the output norm and matmul.
  void RunBatch(std::span<const BatchSeq> seqs, float* logits);
  // out (n, d_model) = the mixture-of-experts FFN of the normed rows x (n, d_model).
  void MoeFfn(const LayerWeights& L, const float* x, int64_t n, float* out);

  ModelConfig cfg_;
  ModelWeights w_;
  std::unique_ptr<gguf::GgufFile> file_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ThreadPool> pool_;
  bool ref_path_ = false;
  bool vocab_only_ = false;
  const KernelTable* kernels_ = nullptr;
  std::unique_ptr<ForwardOps> ops_;  // the reference or the fast op set (forward_ops.h)
  // Workspaces of the shared block structure (forward.cpp), grown on demand.
  std::vector<float> x_, h_, q_, k_, v_, gate_, tmp_;
  // Mixture-of-experts workspaces: router probabilities, each expert's rows and weights, the
  // gathered rows and their outputs.
  std::vector<float> moe_probs_, moe_x_, moe_g_, moe_u_, moe_y_;
  std::vector<std::vector<std::pair<int64_t, float>>> moe_rows_;
  std::vector<int64_t> moe_order_;
  std::vector<KvCache*> row_kv_;  // (rows) the cache of each row of the batch
  std::vector<int64_t> row_pos_;  // (rows) its position in that cache
  std::unordered_map<const WeightMatrix*, const gguf::TensorInfo*> source_;  // GGUF tensor of each matrix
  // Row ranges of GGUF tensors loaded as matrices of their own (experts of a 3-D tensor, phi3's
  // fused q/k/v and gate/up); the reference path reads them as tensors.
  std::vector<std::unique_ptr<gguf::TensorInfo>> tensor_views_;
  bool native_weights_ = true;  // LoadOptions::weights == kNative
  uint8_t fine_acts_ = 0;       // LoadOptions::fine_acts; 0 on the reference path
  int64_t n_native_ = 0;        // matrices in a native K-quant format (their kernels read activation sums)
};

// Architecture hyperparameter readers (one file each).
Status ReadLlamaConfig(const gguf::GgufFile& f, ModelConfig* cfg);
Status ReadSmolLM3Config(const gguf::GgufFile& f, ModelConfig* cfg);
Status ReadQwen2Config(const gguf::GgufFile& f, ModelConfig* cfg);
Status ReadQwen3Config(const gguf::GgufFile& f, ModelConfig* cfg);
Status ReadQwen3MoeConfig(const gguf::GgufFile& f, ModelConfig* cfg);
Status ReadPhi3Config(const gguf::GgufFile& f, ModelConfig* cfg);
Status ReadGemma2Config(const gguf::GgufFile& f, ModelConfig* cfg);
Status ReadGemma3Config(const gguf::GgufFile& f, ModelConfig* cfg);
Status ReadGptOssConfig(const gguf::GgufFile& f, ModelConfig* cfg);
// Common keys shared by all architectures ({arch}.block_count, ...).
Status ReadCommonConfig(const gguf::GgufFile& f, const std::string& arch, ModelConfig* cfg);
// Checked metadata readers for the architecture files (arch_common.cpp). A missing key takes
// `def` (an error when there is none); a value of another type or out of range is an error
// naming the key. Floats must be finite (as a float) and in (0, hi].
Status ReadIntKey(const gguf::GgufFile& f, const std::string& key, int64_t lo, int64_t hi, std::optional<int64_t> def,
                  int64_t* out);
Status ReadPositiveFloatKey(const gguf::GgufFile& f, const std::string& key, double def, double hi, float* out);
// Bound on context_length and sliding_window (16M positions; released models use <= 1M).
inline constexpr int64_t kMaxContextLength = int64_t{1} << 24;

}  // namespace mr
