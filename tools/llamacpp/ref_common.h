// Shared by the llama.cpp reference tools of this directory (logits_ref, embed_ref).
#pragma once

#include <llama.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

// The tokens of `text`, or nullopt when llama.cpp's tokenizer fails.
inline std::optional<std::vector<llama_token>> TokenizeRef(const llama_vocab* vocab, const std::string& text,
                                                          bool add_special, bool parse_special) {
  std::vector<llama_token> out(text.size() + 4);
  auto run = [&] {
    return llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), out.data(),
                          static_cast<int32_t>(out.size()), add_special, parse_special);
  };
  int n = run();
  if (n < 0) {
    out.resize(static_cast<size_t>(-n));
    n = run();
  }
  if (n < 0) return std::nullopt;
  out.resize(static_cast<size_t>(n));
  return out;
}

// Clears the context's memory and evaluates `ids` as one sequence (id 0) from position 0, every
// position an output; llama_decode's status.
inline int DecodeOneSequence(llama_context* ctx, const std::vector<llama_token>& ids) {
  llama_memory_clear(llama_get_memory(ctx), true);
  llama_batch batch = llama_batch_init(static_cast<int32_t>(ids.size()), 0, 1);
  for (size_t i = 0; i < ids.size(); ++i) {
    batch.token[i] = ids[i];
    batch.pos[i] = static_cast<llama_pos>(i);
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = 0;
    batch.logits[i] = 1;
  }
  batch.n_tokens = static_cast<int32_t>(ids.size());
  const int rc = llama_decode(ctx, batch);
  llama_batch_free(batch);
  return rc;
}
