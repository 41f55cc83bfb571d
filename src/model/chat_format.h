// Chat formats per model family, rendering messages to the prompt text the model was trained on.
// Detected from the GGUF chat template (tokenizer.chat_template) and architecture. The server
// issue extends this with tools, tool results and reasoning.
#pragma once

#include <string>
#include <vector>

namespace mr {
namespace gguf { class GgufFile; }

enum class ChatFamily { kChatML, kGemma, kNone };

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

ChatFamily DetectChatFamily(const gguf::GgufFile& f);
const char* ChatFamilyName(ChatFamily family);

// Render messages and open the assistant turn (add_generation_prompt). The text is meant to be
// tokenized with parse_special = true; BOS is added by the tokenizer when the model asks for it.
// ChatML models get their template's default system prompt when none is given (SmolLM2, Qwen2.5).
std::string RenderChat(ChatFamily family, const gguf::GgufFile& f, const std::vector<ChatMessage>& messages);

}  // namespace mr
