// Hyperparameters every architecture shares, from {arch}.* GGUF keys. Model files come from
// anywhere, so every value is range-checked here, before anything is sized or divided by it:
// a bad one is a load error naming the key, never a division by zero or a huge allocation.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

#include "model/gguf.h"
#include "model/model.h"

namespace mr {
namespace {

// Far above every released model, low enough that products of these values (q_dim =
// head_count * head_dim, n_layer * tensors per layer) cannot overflow and that what is sized
// from them before the tensors are checked (the layer table, the RoPE tables) stays small.
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxWidth = int64_t{1} << 20;  // embedding_length, feed_forward_length
constexpr int64_t kMaxHeads = 4096;
constexpr int64_t kMaxHeadDim = 4096;

std::string Num(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

// A finite number in [lo, hi] ((lo, hi] when lo_exclusive), `def` when absent.
Status ReadFloatKey(const gguf::GgufFile& f, const std::string& key, double lo, double hi, bool lo_exclusive,
                    double def, float* out) {
  const gguf::MetaValue* v = f.Find(key);
  if (v == nullptr) {
    *out = static_cast<float>(def);
    return Status::Ok();
  }
  const std::optional<double> x = f.GetFloat(key);
  if (!x) {
    return InvalidArgument("[model] metadata key '" + key + "': got a " + std::string(gguf::ValueTypeName(v->type)) +
                           ", expected a number");
  }
  // The value is used as a float: one that is finite only as a double is out of range too.
  const float xf = static_cast<float>(*x);
  const double y = xf;  // a double that rounds to 0 as a float is 0
  if (!std::isfinite(xf) || y < lo || (lo_exclusive && y == lo) || y > hi) {
    return InvalidArgument("[model] metadata key '" + key + "': got " + Num(*x) + ", expected a finite number in " +
                           (lo_exclusive ? "(" : "[") + Num(lo) + ", " + Num(hi) + "]");
  }
  *out = xf;
  return Status::Ok();
}

}  // namespace

namespace {

// Rope scaling as llama.cpp applies it (ggml_rope_ext with its context's YaRN parameters): a
// factor F > 1 stretches the positions. "linear": every pair's frequency divided by F. "yarn":
// pair i's angle mixes the interpolated one (divided by F) and the original by a ramp that is 1
// (original) for the fast pairs, whose wavelength fits beta_fast = 32 times into the original
// context, 0 for the slow ones (beta_slow = 1), linear between; and cos / sin are multiplied by
// 1 + 0.1 ln F when F > 1: llama.cpp cancels its own get_mscale against that term, so that is what
// remains. rope.scaling.attn_factor multiplies cos / sin whatever the type (the only magnitude
// scale of "linear" and "none"). Both are per-pair factors of a frequency (rope_freq_factors: the
// mix is linear in the position), and the magnitude scale, applied to q and k alike, is
// rope_mscale (Model::Load folds its square into attn_scale). Sliding-window layers keep their
// RoPE unscaled unless the architecture says otherwise (rope_factors_swa), as llama.cpp's
// rope_freq_scale_train_swa defaults to 1. A factor of 0 means none, as in llama.cpp. llama.cpp
// reads the yarn_beta_* / yarn_ext_factor keys only for a few architectures (grok, mistral3), not
// for these, so they are not read here either.
Status ReadRopeScaling(const gguf::GgufFile& f, const std::string& p, ModelConfig* cfg) {
  float factor = 1.0f;
  const std::string factor_key =
      f.Find(p + "rope.scaling.factor") == nullptr && f.Find(p + "rope.scale_linear") != nullptr
          ? p + "rope.scale_linear"
          : p + "rope.scaling.factor";
  if (const auto v = f.GetFloat(factor_key); !(v && *v == 0.0)) {
    MR_RETURN_IF_ERROR(ReadPositiveFloatKey(f, factor_key, 1.0, 1e6, &factor));
  }
  const gguf::MetaValue* type_value = f.Find(p + "rope.scaling.type");
  if (type_value != nullptr && !f.GetString(p + "rope.scaling.type")) {
    return InvalidArgument("[model] metadata key '" + p + "rope.scaling.type': got a " +
                           gguf::ValueTypeName(type_value->type) + ", expected a string");
  }
  const std::string type = f.GetString(p + "rope.scaling.type").value_or("linear");
  float attn_factor = 1.0f;
  MR_RETURN_IF_ERROR(ReadPositiveFloatKey(f, p + "rope.scaling.attn_factor", 1.0, 1e6, &attn_factor));
  cfg->rope_mscale = attn_factor;
  if (type == "none" || factor == 1.0f) return Status::Ok();
  const int64_t half = cfg->head_dim / 2;
  if (type == "linear") {
    cfg->rope_freq_factors.assign(static_cast<size_t>(half), factor);
    return Status::Ok();
  }
  if (type != "yarn") {
    return Unsupported("[model] metadata key '" + p + "rope.scaling.type': rope scaling '" + type +
                       "' is not supported (supported: none, linear, yarn)");
  }
  int64_t orig_ctx = 0;
  MR_RETURN_IF_ERROR(
      ReadIntKey(f, p + "rope.scaling.original_context_length", 1, kMaxContextLength, cfg->n_ctx_train, &orig_ctx));
  constexpr float kBetaFast = 32.0f, kBetaSlow = 1.0f, kPi = 3.14159265358979323846f;
  const float n_dims = static_cast<float>(cfg->head_dim);
  // The pair index at which a pair's wavelength fits n_rot times into the original context.
  auto corr_dim = [&](float n_rot) {
    return n_dims * std::log(static_cast<float>(orig_ctx) / (n_rot * 2 * kPi)) / (2 * std::log(cfg->rope_base));
  };
  const float low = std::max(0.0f, std::floor(corr_dim(kBetaFast)));
  const float high = std::min(n_dims - 1, std::ceil(corr_dim(kBetaSlow)));
  const float freq_scale = 1.0f / factor;
  cfg->rope_freq_factors.resize(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float y = (static_cast<float>(i) - low) / std::max(0.001f, high - low);
    const float mix = 1 - std::min(1.0f, std::max(0.0f, y));
    cfg->rope_freq_factors[static_cast<size_t>(i)] = 1.0f / (freq_scale * (1 - mix) + mix);
  }
  if (factor > 1.0f) cfg->rope_mscale = attn_factor * (1.0f + 0.1f * std::log(factor));
  cfg->rope_yarn = true;
  return Status::Ok();
}

}  // namespace

Status ReadIntKey(const gguf::GgufFile& f, const std::string& key, int64_t lo, int64_t hi, std::optional<int64_t> def,
                  int64_t* out) {
  const gguf::MetaValue* v = f.Find(key);
  if (v == nullptr) {
    if (!def) return InvalidArgument("[model] missing metadata key '" + key + "'");
    *out = *def;
    return Status::Ok();
  }
  if (!v->is_integer()) {
    return InvalidArgument("[model] metadata key '" + key + "': got a " + gguf::ValueTypeName(v->type) +
                           ", expected an integer");
  }
  const bool huge = v->type == gguf::ValueType::kU64 && v->u > static_cast<uint64_t>(INT64_MAX);
  if (huge || v->i < lo || v->i > hi) {
    return InvalidArgument("[model] metadata key '" + key + "': got " +
                           (huge ? std::to_string(v->u) : std::to_string(v->i)) + ", expected " + std::to_string(lo) +
                           ".." + std::to_string(hi));
  }
  *out = v->i;
  return Status::Ok();
}

Status ReadPositiveFloatKey(const gguf::GgufFile& f, const std::string& key, double def, double hi, float* out) {
  return ReadFloatKey(f, key, 0.0, hi, /*lo_exclusive=*/true, def, out);
}

const char* PoolingName(Pooling p) {
  switch (p) {
    case Pooling::kMean:
      return "mean";
    case Pooling::kCls:
      return "cls";
    case Pooling::kLast:
      return "last";
    case Pooling::kNone:
      break;
  }
  return "none";
}

Status ReadCommonConfig(const gguf::GgufFile& f, const std::string& arch, ModelConfig* cfg) {
  const std::string p = arch + ".";
  cfg->arch_name = arch;
  MR_RETURN_IF_ERROR(ReadIntKey(f, p + "block_count", 1, kMaxLayers, std::nullopt, &cfg->n_layer));
  MR_RETURN_IF_ERROR(ReadIntKey(f, p + "embedding_length", 1, kMaxWidth, std::nullopt, &cfg->d_model));
  MR_RETURN_IF_ERROR(ReadIntKey(f, p + "feed_forward_length", 1, kMaxWidth, std::nullopt, &cfg->d_ff));
  MR_RETURN_IF_ERROR(ReadIntKey(f, p + "attention.head_count", 1, kMaxHeads, std::nullopt, &cfg->n_head));
  // Grouped-query attention: each KV head serves n_head / n_head_kv query heads.
  MR_RETURN_IF_ERROR(ReadIntKey(f, p + "attention.head_count_kv", 1, cfg->n_head, cfg->n_head, &cfg->n_head_kv));
  if (cfg->n_head % cfg->n_head_kv != 0) {
    return InvalidArgument("[model] metadata key '" + p + "attention.head_count_kv': got " +
                           std::to_string(cfg->n_head_kv) + ", expected a divisor of head_count " +
                           std::to_string(cfg->n_head));
  }
  MR_RETURN_IF_ERROR(ReadIntKey(f, p + "context_length", 1, kMaxContextLength, 2048, &cfg->n_ctx_train));
  if (f.Find(p + "attention.key_length") == nullptr && cfg->d_model % cfg->n_head != 0) {
    return InvalidArgument("[model] metadata key '" + p + "embedding_length': got " + std::to_string(cfg->d_model) +
                           ", expected a multiple of head_count " + std::to_string(cfg->n_head) +
                           " (no attention.key_length gives the head size)");
  }
  MR_RETURN_IF_ERROR(
      ReadIntKey(f, p + "attention.key_length", 1, kMaxHeadDim, cfg->d_model / cfg->n_head, &cfg->head_dim));
  // RoPE rotates pairs of dimensions within a head.
  if (cfg->head_dim % 2 != 0) {
    return InvalidArgument("[model] head size (metadata key '" + p +
                           "attention.key_length' or embedding_length / head_count): got " +
                           std::to_string(cfg->head_dim) + ", expected an even number");
  }
  int64_t v_len = 0;
  MR_RETURN_IF_ERROR(ReadIntKey(f, p + "attention.value_length", 1, kMaxHeadDim, cfg->head_dim, &v_len));
  if (v_len != cfg->head_dim) return Unsupported("[model] key_length != value_length is not supported");
  MR_RETURN_IF_ERROR(ReadPositiveFloatKey(f, p + "attention.layer_norm_rms_epsilon", 1e-5, 1.0, &cfg->rms_eps));
  MR_RETURN_IF_ERROR(ReadPositiveFloatKey(f, p + "rope.freq_base", 10000.0, 1e30, &cfg->rope_base));
  cfg->rope_base_swa = cfg->rope_base;
  if (auto rope_dims = f.GetInt(p + "rope.dimension_count"); rope_dims && *rope_dims != cfg->head_dim) {
    return Unsupported("[model] partial rotary embeddings (rope.dimension_count " + std::to_string(*rope_dims) +
                       " != head dim " + std::to_string(cfg->head_dim) + ") are not supported");
  }
  MR_RETURN_IF_ERROR(ReadRopeScaling(f, p, cfg));
  int64_t pooling = 0;
  MR_RETURN_IF_ERROR(ReadIntKey(f, p + "pooling_type", 0, 4, 0, &pooling));
  if (pooling == 4)
    return Unsupported("[model] metadata key '" + p + "pooling_type': 4 (rank, a reranker's head) is not supported");
  cfg->pooling = static_cast<Pooling>(pooling);
  const auto* tokens = f.GetStringArray("tokenizer.ggml.tokens");
  if (!tokens || tokens->empty()) return InvalidArgument("[model] missing tokenizer.ggml.tokens");
  if (tokens->size() > static_cast<size_t>(INT32_MAX)) {
    return InvalidArgument("[model] metadata key 'tokenizer.ggml.tokens': " + std::to_string(tokens->size()) +
                           " tokens, expected at most " + std::to_string(INT32_MAX));
  }
  cfg->n_vocab = static_cast<int64_t>(tokens->size());
  // Sampling defaults the file may carry (read by ModelDefaultSampling): a NaN temperature
  // would make every probability NaN.
  float unused = 0.0f;
  MR_RETURN_IF_ERROR(ReadFloatKey(f, "general.sampling.temp", 0.0, 1e6, false, 0.0, &unused));
  MR_RETURN_IF_ERROR(ReadFloatKey(f, "general.sampling.top_p", 0.0, 1.0, false, 0.0, &unused));
  MR_RETURN_IF_ERROR(ReadFloatKey(f, "general.sampling.min_p", 0.0, 1.0, false, 0.0, &unused));
  int64_t top_k = 0;
  MR_RETURN_IF_ERROR(ReadIntKey(f, "general.sampling.top_k", 0, INT32_MAX, 0, &top_k));
  cfg->attn_scale = 1.0f / std::sqrt(static_cast<float>(cfg->head_dim));
  cfg->layer_is_swa.assign(cfg->n_layer, false);
  cfg->layer_no_rope.assign(cfg->n_layer, false);
  return Status::Ok();
}

}  // namespace mr
