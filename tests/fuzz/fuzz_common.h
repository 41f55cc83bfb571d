// Shared set-up of the libFuzzer targets (scripts/fuzz.sh, docs/reliability.md): the model
// whose tokenizer and chat template the request and tokenizer targets use. The real SmolLM2
// when it is pulled (MERERUN_FUZZ_MODEL names another GGUF), else a tiny model written once to a
// temp file, so a target always runs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "model/model.h"

namespace mr::fuzz {

// Loaded once per process, vocabulary only (LoadOptions::vocab_only: file, tokenizer, chat
// template; no weights, no Forward); aborts with a message when nothing loads.
Model& SharedModel();

// A tiny random llama-architecture model (F32, byte-ish vocabulary) written by GgufWriter:
// the GGUF seed corpus and SharedModel's fallback. Returns the file image.
std::vector<uint8_t> TinyModelImage(uint32_t seed, const std::string& arch = "llama");

}  // namespace mr::fuzz
