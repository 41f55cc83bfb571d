// Thinking-block signatures: base64(HMAC-SHA256(key, model_id "\n" thinking_text)). The key is
// random per server start unless --signing-key fixes it, so signatures from another server (or
// an earlier run) are refused when a client replays them.
#pragma once

#include <string>

namespace mr::server {

std::string SignThinking(const std::string& key, const std::string& model_id, const std::string& text);
bool VerifyThinking(const std::string& key, const std::string& model_id, const std::string& text,
                    const std::string& signature);
// 32 random bytes, hex (a fresh server key).
std::string RandomSigningKey();

}  // namespace mr::server
