// Vocabulary loading, special-token handling and detokenization shared by both tokenizers.
// Reference: llama.cpp src/llama-vocab.cpp (llama_vocab::impl::load, tokenizer_st_partition,
// tokenize, token_to_piece, detokenize).
#include "model/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <initializer_list>

#include "model/gguf.h"
#include "model/tokenizer_internal.h"
#include "model/unicode.h"

namespace mr {
namespace tokenizer_internal {
namespace {

bool OneOf(const std::string& s, std::initializer_list<const char*> list) {
  for (const char* x : list) {
    if (s == x) return true;
  }
  return false;
}

// tokenizer.ggml.token_type values (llama_token_type) -> attribute bits.
uint16_t AttrFromType(int64_t type) {
  switch (type) {
    case 1:
      return kAttrNormal;
    case 2:
      return kAttrUnknown;
    case 3:
      return kAttrControl;
    case 4:
      return kAttrUserDefined;
    case 5:
      return kAttrUnused;
    case 6:
      return kAttrByte;
    default:
      return 0;  // undefined
  }
}

// Settings llama.cpp derives from tokenizer.ggml.pre for byte-level BPE vocabularies.
Status ApplyBpePre(Vocab* v) {
  const std::string& pre = v->pre;
  v->add_space_prefix = false;
  v->clean_spaces = true;
  if (OneOf(pre, {"gpt-2", "phi-2", "starcoder", "refact"})) {
    // clean_spaces stays on
  } else if (OneOf(pre, {"smollm", "command-r", "qwen2", "deepseek-r1-qwen", "gpt-4o"})) {
    v->clean_spaces = false;
  } else if (OneOf(pre, {"llama3", "llama-v3", "llama-bpe", "falcon3"})) {
    v->ignore_merges = true;
    v->add_bos = true;
  } else {
    return Unsupported("[tokenizer] unsupported pre-tokenizer 'tokenizer.ggml.pre' = '" + pre +
                       "' (supported: gpt-2, phi-2, starcoder, refact, smollm, command-r, qwen2, "
                       "deepseek-r1-qwen, llama3, llama-bpe, falcon3, gpt-4o)");
  }
  return Status::Ok();
}

// A token's text for an error message: at most 32 bytes, non-printable bytes as \xNN.
std::string Quoted(const std::string& text) {
  std::string out = "'";
  for (size_t i = 0; i < text.size() && i < 32; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (std::isprint(c) && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    }
  }
  return out + (text.size() > 32 ? "'..." : "'");
}

// "<0xXX>": the only text a byte token can have (BuildPieces and the SentencePiece byte
// fallback read its byte from there).
bool IsByteTokenText(const std::string& s) {
  return s.size() == 6 && s.compare(0, 3, "<0x") == 0 && std::isxdigit(static_cast<unsigned char>(s[3])) &&
         std::isxdigit(static_cast<unsigned char>(s[4])) && s[5] == '>';
}

void AddControl(Vocab* v, TokenId id) {
  v->tokens[id].attr |= kAttrControl;
}

// Finds ids by token text for the roles llama.cpp detects by name, then builds the
// end-of-generation set. llama.cpp walks its unordered_map, so when several names of one role
// exist the id it picks may vary; here the lowest id wins. Only eot/fim roles are affected and
// the EOG set is the same either way.
void DetectSpecialByName(Vocab* v) {
  struct Role {
    TokenId* id;
    std::initializer_list<const char*> names;
  };
  const Role roles[] = {
      {&v->eot,
       {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>",
        "[EOT]",
        "<\xef\xbd\x9c"
        "end\xe2\x96\x81"
        "of\xe2\x96\x81"
        "sentence\xef\xbd\x9c>",
        "<end_of_utterance>"}},
      {&v->eom, {"<|eom_id|>"}},
      {&v->fim_pre,
       {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
        "<\xef\xbd\x9c"
        "fim\xe2\x96\x81"
        "begin\xef\xbd\x9c>",
        "<PRE>", "\xe2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>"}},
      {&v->fim_suf,
       {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
        "<\xef\xbd\x9c"
        "fim\xe2\x96\x81"
        "hole\xef\xbd\x9c>",
        "<SUF>", "\xe2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>"}},
      {&v->fim_mid,
       {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
        "<\xef\xbd\x9c"
        "fim\xe2\x96\x81"
        "end\xef\xbd\x9c>",
        "<MID>", "\xe2\x96\x81<MID>", "<|code_middle|>", "<|middle|>"}},
      {&v->fim_pad, {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"}},
      {&v->fim_rep, {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"}},
      {&v->fim_sep, {"<|file_sep|>"}},
  };
  for (const Role& role : roles) {
    if (*role.id != -1) continue;  // set by metadata
    TokenId best = -1;
    for (const char* name : role.names) {
      const TokenId id = v->Find(name);
      if (id != -1 && (best == -1 || id < best)) best = id;
    }
    if (best != -1) {
      *role.id = best;
      AddControl(v, best);
    }
  }

  // Control tokens named "unused..." are unused.
  for (auto& t : v->tokens) {
    if ((t.attr & kAttrControl) && t.text.find("unused") != std::string::npos) {
      t.attr |= kAttrUnused;
    }
  }

  // End of generation: fim pad/repo/sep, tokens with these names, then eos/eot/eom.
  for (TokenId id : {v->fim_pad, v->fim_rep, v->fim_sep}) {
    if (id != -1) v->eog.insert(id);
  }
  for (const char* name : {"<|eot_id|>",
                           "<|im_end|>",
                           "<|end|>",
                           "<|return|>",
                           "<|call|>",
                           "<|flush|>",
                           "<|calls|>",
                           "<end_of_turn>",
                           "<|endoftext|>",
                           "</s>",
                           "<|eom_id|>",
                           "<EOT>",
                           "_<EOT>",
                           "[EOT]",
                           "[EOS]",
                           "<|end_of_text|>",
                           "<end_of_utterance>",
                           "<eos>",
                           "<turn|>",
                           "<|tool_response>",
                           "<\xef\xbd\x9c"
                           "end\xe2\x96\x81"
                           "of\xe2\x96\x81"
                           "sentence\xef\xbd\x9c>",
                           "[e~["}) {
    if (const TokenId id = v->Find(name); id != -1) {
      v->eog.insert(id);
      AddControl(v, id);
    }
  }
  // gpt-oss: these render as text.
  for (const char* name : {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}) {
    if (const TokenId id = v->Find(name); id != -1) v->tokens[id].attr = kAttrUserDefined;
  }
  for (TokenId id : {v->eos, v->eot, v->eom}) {
    if (id != -1) v->eog.insert(id);
  }
  // o200k_harmony / solar-open: "<|end|>" ends a message, not the generation.
  bool has_return = false, has_call = false, has_flush = false, has_tool_response = false;
  TokenId end_id = -1, s_id = -1;
  for (TokenId id : v->eog) {
    if (!v->Valid(id)) continue;
    const std::string& t = v->tokens[id].text;
    if (t == "<|return|>") has_return = true;
    if (t == "<|call|>" || t == "<|calls|>") has_call = true;
    if (t == "<|flush|>") has_flush = true;
    if (t == "<|end|>") end_id = id;
    if (t == "<|tool_response>") has_tool_response = true;
    if (t == "</s>") s_id = id;
  }
  if (end_id != -1 && has_call && (has_return || has_flush)) {
    v->eog.erase(end_id);
    v->tokens[end_id].attr = kAttrUserDefined;
  }
  if (s_id != -1 && has_tool_response) {
    v->eog.erase(s_id);
    v->tokens[s_id].attr = kAttrNormal;
  }
}

// llama.cpp's per-model strip attributes (llama_vocab::impl::load, "set attributes by
// model/tokenizer/architecture name"), which GGUF files do not carry: the <mask> of the Jina v2
// and nomic-bert-moe / jina-bert-v3 tokenizers strips the whitespace before it; in Phi-3
// (general.name containing "phi-3" or "phi3", any case) every special token but <unk>, <s> and
// <|endoftext|>, and </s>, strip the whitespace after them. Runs after the special tokens are
// known (they are special_by_length).
void SetStripAttributes(const gguf::GgufFile& file, Vocab* v) {
  auto key = [&](const char* k) { return file.GetString(k).value_or(std::string()); };
  auto contains_any = [](const std::string& s, std::initializer_list<const char*> subs) {
    for (const char* x : subs) {
      if (s.find(x) != std::string::npos) return true;
    }
    return false;
  };
  auto set = [&](const char* text, uint16_t bit, bool on) {
    const TokenId id = v->Find(text);
    if (id == -1) return;
    v->tokens[id].attr = static_cast<uint16_t>(on ? v->tokens[id].attr | bit : v->tokens[id].attr & ~bit);
  };
  std::string name = key("general.name");
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (contains_any(key("tokenizer.ggml.pre"), {"jina-v2-de", "jina-v2-es", "jina-v2-code"}) ||
      contains_any(key("general.architecture"), {"nomic-bert-moe", "jina-bert-v3"})) {
    set("<mask>", kAttrLStrip, true);
  } else if (contains_any(name, {"phi-3", "phi3"})) {
    for (TokenId id : v->special_by_length) v->tokens[id].attr |= kAttrRStrip;
    set("</s>", kAttrRStrip, true);
    for (const char* t : {"<unk>", "<s>", "<|endoftext|>"}) set(t, kAttrRStrip, false);
  }
}

void BuildSpecialIndex(Vocab* v) {
  const TokenId n = static_cast<TokenId>(v->tokens.size());
  for (TokenId id = 0; id < n; ++id) {
    if (v->tokens[id].attr & (kAttrControl | kAttrUserDefined | kAttrUnknown)) {
      v->special_by_length.push_back(id);
    }
  }
  // Same comparator and input order as llama.cpp (std::sort is not stable; equal-length ties
  // then come out in the same order with the same standard library).
  std::sort(v->special_by_length.begin(), v->special_by_length.end(),
            [v](TokenId a, TokenId b) { return v->tokens[a].text.size() > v->tokens[b].text.size(); });

  v->trie.assign(1, Vocab::TrieNode{});
  for (size_t rank = 0; rank < v->special_by_length.size(); ++rank) {
    const TokenId id = v->special_by_length[rank];
    int32_t node = 0;
    for (unsigned char c : v->tokens[id].text) {
      auto& next = v->trie[node].next;
      auto it = std::lower_bound(next.begin(), next.end(), std::make_pair(c, int32_t{-1}));
      if (it != next.end() && it->first == c) {
        node = it->second;
      } else {
        const int32_t child = static_cast<int32_t>(v->trie.size());
        next.insert(it, {c, child});
        v->trie.emplace_back();
        node = child;
      }
    }
    v->trie[node].rank = static_cast<int32_t>(rank);
  }
}

}  // namespace

Result<std::unique_ptr<Vocab>> LoadVocab(const gguf::GgufFile& file) {
  auto v = std::make_unique<Vocab>();
  auto model = file.GetString("tokenizer.ggml.model");
  if (!model) return InvalidArgument("[tokenizer] missing 'tokenizer.ggml.model'");
  v->model = *model;
  v->pre = file.GetString("tokenizer.ggml.pre").value_or("");

  if (v->model == "llama") {
    v->kind = Vocab::Kind::kSpm;
    v->bos = 1, v->eos = 2, v->unk = 0;
    v->add_space_prefix = true;
    v->add_bos = true;
    v->clean_spaces = false;
  } else if (v->model == "gpt2") {
    v->kind = Vocab::Kind::kBpe;
    v->bos = 11, v->eos = 11;
    MR_RETURN_IF_ERROR(ApplyBpePre(v.get()));
  } else {
    return Unsupported("[tokenizer] unsupported tokenizer model 'tokenizer.ggml.model' = '" + v->model +
                       "' (supported: gpt2, llama)");
  }
  if (auto b = file.GetBool("tokenizer.ggml.add_space_prefix")) v->add_space_prefix = *b;

  const std::vector<std::string>* texts = file.GetStringArray("tokenizer.ggml.tokens");
  if (texts == nullptr || texts->empty()) {
    return InvalidArgument("[tokenizer] missing or empty string array 'tokenizer.ggml.tokens'");
  }
  const size_t n = texts->size();
  if (n > static_cast<size_t>(INT32_MAX)) return InvalidArgument("[tokenizer] vocabulary too large");
  const std::vector<double>* scores = file.GetFloatArray("tokenizer.ggml.scores");
  if (scores == nullptr) {
    if (const auto* iscores = file.GetIntArray("tokenizer.ggml.scores"); iscores && !iscores->empty()) {
      return InvalidArgument("[tokenizer] integer 'tokenizer.ggml.scores' not supported");
    }
  }
  if (scores != nullptr && scores->size() < n) {
    return InvalidArgument("[tokenizer] 'tokenizer.ggml.scores' has " + std::to_string(scores->size()) +
                           " entries, expected " + std::to_string(n));
  }
  const std::vector<int64_t>* types = file.GetIntArray("tokenizer.ggml.token_type");
  if (types != nullptr && types->size() < n) {
    return InvalidArgument("[tokenizer] 'tokenizer.ggml.token_type' has " + std::to_string(types->size()) +
                           " entries, expected " + std::to_string(n));
  }

  v->tokens.resize(n);
  v->index.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    TokenData& t = v->tokens[i];
    t.text = (*texts)[i].empty() ? "[EMPTY_" + std::to_string(i) + "]" : (*texts)[i];
    t.score = scores ? static_cast<float>((*scores)[i]) : 0.0f;
    t.attr = types ? AttrFromType((*types)[i]) : uint16_t{kAttrNormal};
    if ((t.attr & kAttrByte) && !IsByteTokenText(t.text)) {
      return InvalidArgument("[tokenizer] token " + std::to_string(i) +
                             " of 'tokenizer.ggml.tokens' has type BYTE (tokenizer.ggml.token_type 6): got text " +
                             Quoted(t.text) + ", expected '<0xXX>'");
    }
    // Merge priorities compare scores; a NaN breaks the ordering the merge queue relies on.
    if (std::isnan(t.score)) {
      return InvalidArgument("[tokenizer] 'tokenizer.ggml.scores' of token " + std::to_string(i) +
                             ": got nan, expected a number");
    }
  }
  for (size_t i = 0; i < n; ++i) v->index[v->tokens[i].text] = static_cast<TokenId>(i);

  // Special ids: a default out of range is dropped; a key out of range keeps the default.
  struct IdKey {
    const char* key;
    TokenId* id;
  };
  const IdKey keys[] = {
      {"tokenizer.ggml.bos_token_id", &v->bos},         {"tokenizer.ggml.eos_token_id", &v->eos},
      {"tokenizer.ggml.eot_token_id", &v->eot},         {"tokenizer.ggml.eom_token_id", &v->eom},
      {"tokenizer.ggml.unknown_token_id", &v->unk},     {"tokenizer.ggml.seperator_token_id", &v->sep},
      {"tokenizer.ggml.padding_token_id", &v->pad},     {"tokenizer.ggml.mask_token_id", &v->mask},
      {"tokenizer.ggml.fim_pre_token_id", &v->fim_pre}, {"tokenizer.ggml.fim_suf_token_id", &v->fim_suf},
      {"tokenizer.ggml.fim_mid_token_id", &v->fim_mid}, {"tokenizer.ggml.fim_pad_token_id", &v->fim_pad},
      {"tokenizer.ggml.fim_rep_token_id", &v->fim_rep}, {"tokenizer.ggml.fim_sep_token_id", &v->fim_sep},
      {"tokenizer.ggml.prefix_token_id", &v->fim_pre},  {"tokenizer.ggml.suffix_token_id", &v->fim_suf},
      {"tokenizer.ggml.middle_token_id", &v->fim_mid},
  };
  for (const IdKey& k : keys) {
    if (*k.id >= 0 && !v->Valid(*k.id)) *k.id = -1;
    if (auto x = file.GetInt(k.key); x && *x >= 0 && *x < static_cast<int64_t>(n)) {
      *k.id = static_cast<TokenId>(*x);
    }
  }
  if (auto b = file.GetBool("tokenizer.ggml.add_bos_token")) v->add_bos = *b;
  if (auto b = file.GetBool("tokenizer.ggml.add_eos_token")) v->add_eos = *b;
  if (v->add_bos && v->bos == -1) {
    return InvalidArgument("[tokenizer] add_bos_token is set but the vocabulary has no BOS token");
  }
  if (v->add_eos && v->eos == -1) {
    return InvalidArgument("[tokenizer] add_eos_token is set but the vocabulary has no EOS token");
  }

  DetectSpecialByName(v.get());
  // The special-token trie takes ~40 bytes per byte of special-token text, so its input is
  // bounded here rather than by the metadata budget (real vocabularies: under 100 KB).
  constexpr size_t kMaxSpecialBytes = 4 << 20;
  size_t special_bytes = 0;
  for (const TokenData& t : v->tokens) {
    if (t.attr & (kAttrControl | kAttrUserDefined | kAttrUnknown)) special_bytes += t.text.size();
  }
  if (special_bytes > kMaxSpecialBytes) {
    return InvalidArgument(
        "[tokenizer] control, user-defined and unknown tokens ('tokenizer.ggml.token_type' 2, 3, 4) "
        "have " +
        std::to_string(special_bytes) + " bytes of text, expected at most " + std::to_string(kMaxSpecialBytes));
  }
  BuildSpecialIndex(v.get());
  SetStripAttributes(file, v.get());
  return v;
}

namespace {

// C isspace in the "C" locale, which llama.cpp's strip attributes use.
bool IsStripSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

// Whether [begin, end) overlaps any of the sorted, disjoint spans.
bool OverlapsAny(const std::vector<TextSpan>& spans, size_t begin, size_t end) {
  auto it =
      std::upper_bound(spans.begin(), spans.end(), begin, [](size_t pos, const TextSpan& s) { return pos < s.end; });
  return it != spans.end() && it->begin < end;
}

}  // namespace

std::vector<Fragment> PartitionSpecial(const Vocab& vocab, std::string_view text, bool parse_special,
                                       const std::vector<TextSpan>* literal) {
  std::vector<Fragment> frags;
  if (text.empty()) return frags;
  frags.push_back({-1, 0, text.size()});

  // Which special tokens occur anywhere in the text: only those can split anything.
  std::vector<int32_t> present;  // ranks in special_by_length
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t i = 0; i < text.size(); ++i) {
    int32_t node = 0;
    for (size_t j = i; j < text.size(); ++j) {
      const auto& next = vocab.trie[node].next;
      auto it = std::lower_bound(next.begin(), next.end(), std::make_pair(bytes[j], int32_t{-1}));
      if (it == next.end() || it->first != bytes[j]) break;
      node = it->second;
      if (vocab.trie[node].rank != -1) present.push_back(vocab.trie[node].rank);
    }
  }
  if (present.empty()) return frags;
  std::sort(present.begin(), present.end());
  present.erase(std::unique(present.begin(), present.end()), present.end());

  std::vector<Fragment> next;
  for (int32_t rank : present) {
    const TokenId id = vocab.special_by_length[rank];
    const TokenData& t = vocab.tokens[id];
    const bool control = (t.attr & (kAttrControl | kAttrUnknown)) != 0;
    if (!parse_special && control) continue;
    // Markup tokens stay text inside literal spans: control tokens, and user-defined ones spelled
    // as markers (`<|...|>`: gpt-oss's harmony markers <|start|>, <|channel|>, <|message|>, <|end|>
    // are user-defined in its vocabulary, as llama.cpp types them). Other user-defined tokens
    // (Gemma's HTML tags and whitespace runs) are ordinary text pieces and still match there.
    const bool marker =
        (t.attr & kAttrUserDefined) != 0 && t.text.size() >= 4 && t.text.starts_with("<|") && t.text.ends_with("|>");
    const bool check_literal = (control || marker) && literal != nullptr && !literal->empty();
    next.clear();
    for (const Fragment& f : frags) {
      if (f.token != -1) {
        next.push_back(f);
        continue;
      }
      const std::string_view raw = text.substr(f.offset, f.length);
      size_t pos = 0, from = 0;
      for (;;) {
        const size_t match = raw.find(t.text, from);
        if (match == std::string_view::npos) break;
        if (check_literal && OverlapsAny(*literal, f.offset + match, f.offset + match + t.text.size())) {
          from = match + 1;  // content spelling a control token stays text
          continue;
        }
        size_t left = match - pos;  // text before the token, less what LSTRIP drops
        if (t.attr & kAttrLStrip) {
          while (left > 0 && IsStripSpace(raw[pos + left - 1])) --left;
        }
        if (left > 0) next.push_back({-1, f.offset + pos, left});
        next.push_back({id, 0, 0});
        pos = match + t.text.size();
        if (t.attr & kAttrRStrip) {
          while (pos < raw.size() && IsStripSpace(raw[pos])) ++pos;
        }
        from = pos;
      }
      if (pos < raw.size()) next.push_back({-1, f.offset + pos, raw.size() - pos});
    }
    frags.swap(next);
  }
  return frags;
}

TokenizerBase::TokenizerBase(std::unique_ptr<Vocab> vocab) : vocab_(std::move(vocab)) {}

void TokenizerBase::BuildPieces() {
  const Vocab& v = *vocab_;
  pieces_.resize(v.tokens.size());
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    const TokenData& t = v.tokens[id];
    if (t.attr & (kAttrUnknown | kAttrControl | kAttrUserDefined)) {
      pieces_[id] = t.text;
    } else if (t.attr & kAttrNormal) {
      pieces_[id] = NormalPiece(t.text);
    } else if (t.attr & kAttrByte) {
      // "<0xXX>" (LoadVocab rejects any other text for a byte token)
      pieces_[id] = std::string(1, static_cast<char>(std::strtol(t.text.substr(3, 2).c_str(), nullptr, 16)));
    }
    // unused / undefined tokens render as nothing
  }
}

std::vector<TokenId> TokenizerBase::Encode(std::string_view text, bool add_special, bool parse_special) const {
  return EncodeFragments(text, add_special, parse_special, nullptr);
}

std::vector<TokenId> TokenizerBase::EncodeTemplated(std::string_view text, bool add_special,
                                                    const std::vector<TextSpan>& literal) const {
  return EncodeFragments(text, add_special, /*parse_special=*/true, &literal);
}

std::vector<TokenId> TokenizerBase::EncodeFragments(std::string_view text, bool add_special, bool parse_special,
                                                    const std::vector<TextSpan>* literal) const {
  const Vocab& v = *vocab_;
  std::vector<TokenId> out;
  if (add_special && v.add_bos) out.push_back(v.bos);
  bool after_special = true;
  for (const Fragment& f : PartitionSpecial(v, text, parse_special, literal)) {
    if (f.token != -1) {
      out.push_back(f.token);
      after_special = true;
    } else {
      EncodeRaw(text.substr(f.offset, f.length), after_special, &out);
      after_special = false;
    }
  }
  if (add_special && v.add_eos) out.push_back(v.eos);
  return out;
}

std::string TokenizerBase::TokenToPiece(TokenId id, bool render_special) const {
  if (!vocab_->Valid(id)) return "";
  if (!render_special && (vocab_->tokens[id].attr & (kAttrUnknown | kAttrControl))) return "";
  return pieces_[id];
}

std::string TokenizerBase::Decode(const std::vector<TokenId>& ids, bool render_special) const {
  const Vocab& v = *vocab_;
  std::string text;
  // llama_detokenize(remove_special=false): with a space prefix, the first token's leading
  // space is dropped.
  bool remove_space = v.add_space_prefix;
  for (TokenId id : ids) {
    std::string piece = TokenToPiece(id, render_special);
    if (remove_space && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
    remove_space = false;
    text += piece;
  }
  if (!v.clean_spaces || text.empty()) return text;

  // clean_up_tokenization_spaces, three passes as llama.cpp does them.
  std::string a;
  a.reserve(text.size());
  a.push_back(text[0]);
  for (size_t i = 1; i < text.size(); ++i) {  // " ?", " !", " .", " ," -> drop the space
    const char x = text[i];
    if (text[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) a.pop_back();
    a.push_back(x);
  }
  std::string b;
  b.reserve(a.size());
  b.push_back(a[0]);
  for (size_t i = 1; i < a.size(); ++i) {  // " ' " -> "'"
    const char x = a[i];
    if (x == '\'' && i + 1 < a.size() && a[i - 1] == ' ' && a[i + 1] == ' ') {
      b.pop_back();
      b.push_back(x);
      a[++i] = '\0';  // the following space is dropped (llama.cpp writes a NUL over it)
      continue;
    }
    b.push_back(x);
  }
  std::string c;
  c.reserve(b.size());
  c.push_back(b[0]);
  for (size_t i = 1; i < b.size(); ++i) {  // " 's", " 'm", " 're", " 've" -> no space
    const char x = b[i];
    if (b[i - 1] == ' ' && x == '\'' && i + 1 < b.size()) {
      const char x1 = b[i + 1];
      if (x1 == 's' || x1 == 'm') {
        c.pop_back();
      } else if (i + 2 < b.size() && ((x1 == 'r' && b[i + 2] == 'e') || (x1 == 'v' && b[i + 2] == 'e'))) {
        c.pop_back();
      }
    }
    c.push_back(x);
  }
  return c;
}

TokenAttr TokenizerBase::attr(TokenId id) const {
  if (!vocab_->Valid(id)) return TokenAttr::kUnknown;
  const uint16_t a = vocab_->tokens[id].attr;
  if (a == 0 || (a & kAttrUnused)) return TokenAttr::kUnused;  // 0: undefined type
  if (a & kAttrControl) return TokenAttr::kControl;
  if (a & kAttrUserDefined) return TokenAttr::kUserDefined;
  if (a & kAttrByte) return TokenAttr::kByte;
  if (a & kAttrUnknown) return TokenAttr::kUnknown;
  return TokenAttr::kNormal;
}

const std::string& TokenizerBase::text(TokenId id) const {
  static const std::string kEmpty;
  return vocab_->Valid(id) ? vocab_->tokens[id].text : kEmpty;
}

}  // namespace tokenizer_internal

Result<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const gguf::GgufFile& file) {
  using namespace tokenizer_internal;
  MR_ASSIGN_OR_RETURN(std::unique_ptr<Vocab> vocab, LoadVocab(file));
  if (vocab->kind == Vocab::Kind::kSpm) return MakeSpmTokenizer(std::move(vocab));
  return MakeBpeTokenizer(std::move(vocab), file);
}

}  // namespace mr
