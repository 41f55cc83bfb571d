// qwen3 (Qwen3 dense): Qwen2's block without the Q/K/V biases, with RMSNorm over each q and k
// head before the rotary embedding (QK-norm: attn_q_norm / attn_k_norm, head_dim weights), NeoX
// rotary embeddings, a head size of its own (attention.key_length: q_dim = head_count x 128 is
// not embedding_length), tied embeddings in the small models.
#include "model/gguf.h"
#include "model/model.h"

namespace mr {

Status ReadQwen3Config(const gguf::GgufFile& f, ModelConfig* cfg) {
  MR_RETURN_IF_ERROR(ReadCommonConfig(f, "qwen3", cfg));
  cfg->arch = Arch::kQwen3;
  cfg->rope_neox = true;
  cfg->qk_norm = true;
  cfg->act = Activation::kSilu;
  return Status::Ok();
}

}  // namespace mr
