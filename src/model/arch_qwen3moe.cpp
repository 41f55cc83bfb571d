// qwen3moe (Qwen3 mixture of experts, e.g. Qwen3-30B-A3B): Qwen3's attention (QK-norm, NeoX
// RoPE, no biases) and, in place of the FFN, expert_count SwiGLU experts of width
// expert_feed_forward_length of which expert_used_count run per token (softmax router, top-k,
// weights renormalized; no shared expert). forward.cpp's MoeFfn runs them.
#include "model/gguf.h"
#include "model/model.h"

namespace mr {

Status ReadQwen3MoeConfig(const gguf::GgufFile& f, ModelConfig* cfg) {
  MR_RETURN_IF_ERROR(ReadCommonConfig(f, "qwen3moe", cfg));
  cfg->arch = Arch::kQwen3Moe;
  cfg->rope_neox = true;
  cfg->qk_norm = true;
  cfg->act = Activation::kSilu;
  constexpr int64_t kMaxExperts = 1024;
  MR_RETURN_IF_ERROR(ReadIntKey(f, "qwen3moe.expert_count", 1, kMaxExperts, std::nullopt, &cfg->n_expert));
  MR_RETURN_IF_ERROR(ReadIntKey(f, "qwen3moe.expert_used_count", 1, cfg->n_expert, std::nullopt, &cfg->n_expert_used));
  MR_RETURN_IF_ERROR(
      ReadIntKey(f, "qwen3moe.expert_feed_forward_length", 1, int64_t{1} << 20, std::nullopt, &cfg->d_ff_expert));
  return Status::Ok();
}

}  // namespace mr
