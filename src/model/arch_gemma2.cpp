// gemma2: as gemma3 (embeddings scaled by sqrt(d_model), RMSNorm with the stored 1 + w, pre- and
// post-norms around attention and FFN, GeGLU with tanh-GELU, NeoX rotary embeddings) without
// QK-norm, plus logit soft-capping: each scaled attention score s becomes c * tanh(s / c)
// (attn_logit_softcapping, 50 by default) and so does each output logit
// (final_logit_softcapping, 30). Sliding-window and global layers alternate (layer 0 slides;
// window 4096 by default) and share one RoPE base. q is scaled by 1/sqrt(head_dim), or
// 1/sqrt(d_model / n_head) on the 27B (query_pre_attn_scalar), as llama.cpp does.
#include <cmath>

#include "model/gguf.h"
#include "model/model.h"

namespace mr {

Status ReadGemma2Config(const gguf::GgufFile& f, ModelConfig* cfg) {
  MR_RETURN_IF_ERROR(ReadCommonConfig(f, "gemma2", cfg));
  cfg->arch = Arch::kGemma2;
  cfg->rope_neox = true;
  cfg->rope_factors_swa = true;  // llama.cpp's gemma2 copies the scaling to its sliding layers
  cfg->post_norms = true;
  cfg->act = Activation::kGeluTanh;
  cfg->embed_scale = std::sqrt(static_cast<float>(cfg->d_model));
  MR_RETURN_IF_ERROR(ReadPositiveFloatKey(f, "gemma2.attention.layer_norm_rms_epsilon", 1e-6, 1.0, &cfg->rms_eps));
  MR_RETURN_IF_ERROR(
      ReadIntKey(f, "gemma2.attention.sliding_window", 0, kMaxContextLength, 4096, &cfg->sliding_window));
  MR_RETURN_IF_ERROR(ReadPositiveFloatKey(f, "gemma2.attn_logit_softcapping", 50.0, 1e6, &cfg->attn_softcap));
  MR_RETURN_IF_ERROR(ReadPositiveFloatKey(f, "gemma2.final_logit_softcapping", 30.0, 1e6, &cfg->final_softcap));
  for (int64_t l = 0; l < cfg->n_layer; ++l) cfg->layer_is_swa[l] = l % 2 == 0;
  if (cfg->n_layer == 46 && cfg->d_model / cfg->n_head != cfg->head_dim) {  // 27B
    cfg->attn_scale = 1.0f / std::sqrt(static_cast<float>(cfg->d_model / cfg->n_head));
  }
  return Status::Ok();
}

}  // namespace mr
