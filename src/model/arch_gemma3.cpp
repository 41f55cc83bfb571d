// gemma3: embeddings scaled by sqrt(d_model); RMSNorm with (1 + w) — the GGUF converter
// stores 1 + w, so the loader uses the stored weight as is; pre- and post-norms around
// attention and FFN; RMSNorm over each q and k head (QK-norm); GeGLU with tanh-GELU; NeoX
// rotary embeddings; interleaved sliding-window and global layers (every 6th layer is global)
// with their own RoPE bases (local 10,000; global from metadata); q scaled by
// 1/sqrt(head_dim) (query_pre_attn_scalar = head_dim for the released sizes below 27B).
#include <cmath>

#include "model/gguf.h"
#include "model/model.h"

namespace mr {

Status ReadGemma3Config(const gguf::GgufFile& f, ModelConfig* cfg) {
  MR_RETURN_IF_ERROR(ReadCommonConfig(f, "gemma3", cfg));
  cfg->arch = Arch::kGemma3;
  cfg->rope_neox = true;
  cfg->qk_norm = true;
  cfg->post_norms = true;
  cfg->act = Activation::kGeluTanh;
  cfg->embed_scale = std::sqrt(static_cast<float>(cfg->d_model));
  MR_RETURN_IF_ERROR(ReadPositiveFloatKey(f, "gemma3.attention.layer_norm_rms_epsilon", 1e-6, 1.0, &cfg->rms_eps));
  MR_RETURN_IF_ERROR(ReadIntKey(f, "gemma3.attention.sliding_window", 0, kMaxContextLength, 512, &cfg->sliding_window));
  MR_RETURN_IF_ERROR(ReadPositiveFloatKey(f, "gemma3.rope.freq_base", 1000000.0, 1e30, &cfg->rope_base));
  cfg->rope_base_swa = 10000.0f;
  // The 4B-27B files scale the global layers' RoPE (linear x8); the sliding ones keep theirs
  // (rope_factors_swa false). YaRN's magnitude scale would then differ between the two kinds of
  // layer, which one attention scale cannot express.
  if (cfg->rope_yarn) {
    return Unsupported(
        "[model] metadata key 'gemma3.rope.scaling.type': yarn rope scaling is not supported for gemma3");
  }
  // Layers 0..4 sliding, 5 global, repeating (Gemma 3 technical report: 5 local : 1 global).
  constexpr int64_t kPattern = 6;
  for (int64_t l = 0; l < cfg->n_layer; ++l) cfg->layer_is_swa[l] = (l + 1) % kPattern != 0;
  if (cfg->d_model >= cfg->n_head && cfg->d_model / cfg->n_head != cfg->head_dim && cfg->n_layer >= 62) {
    // 27B uses query_pre_attn_scalar = d_model / n_head.
    cfg->attn_scale = 1.0f / std::sqrt(static_cast<float>(cfg->d_model / cfg->n_head));
  }
  return Status::Ok();
}

}  // namespace mr
