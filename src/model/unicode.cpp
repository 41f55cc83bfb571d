#include "model/unicode.h"

#include <algorithm>
#include <array>
#include <memory>

namespace mr::unicode {
namespace {

constexpr uint32_t kMaxCodepoint = 0x110000;

// Full table, one byte per code point (1.1 MB), expanded once from the ranges.
const uint8_t* CategoryTable() {
  static const std::unique_ptr<uint8_t[]> table = [] {
    auto t = std::make_unique<uint8_t[]>(kMaxCodepoint);
    for (size_t i = 0; i < kCategoryRangeCount; ++i) {
      const uint32_t first = kCategoryRanges[i] >> 8;
      const uint32_t last = i + 1 < kCategoryRangeCount ? (kCategoryRanges[i + 1] >> 8) : kMaxCodepoint;
      std::fill(t.get() + first, t.get() + last, static_cast<uint8_t>(kCategoryRanges[i] & 0xff));
    }
    return t;
  }();
  return table.get();
}

struct ByteMaps {
  std::array<std::string, 256> to_unicode;
  std::array<int16_t, 512> from_cpt;  // stand-ins are all below 512
};

const ByteMaps& GetByteMaps() {
  static const ByteMaps maps = [] {
    ByteMaps m;
    m.from_cpt.fill(-1);
    auto printable = [](int b) {
      return (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    };
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const uint32_t cpt = printable(b) ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
      AppendUtf8(cpt, &m.to_unicode[b]);
      m.from_cpt[cpt] = static_cast<int16_t>(b);
    }
    return m;
  }();
  return maps;
}

// Flags of a code point as the splitters see it: category in the low byte, kWs for \s. A
// position outside the current piece has flags 0 (every code point has a category bit).
constexpr uint16_t kWs = 0x100;
constexpr uint32_t kOutOfRange = 0xFFFFFFFF;

uint32_t AsciiLower(uint32_t c) {
  return (c >= 'A' && c <= 'Z') ? c + ('a' - 'A') : c;
}

// A view of cpts[ini, end) with llama.cpp's out-of-range conventions.
class Piece {
 public:
  Piece(const std::vector<uint32_t>& cpts, size_t ini, size_t end, std::vector<size_t>* out)
      : cpts_(cpts), ini_(ini), end_(end), prev_end_(ini), out_(out) {}

  uint32_t Cpt(size_t pos) const { return pos >= ini_ && pos < end_ ? cpts_[pos] : kOutOfRange; }
  uint16_t Flags(size_t pos) const {
    if (pos < ini_ || pos >= end_) return 0;
    const uint32_t c = cpts_[pos];
    return static_cast<uint16_t>(CategoryOf(c) | (IsWhitespace(c) ? kWs : 0));
  }
  // Ends the current word at `end`; returns its length (0 adds nothing).
  size_t Add(size_t end) {
    const size_t len = end - prev_end_;
    if (len > 0) out_->push_back(len);
    prev_end_ = end;
    return len;
  }
  size_t ini() const { return ini_; }
  size_t end() const { return end_; }

 private:
  const std::vector<uint32_t>& cpts_;
  size_t ini_, end_, prev_end_;
  std::vector<size_t>* out_;
};

bool IsLetter(uint16_t f) {
  return f & kLetter;
}
bool IsNumber(uint16_t f) {
  return f & kNumber;
}
bool IsWs(uint16_t f) {
  return f & kWs;
}
// [^\s\p{L}\p{N}] inside the piece.
bool IsOther(uint16_t f) {
  return f != 0 && !(f & (kWs | kLetter | kNumber));
}

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)  (and a trailing \s+)
void SplitGpt2(Piece& p) {
  size_t pos = p.ini();
  while (pos < p.end()) {
    const uint32_t cpt = p.Cpt(pos);
    const uint16_t flags = p.Flags(pos);

    if (cpt == '\'' && pos + 1 < p.end()) {
      const uint32_t next = p.Cpt(pos + 1);
      if (next == 's' || next == 't' || next == 'm' || next == 'd') {
        pos += p.Add(pos + 2);
        continue;
      }
      if (pos + 2 < p.end()) {
        const uint32_t next2 = p.Cpt(pos + 2);
        if ((next == 'r' && next2 == 'e') || (next == 'v' && next2 == 'e') || (next == 'l' && next2 == 'l')) {
          pos += p.Add(pos + 3);
          continue;
        }
      }
    }

    uint16_t f2 = cpt == ' ' ? p.Flags(pos + 1) : flags;
    if (IsLetter(f2) || IsNumber(f2) || IsOther(f2)) {
      // One class, decided by the first character after the optional space.
      const auto same = IsLetter(f2) ? IsLetter : IsNumber(f2) ? IsNumber : IsOther;
      pos += (cpt == ' ');
      while (same(f2)) f2 = p.Flags(++pos);
      p.Add(pos);
      continue;
    }

    size_t n_ws = 0;
    while (IsWs(p.Flags(pos + n_ws))) ++n_ws;
    if (n_ws > 1 && p.Cpt(pos + n_ws) != kOutOfRange) {  // \s+(?!\S): leave the last one
      pos += n_ws - 1;
      p.Add(pos);
      continue;
    }
    if (n_ws > 0) {
      pos += n_ws;
      p.Add(pos);
      continue;
    }
    p.Add(++pos);  // no rule matched
  }
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}
//   | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
void SplitQwen2Llama3(Piece& p, size_t max_digits) {
  size_t pos = p.ini();
  while (pos < p.end()) {
    const uint32_t cpt = p.Cpt(pos);
    const uint16_t flags = p.Flags(pos);

    if (cpt == '\'' && pos + 1 < p.end()) {
      const uint32_t next = AsciiLower(p.Cpt(pos + 1));
      if (next == 's' || next == 't' || next == 'm' || next == 'd') {
        pos += p.Add(pos + 2);
        continue;
      }
      if (pos + 2 < p.end()) {
        const uint32_t next2 = AsciiLower(p.Cpt(pos + 2));
        if ((next == 'r' && next2 == 'e') || (next == 'v' && next2 == 'e') || (next == 'l' && next2 == 'l')) {
          pos += p.Add(pos + 3);
          continue;
        }
      }
    }

    if (!(cpt == '\r' || cpt == '\n' || IsNumber(flags))) {
      if (IsLetter(flags) || IsLetter(p.Flags(pos + 1))) {
        ++pos;  // the letter itself, or the one optional non-letter before the letters
        while (IsLetter(p.Flags(pos))) ++pos;
        p.Add(pos);
        continue;
      }
    }

    if (IsNumber(flags)) {
      size_t start = pos;
      while (IsNumber(p.Flags(pos))) {
        if (++pos - start >= max_digits) {
          p.Add(pos);
          start = pos;
        }
      }
      p.Add(pos);
      continue;
    }

    uint16_t f2 = cpt == ' ' ? p.Flags(pos + 1) : flags;
    // As in llama.cpp the guard tests `flags` (this position), the loop `f2`.
    if (!(f2 & (kWs | kLetter | kNumber)) && flags != 0) {
      pos += (cpt == ' ');
      while (IsOther(f2)) f2 = p.Flags(++pos);
      uint32_t c2 = p.Cpt(pos);
      while (c2 == '\r' || c2 == '\n') c2 = p.Cpt(++pos);
      p.Add(pos);
      continue;
    }

    size_t n_ws = 0;
    size_t last_newline_end = 0;
    while (IsWs(p.Flags(pos + n_ws))) {
      const uint32_t c2 = p.Cpt(pos + n_ws);
      if (c2 == '\r' || c2 == '\n') last_newline_end = pos + n_ws + 1;
      ++n_ws;
    }
    if (last_newline_end > 0) {  // \s*[\r\n]+
      pos = last_newline_end;
      p.Add(pos);
      continue;
    }
    if (n_ws > 1 && p.Cpt(pos + n_ws) != kOutOfRange) {  // \s+(?!\S)
      pos += n_ws - 1;
      p.Add(pos);
      continue;
    }
    if (n_ws > 0) {
      pos += n_ws;
      p.Add(pos);
      continue;
    }
    p.Add(++pos);
  }
}

// llama.cpp has no hand-written splitter for this pre-tokenizer: it runs the regex with
// std::regex (ECMAScript: the first alternative that matches wins, quantifiers greedy with
// backtracking) over a copy of the text in which every non-ASCII code point is one byte standing
// for its class (letter, number, whitespace, other). The rules below are that regex's matches,
// derived per alternative; every code point starts a match (it is a letter, a number, \s or
// [^\s\p{L}\p{N}]), so no text is left between matches.
void SplitGpt4o(Piece& p) {
  // U = [^a-z] and L = [^A-Z] under the lookahead (?=\p{L}).
  const auto upper = [&](size_t i) { return IsLetter(p.Flags(i)) && !(p.Cpt(i) >= 'a' && p.Cpt(i) <= 'z'); };
  const auto lower = [&](size_t i) { return IsLetter(p.Flags(i)) && !(p.Cpt(i) >= 'A' && p.Cpt(i) <= 'Z'); };
  // (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])? at `i`: its length.
  const auto contraction = [&](size_t i) -> size_t {
    if (p.Cpt(i) != '\'') return 0;
    const uint32_t c1 = AsciiLower(p.Cpt(i + 1));
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
    const uint32_t c2 = AsciiLower(p.Cpt(i + 2));
    return (c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l') ? 3 : 0;
  };
  size_t pos = p.ini();
  while (pos < p.end()) {
    const uint32_t cpt = p.Cpt(pos);
    const uint16_t flags = p.Flags(pos);

    // [^\r\n\p{L}\p{N}]?U*L+C? | [^\r\n\p{L}\p{N}]?U+L*C?  (when the optional first character
    // is there, trying without it cannot match: it is no letter).
    const bool lead = cpt != '\r' && cpt != '\n' && !IsLetter(flags) && !IsNumber(flags);
    const size_t first = pos + (lead ? 1 : 0);
    size_t n_upper = 0;
    while (upper(first + n_upper)) ++n_upper;
    size_t end = first;
    // First alternative: U* gives back code points until one that is also L follows (a
    // non-ASCII letter within the run, or a-z after it); then L+ runs as far as it goes.
    for (size_t j = n_upper + 1; j-- > 0;) {
      if (lower(first + j)) {
        end = first + j;
        while (lower(end)) ++end;
        break;
      }
    }
    if (end == first) end = first + n_upper;  // second alternative: U+ (L* is empty here)
    if (end > first) {
      end += contraction(end);
      pos += p.Add(end);
      continue;
    }

    if (IsNumber(flags)) {  // \p{N}{1,3}
      size_t n = 1;
      while (n < 3 && IsNumber(p.Flags(pos + n))) ++n;
      pos += p.Add(pos + n);
      continue;
    }

    // ` ?[^\s\p{L}\p{N}]+[\r\n/]*`
    const size_t other = pos + (cpt == ' ' ? 1 : 0);
    if (IsOther(p.Flags(other))) {
      end = other;
      while (IsOther(p.Flags(end))) ++end;
      while (p.Cpt(end) == '\r' || p.Cpt(end) == '\n' || p.Cpt(end) == '/') ++end;
      pos += p.Add(end);
      continue;
    }

    // Whitespace: \s*[\r\n]+ (up to the run's last CR/LF), else \s+(?!\S) (all but the last
    // when something follows), else \s+.
    size_t n_ws = 0;
    size_t last_newline_end = 0;
    while (IsWs(p.Flags(pos + n_ws))) {
      const uint32_t c2 = p.Cpt(pos + n_ws);
      if (c2 == '\r' || c2 == '\n') last_newline_end = pos + n_ws + 1;
      ++n_ws;
    }
    if (last_newline_end > 0) {
      end = last_newline_end;
    } else if (n_ws > 1 && p.Cpt(pos + n_ws) != kOutOfRange) {
      end = pos + n_ws - 1;
    } else {
      end = pos + n_ws;
    }
    pos += p.Add(end);
  }
}

}  // namespace

uint8_t CategoryOf(uint32_t cpt) {
  return cpt < kMaxCodepoint ? CategoryTable()[cpt] : static_cast<uint8_t>(kUndefined);
}

bool IsWhitespace(uint32_t c) {
  if (c < 0x80) return (c >= 0x09 && c <= 0x0d) || c == 0x20;
  return c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
         c == 0x202f || c == 0x205f || c == 0x3000;
}

std::vector<uint32_t> DecodeUtf8(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  const auto* b = reinterpret_cast<const uint8_t*>(s.data());
  const size_t n = s.size();
  auto cont = [&](size_t i) { return i < n && (b[i] & 0xc0) == 0x80; };
  size_t i = 0;
  while (i < n) {
    const uint8_t b0 = b[i];
    uint32_t cpt = 0xfffd;
    size_t len = 1;
    if (b0 < 0x80) {
      cpt = b0;
    } else if ((b0 & 0x40) == 0) {
      // stray continuation byte
    } else if ((b0 & 0x20) == 0) {
      if (cont(i + 1)) cpt = ((b0 & 0x1fu) << 6) | (b[i + 1] & 0x3fu), len = 2;
    } else if ((b0 & 0x10) == 0) {
      if (cont(i + 1) && cont(i + 2)) {
        cpt = ((b0 & 0x0fu) << 12) | ((b[i + 1] & 0x3fu) << 6) | (b[i + 2] & 0x3fu);
        len = 3;
      }
    } else if ((b0 & 0x08) == 0) {
      if (cont(i + 1) && cont(i + 2) && cont(i + 3)) {
        cpt = ((b0 & 0x07u) << 18) | ((b[i + 1] & 0x3fu) << 12) | ((b[i + 2] & 0x3fu) << 6) | (b[i + 3] & 0x3fu);
        len = 4;
        if (cpt >= kMaxCodepoint) cpt = 0xfffd;
      }
    }
    out.push_back(cpt);
    i += len;
  }
  return out;
}

size_t WellFormedUtf8Length(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t c = byte(i);
  if (c < 0x80) return 1;
  size_t len = 0;
  uint8_t lo = 0x80, hi = 0xbf;  // bounds of the second byte
  if (c >= 0xc2 && c <= 0xdf) {
    len = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    len = 3;
    if (c == 0xe0) lo = 0xa0;  // overlong
    if (c == 0xed) hi = 0x9f;  // surrogates
  } else if (c >= 0xf0 && c <= 0xf4) {
    len = 4;
    if (c == 0xf0) lo = 0x90;  // overlong
    if (c == 0xf4) hi = 0x8f;  // above U+10FFFF
  } else {
    return 0;
  }
  if (i + len > s.size() || byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (size_t k = 2; k < len; ++k)
    if (byte(i + k) < 0x80 || byte(i + k) > 0xbf) return 0;
  return len;
}

void AppendUtf8(uint32_t cpt, std::string* out) {
  if (cpt < 0x80) {
    out->push_back(static_cast<char>(cpt));
  } else if (cpt < 0x800) {
    out->push_back(static_cast<char>(0xc0 | (cpt >> 6)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3f)));
  } else if (cpt < 0x10000) {
    out->push_back(static_cast<char>(0xe0 | (cpt >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3f)));
  } else {
    out->push_back(static_cast<char>(0xf0 | ((cpt >> 18) & 0x07)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 12) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3f)));
  }
}

const std::string& ByteToUnicode(uint8_t b) {
  return GetByteMaps().to_unicode[b];
}

int UnicodeToByte(uint32_t cpt) {
  return cpt < 512 ? GetByteMaps().from_cpt[cpt] : -1;
}

std::vector<size_t> PreTokenize(PreSplit kind, const std::vector<uint32_t>& cpts) {
  std::vector<size_t> out;
  if (cpts.empty()) return out;
  out.reserve(cpts.size() / 3 + 1);
  switch (kind) {
    case PreSplit::kGpt2: {
      Piece p(cpts, 0, cpts.size(), &out);
      SplitGpt2(p);
      break;
    }
    case PreSplit::kDigitsGpt2: {
      // First pass (the regex \p{N}): every number code point is a piece of its own; the
      // GPT-2 rules then run inside each piece without seeing its neighbours.
      size_t start = 0;
      auto flush = [&](size_t end) {
        if (end > start) {
          Piece p(cpts, start, end, &out);
          SplitGpt2(p);
        }
        start = end;
      };
      for (size_t i = 0; i < cpts.size(); ++i) {
        if (CategoryOf(cpts[i]) & kNumber) {
          flush(i);
          flush(i + 1);
        }
      }
      flush(cpts.size());
      break;
    }
    case PreSplit::kQwen2: {
      Piece p(cpts, 0, cpts.size(), &out);
      SplitQwen2Llama3(p, 1);
      break;
    }
    case PreSplit::kLlama3: {
      Piece p(cpts, 0, cpts.size(), &out);
      SplitQwen2Llama3(p, 3);
      break;
    }
    case PreSplit::kGpt4o: {
      Piece p(cpts, 0, cpts.size(), &out);
      SplitGpt4o(p);
      break;
    }
  }
  return out;
}

}  // namespace mr::unicode
