// Hyperparameters every architecture shares, from {arch}.* GGUF keys.
#include <cmath>

#include "model/gguf.h"
#include "model/model.h"

namespace mr {

Status ReadCommonConfig(const gguf::GgufFile& f, const std::string& arch, ModelConfig* cfg) {
  auto need = [&](const char* key, int64_t* out) -> Status {
    auto v = f.GetInt(arch + "." + key);
    if (!v || *v <= 0) return InvalidArgument("[model] missing or invalid metadata key '" + arch + "." + key + "'");
    *out = *v;
    return Status::Ok();
  };
  cfg->arch_name = arch;
  MR_RETURN_IF_ERROR(need("block_count", &cfg->n_layer));
  MR_RETURN_IF_ERROR(need("embedding_length", &cfg->d_model));
  MR_RETURN_IF_ERROR(need("feed_forward_length", &cfg->d_ff));
  MR_RETURN_IF_ERROR(need("attention.head_count", &cfg->n_head));
  cfg->n_head_kv = f.GetInt(arch + ".attention.head_count_kv").value_or(cfg->n_head);
  cfg->n_ctx_train = f.GetInt(arch + ".context_length").value_or(2048);
  cfg->head_dim = f.GetInt(arch + ".attention.key_length").value_or(cfg->d_model / cfg->n_head);
  const int64_t v_len = f.GetInt(arch + ".attention.value_length").value_or(cfg->head_dim);
  if (v_len != cfg->head_dim) return Unsupported("[model] key_length != value_length is not supported");
  cfg->rms_eps = static_cast<float>(f.GetFloat(arch + ".attention.layer_norm_rms_epsilon").value_or(1e-5));
  cfg->rope_base = static_cast<float>(f.GetFloat(arch + ".rope.freq_base").value_or(10000.0));
  cfg->rope_base_swa = cfg->rope_base;
  if (auto rope_dims = f.GetInt(arch + ".rope.dimension_count"); rope_dims && *rope_dims != cfg->head_dim) {
    return Unsupported("[model] partial rotary embeddings (rope.dimension_count " + std::to_string(*rope_dims) +
                       " != head dim " + std::to_string(cfg->head_dim) + ") are not supported");
  }
  if (auto scaling = f.GetString(arch + ".rope.scaling.type"); scaling && *scaling != "none") {
    auto factor = f.GetFloat(arch + ".rope.scaling.factor");
    if (factor && *factor != 1.0) return Unsupported("[model] rope scaling '" + *scaling + "' is not supported");
  }
  if (cfg->n_head % cfg->n_head_kv != 0) {
    return InvalidArgument("[model] head_count " + std::to_string(cfg->n_head) + " is not a multiple of head_count_kv " +
                           std::to_string(cfg->n_head_kv));
  }
  const auto* tokens = f.GetStringArray("tokenizer.ggml.tokens");
  if (!tokens || tokens->empty()) return InvalidArgument("[model] missing tokenizer.ggml.tokens");
  cfg->n_vocab = static_cast<int64_t>(tokens->size());
  cfg->attn_scale = 1.0f / std::sqrt(static_cast<float>(cfg->head_dim));
  cfg->layer_is_swa.assign(cfg->n_layer, false);
  return Status::Ok();
}

}  // namespace mr
