// Test helpers for grammars (runtime/grammar.h), shared by the runtime layer's tests.
#pragma once

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "runtime/grammar.h"

namespace mr {

// A random sentence of g: random allowed bytes, preferring past `soft_len` the bytes that close
// JSON-like text (quotes, brackets, short literals), so that a sentence ends.
inline std::string RandomSentence(const Grammar& g, std::mt19937& rng, size_t soft_len) {
  GrammarState s = g.Start();
  std::string out;
  for (int guard = 0; guard < 20000; ++guard) {
    if (s.accepting() && (s.finished() || out.size() > soft_len || rng() % 8 == 0)) return out;
    const ByteSet next = s.NextBytes();
    std::vector<uint8_t> options;
    for (int c = 0; c < 256; ++c)
      if (next.test(static_cast<size_t>(c))) options.push_back(static_cast<uint8_t>(c));
    if (options.empty()) break;
    uint8_t c = options[rng() % options.size()];
    if (out.size() > soft_len) {
      for (uint8_t pref : {'"', '}', ']', '0', 'n', 't', 'f', 'u', 'l', 'r', 'e', 'a', 's'})
        if (next.test(pref)) {
          c = pref;
          break;
        }
    }
    out.push_back(static_cast<char>(c));
    EXPECT_TRUE(s.Advance(c));
  }
  ADD_FAILURE() << "no sentence completed: " << out;
  return out;
}

}  // namespace mr
