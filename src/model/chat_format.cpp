#include "model/chat_format.h"

#include "model/gguf.h"

namespace mr {
namespace {

// The default system prompt a ChatML template inserts when the conversation has none.
// Templates spell it inside a string literal as '<|im_start|>system\nYOU ARE ...<|im_end|>',
// with either an escaped or a literal newline.
std::string DefaultSystemPrompt(const std::string& tmpl) {
  for (const std::string marker : {"<|im_start|>system\\n", "<|im_start|>system\n"}) {
    size_t p = tmpl.find(marker);
    while (p != std::string::npos) {
      const size_t start = p + marker.size();
      const size_t end = tmpl.find("<|im_end|>", start);
      if (end == std::string::npos) break;
      std::string s = tmpl.substr(start, end - start);
      if (!s.empty() && s.find("{{") == std::string::npos && s.find("{%") == std::string::npos &&
          s.find('\'') == std::string::npos) {
        return s;
      }
      p = tmpl.find(marker, end);
    }
  }
  return "";
}

}  // namespace

ChatFamily DetectChatFamily(const gguf::GgufFile& f) {
  const std::string tmpl = f.GetString("tokenizer.chat_template").value_or("");
  if (tmpl.find("<|im_start|>") != std::string::npos) return ChatFamily::kChatML;
  if (tmpl.find("<start_of_turn>") != std::string::npos) return ChatFamily::kGemma;
  const std::string arch = f.GetString("general.architecture").value_or("");
  if (arch == "gemma3") return ChatFamily::kGemma;
  if (arch == "qwen2") return ChatFamily::kChatML;
  return ChatFamily::kNone;
}

const char* ChatFamilyName(ChatFamily family) {
  switch (family) {
    case ChatFamily::kChatML: return "chatml";
    case ChatFamily::kGemma: return "gemma";
    case ChatFamily::kNone: return "none";
  }
  return "?";
}

std::string RenderChat(ChatFamily family, const gguf::GgufFile& f, const std::vector<ChatMessage>& messages) {
  std::string out;
  switch (family) {
    case ChatFamily::kChatML: {
      const bool has_system = !messages.empty() && messages[0].role == "system";
      if (!has_system) {
        const std::string def = DefaultSystemPrompt(f.GetString("tokenizer.chat_template").value_or(""));
        if (!def.empty()) out += "<|im_start|>system\n" + def + "<|im_end|>\n";
      }
      for (const ChatMessage& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      out += "<|im_start|>assistant\n";
      break;
    }
    case ChatFamily::kGemma: {
      // Gemma has no system role: the template prepends the system text to the first user turn.
      std::string pending_system;
      for (const ChatMessage& m : messages) {
        if (m.role == "system") {
          pending_system += m.content + "\n\n";
          continue;
        }
        const std::string role = m.role == "assistant" ? "model" : m.role;
        out += "<start_of_turn>" + role + "\n" + pending_system + m.content + "<end_of_turn>\n";
        pending_system.clear();
      }
      out += "<start_of_turn>model\n";
      break;
    }
    case ChatFamily::kNone:
      for (const ChatMessage& m : messages) out += m.content + "\n";
      break;
  }
  return out;
}

}  // namespace mr
