// libFuzzer target: a request body through everything an HTTP handler does before the engine
// sees it — depth scan and parse, the Anthropic (first input byte even) or OpenAI (odd; with bit
// 1 set, the /v1/completions) parser, or with bit 3 set llama.cpp's (bit 1: /infill, else
// /completion; /tokenize reads the same body), or with bit 4 set Ollama's (bit 1: /api/generate,
// else /api/chat), or with bit 5 set the Responses API's (/v1/responses, with a store that holds
// the response "resp_seed" for previous_response_id), or with bit 6 set an embeddings body (bits 1-2:
// OpenAI, llama.cpp, Ollama, Ollama's older endpoint) parsed, tokenized and answered for vectors
// made up from the input, then rendering, tokenization and cache-breakpoint mapping (PrepareChat) on a real tokenizer
// and chat template, and the first token mask of a grammar constraint (tool schemas, structured
// outputs). Every outcome must be a value: an ApiError or a prepared prompt.
// Seeds: tests/fuzz/corpus/requests.
#include <string_view>

#include "fuzz_common.h"
#include "server/anthropic_api.h"
#include "server/embeddings_api.h"
#include "server/llamacpp_api.h"
#include "server/ollama_api.h"
#include "server/openai_api.h"
#include "server/request_fields.h"
#include "server/responses_api.h"

namespace {

const mr::server::ServedModel& Served() {
  static const mr::server::ServedModel sm = [] {
    mr::server::ServedModel s;
    s.model = &mr::fuzz::SharedModel();
    s.id = "fuzz-model";
    s.signing_key = "k";
    s.n_ctx = 2048;
    s.family = mr::DetectChatFamily(s.model->file());
    s.masker = std::make_shared<const mr::TokenMasker>(s.model->tokenizer(), s.model->config().n_vocab);
    return s;
  }();
  return sm;
}

const mr::server::ResponseStore& Store() {
  static const mr::server::ResponseStore* store = [] {
    auto* st = new mr::server::ResponseStore(4, 1 << 20);
    nlohmann::ordered_json items =
        nlohmann::ordered_json::array({{{"type", "message"}, {"role", "user"}, {"content", "Hi"}, {"id", "msg_1"}}});
    nlohmann::ordered_json output = nlohmann::ordered_json::array(
        {{{"type", "function_call"}, {"id", "fc_1"}, {"call_id", "call_1"}, {"name", "f"}, {"arguments", "{}"}}});
    st->Put({{{"id", "resp_seed"}, {"output", output}}, items});
    return st;
  }();
  return *store;
}

}  // namespace

// The tokenizer and template load before the first input, not inside it.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)Served();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool anthropic = (data[0] & 1) == 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  const mr::server::ServedModel& sm = Served();
  nlohmann::ordered_json json;
  if (mr::server::ParseRequestBody(body, mr::server::RequestLimits{}, &json)) return 0;
  if ((data[0] & 64) != 0) {
    mr::server::EmbeddingRequest er;
    const auto api = static_cast<mr::server::EmbeddingApi>((data[0] >> 1) & 3);
    if (mr::server::ParseEmbeddingRequest(json, sm, api, &er)) return 0;
    std::vector<std::vector<float>> vectors;
    for (const auto& in : er.inputs) {
      std::vector<float> v(static_cast<size_t>(sm.model->config().d_model));
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(in[i % in.size()] % 17) - 8.0f;
      vectors.push_back(std::move(v));
    }
    (void)mr::server::DumpWireJson(mr::server::EmbeddingResponse(er, std::move(vectors), 0.5));
    return 0;
  }
  mr::server::ChatRequest req;
  if (anthropic) {
    mr::server::AnthropicOptions opts;
    const bool count_only = (data[0] & 2) != 0;
    if (mr::server::ParseAnthropicRequest(json, sm, count_only, &req, &opts)) return 0;
  } else if ((data[0] & 8) != 0) {
    nlohmann::ordered_json tokens;
    (void)mr::server::LlamaTokenize(json, sm, &tokens);
    (void)mr::server::LlamaDetokenize(json, sm, &tokens);
    mr::server::LlamaOptions opts;
    if (mr::server::ParseLlamaCompletion(json, sm, (data[0] & 2) != 0, &req, &opts)) return 0;
    mr::server::PreparedChat prepared;
    if (mr::server::PrepareChat(sm, std::move(req), &prepared)) return 0;
    mr::server::LlamaWriter writer(opts, sm, prepared);
    (void)writer.Result();
    return 0;
  } else if ((data[0] & 32) != 0) {
    mr::server::ResponsesOptions opts;
    if (mr::server::ParseResponsesRequest(json, sm, &Store(), &req, &opts)) return 0;
  } else if ((data[0] & 16) != 0) {
    mr::server::OllamaOptions opts;
    if (mr::server::ParseOllamaRequest(json, sm, (data[0] & 2) == 0, &req, &opts)) return 0;
    if (opts.load_only) return 0;
  } else {
    mr::server::OpenAIOptions opts;
    if ((data[0] & 2) != 0 ? mr::server::ParseCompletionRequest(json, sm, &req, &opts).has_value()
                           : mr::server::ParseOpenAIRequest(json, sm, &req, &opts).has_value())
      return 0;
  }
  mr::server::PreparedChat prepared;
  if (mr::server::PrepareChat(sm, std::move(req), &prepared)) return 0;
  // A grammar constraint (tools, structured outputs) computes its first mask.
  if (prepared.params.constraint && prepared.params.constraint->active()) {
    std::vector<float> logits(static_cast<size_t>(sm.masker->n_vocab()), 0.0f);
    std::vector<uint8_t> scratch;
    prepared.params.constraint->Apply(logits.data(), &scratch);
  }
  return 0;
}
