// gpt-oss (OpenAI's open-weight MoE, 20B / 120B; llama.cpp's LLM_ARCH_OPENAI_MOE): pre-norm
// blocks (the FFN's norm is stored as post_attention_norm) with
// - attention: q/k/v and output biases, NeoX RoPE with YaRN scaling (factor 32 over a 4,096-position
//   original context in the released files; arch_common.cpp), head size 64 with q_dim != d_model,
//   a learned sink logit per query head (attn_sinks), sliding-window (128) and global layers
//   alternating with layer 0 sliding (attention.sliding_window_pattern, default 2);
// - the FFN: expert_count experts of width expert_feed_forward_length, expert_used_count per row,
//   picked on the router's biased logits with the weights a softmax over the picked logits only;
//   each expert's projections have biases and its activation is the clamped SwiGLU
//   (Activation::kSwigluOai). The released files store the experts in MXFP4.
#include "model/gguf.h"
#include "model/model.h"

namespace mr {

Status ReadGptOssConfig(const gguf::GgufFile& f, ModelConfig* cfg) {
  const std::string p = "gpt-oss.";
  MR_RETURN_IF_ERROR(ReadCommonConfig(f, "gpt-oss", cfg));
  cfg->arch = Arch::kGptOss;
  cfg->rope_neox = true;
  cfg->rope_factors_swa = true;  // llama.cpp's openai-moe copies the scaling to its sliding layers
  cfg->act = Activation::kSwigluOai;
  cfg->attn_sinks = true;
  cfg->attn_out_bias = true;
  cfg->qkv_bias = f.FindTensor("blk.0.attn_q.bias") != nullptr;
  cfg->moe_softmax_weight = true;
  cfg->moe_biases = true;
  // MXFP4 experts against int8 inputs alone: KL 0.0053 from the exact arithmetic on the generated
  // file, llama.cpp 0.0041; with the expert inputs as two rows 0.0003 (docs/models.md).
  cfg->arch_fine_acts = kActGlu | kActDown;
  constexpr int64_t kMaxExperts = 1024;
  MR_RETURN_IF_ERROR(ReadIntKey(f, p + "expert_count", 1, kMaxExperts, std::nullopt, &cfg->n_expert));
  MR_RETURN_IF_ERROR(ReadIntKey(f, p + "expert_used_count", 1, cfg->n_expert, std::nullopt, &cfg->n_expert_used));
  MR_RETURN_IF_ERROR(
      ReadIntKey(f, p + "expert_feed_forward_length", 1, int64_t{1} << 20, std::nullopt, &cfg->d_ff_expert));
  MR_RETURN_IF_ERROR(
      ReadIntKey(f, p + "attention.sliding_window", 1, kMaxContextLength, std::nullopt, &cfg->sliding_window));
  // llama.cpp's set_swa_pattern(n): layer l slides unless it is the last of each run of n (n = 0:
  // every layer slides). A per-layer array form of the key is not supported.
  if (const gguf::MetaValue* v = f.Find(p + "attention.sliding_window_pattern"); v && !v->is_integer()) {
    return Unsupported("[model] metadata key '" + p + "attention.sliding_window_pattern': got a " +
                       gguf::ValueTypeName(v->type) + ", expected an integer");
  }
  int64_t period = 2;
  MR_RETURN_IF_ERROR(ReadIntKey(f, p + "attention.sliding_window_pattern", 0, cfg->n_layer, 2, &period));
  for (int64_t l = 0; l < cfg->n_layer; ++l) cfg->layer_is_swa[l] = period == 0 || l % period < period - 1;
  MR_RETURN_IF_ERROR(ReadPositiveFloatKey(f, p + "rope.freq_base_swa", cfg->rope_base, 1e30, &cfg->rope_base_swa));
  if (cfg->rope_base_swa != cfg->rope_base && !cfg->rope_freq_factors.empty()) {
    return Unsupported("[model] metadata key '" + p +
                       "rope.freq_base_swa': a sliding-window RoPE base of its own together with rope scaling is not "
                       "supported");
  }
  return Status::Ok();
}

}  // namespace mr
