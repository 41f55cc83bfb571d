// Thinking-block signatures: base64(HMAC-SHA256(key, model_id "\n" thinking_text)). The key
// persists in a 0600 file (LoadOrCreateSigningKey), so a conversation's thinking blocks stay
// valid across server restarts, while signatures from another machine's server are refused.
#pragma once

#include <string>

#include "base/status.h"

namespace mr::server {

std::string SignThinking(const std::string& key, const std::string& model_id, const std::string& text);
bool VerifyThinking(const std::string& key, const std::string& model_id, const std::string& text,
                    const std::string& signature);
// 32 random bytes, hex (a fresh server key).
std::string RandomSigningKey();
// The key stored at `path` (64 hex digits), or a new random one written there first (parent
// directories created, the file 0600 and created exclusively, so two servers starting at once
// agree on one key). A file that is not a private regular file of 64 hex digits is an error:
// the key is refused rather than trusted or silently replaced.
Result<std::string> LoadOrCreateSigningKey(const std::string& path);

}  // namespace mr::server
