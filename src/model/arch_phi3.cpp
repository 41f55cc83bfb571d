// phi3 (Phi-3 / Phi-3.5 mini without LongRoPE factors): llama-like blocks with the q, k and v
// projections fused in one tensor (attn_qkv: q rows, then k, then v) and the gate and up
// projections fused in ffn_up (gate rows first), NeoX rotary embeddings, no biases. The loader
// splits the fused tensors into row views (model.cpp). Files with rope_factors_long/short
// (128k-context LongRoPE) or partial rotary embeddings are refused.
#include "model/gguf.h"
#include "model/model.h"

namespace mr {

Status ReadPhi3Config(const gguf::GgufFile& f, ModelConfig* cfg) {
  MR_RETURN_IF_ERROR(ReadCommonConfig(f, "phi3", cfg));
  cfg->arch = Arch::kPhi3;
  cfg->rope_neox = true;
  cfg->act = Activation::kSilu;
  if (f.FindTensor("rope_factors_long.weight") != nullptr || f.FindTensor("rope_factors_short.weight") != nullptr) {
    return Unsupported("[model] phi3: LongRoPE (tensors rope_factors_long / rope_factors_short) is not supported");
  }
  return Status::Ok();
}

}  // namespace mr
