// The embedding endpoints of the APIs the server speaks, over one engine path: each input is a
// prefill-only engine job (GenerateParams::embed) whose output-normed final hidden states are
// pooled (the served model's Pooling: the file's `{arch}.pooling_type`, else `serve --pooling`,
// else mean) and then normalized as the API does.
//
// - OpenAI POST /v1/embeddings: `input` a string, an array of strings, an array of token ids or
//   an array of such arrays; `encoding_format` float | base64 (the official Python SDK asks for
//   base64 by default); `dimensions` keeps the first N components (renormalized, as Matryoshka
//   models are meant to be cut); llama.cpp's `embd_normalize` too. L2-normalized by default.
// - llama.cpp POST /embedding and /embeddings: `content` (or `input`), the same shapes;
//   `embd_normalize` (-1 none, 0 max-abs scaled to the int16 range, 1 taxicab, 2 Euclidean (the
//   default), p > 2 the p-norm), answered as llama.cpp does: [{index, embedding: [[...]]}].
// - Ollama POST /api/embed (`input` a string or strings, `truncate` (default true: inputs longer
//   than the context lose their end), `dimensions`; L2-normalized) and the older
//   /api/embeddings (`prompt`; not normalized).
//
// Text is tokenized with the model's own BOS/EOS rule (tokenizer.ggml.add_bos_token /
// add_eos_token, as llama.cpp does) and never parsed for special tokens: request text stays text.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "server/api_error.h"
#include "server/chat_session.h"

namespace mr::server {

enum class EmbeddingApi { kOpenAI, kLlama, kOllama, kOllamaLegacy };

// Inputs per request (OpenAI's own limit).
inline constexpr size_t kMaxEmbeddingInputs = 2048;

struct EmbeddingRequest {
  EmbeddingApi api = EmbeddingApi::kOpenAI;
  std::string model;                         // echoed back (the served model's id by default)
  std::vector<std::vector<TokenId>> inputs;  // tokenized, each 1..n_ctx-1 tokens
  bool base64 = false;                       // OpenAI encoding_format "base64"
  int64_t dimensions = 0;                    // > 0: the first `dimensions` components only
  int normalize = 2;                         // llama.cpp's embd_normalize
};

// Parses and tokenizes the body of `api`'s endpoint. Errors are 400s naming the field.
std::optional<ApiError> ParseEmbeddingRequest(const nlohmann::ordered_json& body, const ServedModel& sm,
                                              EmbeddingApi api, EmbeddingRequest* out);

// `v` scaled as llama.cpp's common_embd_normalize does for `mode` (a zero vector stays zero).
void NormalizeEmbedding(int mode, std::vector<float>* v);

// The pooled embedding of each input (as the engine returns them) cut to req.dimensions and
// normalized, answered in `req.api`'s shape. total_s: the request's time (Ollama's durations).
nlohmann::ordered_json EmbeddingResponse(const EmbeddingRequest& req, std::vector<std::vector<float>> embeddings,
                                         double total_s);

}  // namespace mr::server
