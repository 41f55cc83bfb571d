#include "runtime/generator.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <string>

#include "model/gguf.h"

namespace mr {

SamplingParams ModelDefaultSampling(const Model& model) {
  const gguf::GgufFile& f = model.file();
  SamplingParams s;
  switch (model.config().arch) {
    case Arch::kGemma3:
      s = {1.0f, 64, 0.95f, 0.0f};
      break;
    case Arch::kQwen2:
      s = {0.7f, 20, 0.8f, 0.0f};
      break;
    case Arch::kQwen3:  // the model card's thinking-mode settings
    case Arch::kQwen3Moe:
      s = {0.6f, 20, 0.95f, 0.0f};
      break;
    case Arch::kSmolLM3:  // the model card's
      s = {0.6f, 0, 0.95f, 0.0f};
      break;
    case Arch::kGptOss:  // OpenAI's recommendation for gpt-oss: temperature 1, no top-k / top-p cut
      s = {1.0f, 0, 1.0f, 0.0f};
      break;
    case Arch::kPhi3:  // no family defaults: the file's, else the sampler's
    case Arch::kGemma2:
      break;
    case Arch::kLlama: {
      // general.name varies in case ("Smollm2 135M 8k ..." in the catalog's file).
      std::string name = f.GetString("general.name").value_or("");
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (name.find("smollm2") != std::string::npos) s = {0.2f, 0, 0.9f, 0.0f};
      break;
    }
  }
  if (auto v = f.GetFloat("general.sampling.temp")) s.temperature = static_cast<float>(*v);
  if (auto v = f.GetInt("general.sampling.top_k")) s.top_k = static_cast<int>(*v);
  if (auto v = f.GetFloat("general.sampling.top_p")) s.top_p = static_cast<float>(*v);
  if (auto v = f.GetFloat("general.sampling.min_p")) s.min_p = static_cast<float>(*v);
  return s;
}

Result<GenerateStats> Generator::WarmUp(const SpecParams& spec, int64_t max_tokens, const CancelFn& cancelled) {
  const std::vector<TokenId> prompt = model().tokenizer().Encode(
      "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", /*add_special=*/true, false);
  GenerateParams p;
  p.sampling = ModelDefaultSampling(model());
  p.max_tokens = max_tokens;
  p.spec = spec;
  auto r = Generate(
      prompt, p, [](TokenId) { return true; }, cancelled);
  ResetCache();
  return r;
}

Generator::Generator(Model& model, int64_t n_ctx) : seq_(model, n_ctx) {}

Result<GenerateStats> Generator::Generate(std::span<const TokenId> prompt, const GenerateParams& params,
                                          const TokenFn& on_token, const CancelFn& cancelled) {
  MR_RETURN_IF_ERROR(seq_.Start(prompt, params));
  const int64_t n_vocab = seq_.model().config().n_vocab;
  auto fail = [&](const Status& st) -> Result<GenerateStats> {
    seq_.ResetCache();
    return st;
  };
  while (!seq_.done()) {
    if (cancelled && cancelled()) {
      seq_.Cancel();
      break;
    }
    Result<Sequence::StepRows> rows = seq_.NextRows(std::max<int64_t>(1, params.prefill_chunk));
    if (!rows.ok()) return fail(rows.status());
    if (seq_.done()) break;
    const int64_t n_out = rows->all_logits ? rows->n : 1;
    if (static_cast<int64_t>(logits_.size()) < n_out * n_vocab) logits_.resize(static_cast<size_t>(n_out * n_vocab));
    Status st = seq_.model().Forward(seq_.kv(), rows->tokens, rows->n, rows->all_logits, logits_.data());
    if (!st.ok()) return fail(st);
    st = seq_.Consume(logits_.data(), on_token);
    if (!st.ok()) return fail(st);
  }
  return seq_.stats();
}

}  // namespace mr
