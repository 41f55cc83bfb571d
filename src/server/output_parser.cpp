#include "server/output_parser.h"

#include <algorithm>

#include "server/json_schema.h"

namespace mr::server {
namespace {

bool IsWs(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

// Length of the longest proper suffix of `s` that is a prefix of `marker`.
size_t PartialSuffix(std::string_view s, std::string_view marker) {
  const size_t max = std::min(s.size(), marker.size() - 1);
  for (size_t n = max; n > 0; --n)
    if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

// What a harmony marker does where the parser meets it outside a header (in a message's body):
// it ends the message (<|end|>; <|call|> and <|return|> end the generation and are no text, but
// should their text come), it starts the next message's header (<|start|>, or <|channel|> with
// the model's <|end|><|start|>assistant skipped), or it is stray markup (<|message|>,
// <|constrain|>), dropped. None of them reaches a text or reasoning block.
enum class MarkerKind { kEnd, kHeader, kStray };

struct MarkerHit {
  size_t pos = std::string::npos;
  size_t len = 0;  // 0: none
  MarkerKind kind = MarkerKind::kStray;
};

const std::vector<std::pair<std::string, MarkerKind>>& HarmonyMarkers() {
  static const std::vector<std::pair<std::string, MarkerKind>> kMarkers = [] {
    const HarmonyMarkup& h = Harmony();
    return std::vector<std::pair<std::string, MarkerKind>>{
        {h.end, MarkerKind::kEnd},        {h.call, MarkerKind::kEnd},       {h.ret, MarkerKind::kEnd},
        {h.start, MarkerKind::kHeader},   {h.channel, MarkerKind::kHeader}, {h.message, MarkerKind::kStray},
        {h.constrain, MarkerKind::kStray}};
  }();
  return kMarkers;
}

// The marker `s` starts with (pos 0), or none; *partial: `s` is a proper prefix of a marker (it
// may become one when more text comes).
MarkerHit HarmonyMarkerAt(std::string_view s, bool* partial) {
  *partial = false;
  for (const auto& [m, kind] : HarmonyMarkers()) {
    if (s.size() < m.size()) {
      *partial |= m.compare(0, s.size(), s) == 0;
    } else if (s.compare(0, m.size(), m) == 0) {
      return {0, m.size(), kind};
    }
  }
  return {};
}

// The first marker in `s`, or none (pos npos).
MarkerHit FindHarmonyMarker(std::string_view s) {
  bool partial;
  for (size_t p = s.find('<'); p != std::string_view::npos; p = s.find('<', p + 1)) {
    MarkerHit m = HarmonyMarkerAt(s.substr(p), &partial);
    if (m.len > 0) {
      m.pos = p;
      return m;
    }
  }
  return {};
}

// Length of the longest proper suffix of `s` that may still become a marker.
size_t HarmonyMarkerPartialSuffix(std::string_view s) {
  size_t keep = 0;
  for (const auto& marker : HarmonyMarkers()) keep = std::max(keep, PartialSuffix(s, marker.first));
  return keep;
}

// `s` without the markers' text (a body passed on as text may hold some inside its strings). In
// one pass, each marker dropped where it ends in the output, so none can form from what is left
// around one ("<|<|end|>end|>").
std::string StripHarmonyMarkers(std::string_view s) {
  std::string out;
  for (const char c : s) {
    out += c;
    if (c != '>') continue;
    for (const auto& marker : HarmonyMarkers()) {
      const std::string& m = marker.first;
      if (out.size() >= m.size() && out.compare(out.size() - m.size(), m.size(), m) == 0) {
        out.resize(out.size() - m.size());
        break;
      }
    }
  }
  return out;
}

// Drops from the front of `s` what would complete a marker that `tail` (the end of what was
// emitted before) begins: text emitted apart, around a marker that was taken out, must not
// spell one once the client joins it ("<|" + "end|>").
void TrimHarmonyMarkerSeam(std::string_view tail, std::string_view* s) {
  for (bool again = true; again && !s->empty();) {
    again = false;
    for (const auto& marker : HarmonyMarkers()) {
      const std::string_view m = marker.first;
      for (size_t n = std::min(tail.size(), m.size() - 1); n > 0 && !again; --n) {
        const std::string_view rest = m.substr(n);
        again = tail.substr(tail.size() - n) == m.substr(0, n) && s->substr(0, rest.size()) == rest;
        if (again) s->remove_prefix(rest.size());
      }
    }
  }
}

// `*tail` keeps the last bytes of what it was and `s` (as many as a marker less one).
void KeepHarmonyTail(std::string* tail, std::string_view s) {
  constexpr size_t kKeep = 12;  // "<|constrain|>", the longest marker, less one
  *tail += s.substr(s.size() - std::min(s.size(), kKeep));
  if (tail->size() > kKeep) tail->erase(0, tail->size() - kKeep);
}

}  // namespace

bool ParseToolCall(std::string_view body, const std::vector<ChatTool>& tools, ChatToolCall* call, std::string* why) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    *why = "tool call is not a JSON object";
    return false;
  }
  auto name = j.find("name");
  if (name == j.end() || !name->is_string()) {
    *why = "tool call has no \"name\"";
    return false;
  }
  nlohmann::ordered_json args = nlohmann::ordered_json::object();
  auto a = j.find("arguments");
  if (a == j.end()) a = j.find("parameters");
  if (a != j.end()) {
    args = *a;
    if (args.is_string()) {  // some models quote the arguments object
      args = nlohmann::ordered_json::parse(a->get<std::string>(), nullptr, false);
      if (args.is_discarded()) {
        *why = "tool call arguments are not JSON";
        return false;
      }
    }
  }
  return ValidateToolCall(name->get<std::string>(), std::move(args), tools, call, why);
}

bool ValidateToolCall(const std::string& n, nlohmann::ordered_json args, const std::vector<ChatTool>& tools,
                      ChatToolCall* call, std::string* why) {
  if (!args.is_object()) {
    *why = "tool call arguments are not an object";
    return false;
  }
  const auto tool = std::find_if(tools.begin(), tools.end(), [&](const ChatTool& t) { return t.name == n; });
  if (tool == tools.end()) {
    *why = "unknown tool \"" + n + "\"";
    return false;
  }
  Status st = ValidateJsonSchema(args, tool->parameters);
  if (!st.ok()) {
    *why = "arguments of \"" + n + "\" do not match its input_schema: " + st.message();
    return false;
  }
  call->name = n;
  call->arguments = std::move(args);
  return true;
}

OutputParser::OutputParser(Options opts) : opts_(std::move(opts)) {
  std::erase_if(opts_.stop_sequences, [](const std::string& s) { return s.empty(); });
  if (opts_.harmony) {
    // The prefill sets the state (a header under way, an opened analysis or final message, a
    // call's arguments); the client has its text already, so nothing of it is emitted. As with
    // the tagged families, whose parser never sees the prefill, stop sequences apply to the
    // generated text only, and a body's text held back at the prefill's end (what may have
    // become a marker) is the client's, not to be emitted later.
    mode_ = Mode::kHarmonyHeader;
    std::vector<ParsedEvent> discarded;
    std::vector<std::string> stops = std::move(opts_.stop_sequences);
    opts_.stop_sequences.clear();
    buf_ = opts_.turn_prefill;
    ProcessHarmony(&discarded, false);
    opts_.stop_sequences = std::move(stops);
    KeepHarmonyTail(&text_tail_, held_ws_);
    if (mode_ == Mode::kHarmonyText || mode_ == Mode::kReasoning) {
      KeepHarmonyTail(mode_ == Mode::kReasoning ? &reasoning_tail_ : &text_tail_, buf_);
      buf_.clear();
    }
    held_ws_.clear();
    tool_calls_ = 0;
  } else if (opts_.start_in_reasoning) {
    mode_ = Mode::kReasoning;
  } else if (opts_.may_open_reasoning && !opts_.reasoning_open.empty()) {
    mode_ = Mode::kMaybeReasoning;
  } else if (!opts_.tool_call_prefill.empty()) {
    mode_ = Mode::kToolCall;
    open_ = opts_.markup.open;
    close_ = opts_.markup.close;
    std::string_view p = opts_.tool_call_prefill;
    if (p.substr(0, open_.size()) == open_) p.remove_prefix(open_.size());
    tool_buf_ = p;
  }
}

std::string OutputParser::CutAtIndent(std::string_view s) {
  std::string shown;
  for (const char ch : s) {
    if (line_head_) {
      if (ch == ' ' || ch == '\t') {
        indent_ += ch;
        continue;
      }
      if (static_cast<int64_t>(indent_.size()) < opts_.min_indent) {
        stopped_ = indent_cut_ = true;
        indent_.clear();
        break;
      }
      shown += indent_;
      indent_.clear();
      line_head_ = false;
    }
    shown += ch;
    line_head_ = ch == '\n';
  }
  return shown;
}

void OutputParser::EmitText(std::string_view s, std::vector<ParsedEvent>* out) {
  if (stopped_) return;
  std::string indented;
  if (opts_.verbatim && opts_.min_indent > 0) {
    indented = CutAtIndent(s);
    s = indented;
    if (s.empty()) return;
  }
  if (skip_ws_ && !opts_.verbatim) {
    while (!s.empty() && IsWs(s.front())) s.remove_prefix(1);
    if (s.empty()) return;
    skip_ws_ = false;
  }
  if (opts_.harmony && held_ws_.empty()) TrimHarmonyMarkerSeam(text_tail_, &s);
  // Hold trailing whitespace: it is dropped if a tool call or the end follows.
  size_t end = s.size();
  while (end > 0 && IsWs(s[end - 1]) && !opts_.verbatim) --end;
  if (end == 0) {
    held_ws_ += s;
    return;
  }
  std::string text = std::move(held_ws_);
  held_ws_.assign(s.substr(end));
  text += s.substr(0, end);
  if (opts_.harmony) KeepHarmonyTail(&text_tail_, text);
  if (!out->empty() && out->back().kind == ParsedEvent::Kind::kText) {
    out->back().text += text;
  } else {
    out->push_back({ParsedEvent::Kind::kText, std::move(text), {}});
  }
}

void OutputParser::EmitReasoning(std::string_view s, std::vector<ParsedEvent>* out) {
  if (opts_.harmony) {
    TrimHarmonyMarkerSeam(reasoning_tail_, &s);
    KeepHarmonyTail(&reasoning_tail_, s);
  }
  if (s.empty()) return;
  if (!out->empty() && out->back().kind == ParsedEvent::Kind::kReasoning) {
    out->back().text += s;
  } else {
    out->push_back({ParsedEvent::Kind::kReasoning, std::string(s), {}});
  }
}

void OutputParser::CompleteToolCall(const std::string& body, std::vector<ParsedEvent>* out) {
  ParsedEvent ev;
  std::string why;
  if (ParseToolCall(body, opts_.tools, &ev.call, &why)) {
    ev.kind = ParsedEvent::Kind::kToolCall;
    out->push_back(std::move(ev));
    ++tool_calls_;
  } else {
    // Not a valid call: the client sees what the model wrote.
    held_ws_.clear();
    EmitText(open_ + body + close_, out);
  }
  skip_ws_ = true;
  held_ws_.clear();
}

bool OutputParser::ParseBareToolCalls(const std::string& body, std::vector<ChatToolCall>* calls) const {
  std::string why;
  if (body.empty() || body[0] != '[') {
    calls->emplace_back();
    return ParseToolCall(body, opts_.tools, &calls->back(), &why);
  }
  // [{"name": ..., "arguments": ...}, ...]: every element must be a valid call, or it is all text.
  const nlohmann::ordered_json a = nlohmann::ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (a.is_discarded() || !a.is_array() || a.empty()) return false;
  for (const auto& e : a) {
    calls->emplace_back();
    if (!e.is_object() || !ParseToolCall(e.dump(), opts_.tools, &calls->back(), &why)) return false;
  }
  return true;
}

void OutputParser::Feed(std::string_view text, std::vector<ParsedEvent>* out) {
  if (stopped_) return;
  buf_ += text;
  Process(out, false);
}

void OutputParser::Finish(std::vector<ParsedEvent>* out) {
  if (stopped_) return;
  Process(out, true);
}

bool OutputParser::JsonStringByte(char c) {
  if (json_in_string_) {
    if (json_escape_)
      json_escape_ = false;
    else if (c == '\\')
      json_escape_ = true;
    else if (c == '"')
      json_in_string_ = false;
    return true;
  }
  json_in_string_ = c == '"';
  return json_in_string_;
}

size_t OutputParser::FindToolCallClose() {
  // The body is JSON: a close tag inside one of its strings ("</tool_call>" in a file's text,
  // "```" in a code argument) is content. Scanned from where the last call stopped, so each
  // byte of a long call is looked at about once, not once per Feed.
  size_t i = tool_close_from_;
  size_t end = std::string::npos;
  for (; i < tool_buf_.size(); ++i) {
    const char c = tool_buf_[i];
    if (JsonStringByte(c) || c != close_[0]) continue;
    const size_t avail = std::min(tool_buf_.size() - i, close_.size());
    if (tool_buf_.compare(i, avail, close_, 0, avail) != 0) continue;
    if (avail == close_.size()) end = i;
    break;  // the close tag, or what may become one when more text comes
  }
  tool_close_from_ = i;
  return end;
}

void OutputParser::Process(std::vector<ParsedEvent>* out, bool final) {
  if (opts_.harmony) {
    ProcessHarmony(out, final);
    return;
  }
  while (!buf_.empty() || (final && (mode_ == Mode::kToolCall || mode_ == Mode::kBareJson))) {
    switch (mode_) {
      case Mode::kMaybeReasoning: {
        // Leading whitespace, then the open tag (a reasoning section) or anything else (the
        // answer, from that point on; the whitespace is the answer's and trimmed there).
        size_t i = 0;
        while (i < buf_.size() && IsWs(buf_[i])) ++i;
        const std::string_view rest = std::string_view(buf_).substr(i);
        const std::string_view open = opts_.reasoning_open;
        if (rest.size() >= open.size() && rest.substr(0, open.size()) == open) {
          buf_.erase(0, i + open.size());
          mode_ = Mode::kReasoning;
          continue;
        }
        if (!final && open.substr(0, rest.size()) == rest) return;  // undecided yet
        mode_ = Mode::kContent;
        continue;
      }
      case Mode::kReasoning: {
        const size_t end = buf_.find(opts_.reasoning_end);
        if (end != std::string::npos) {
          EmitReasoning(std::string_view(buf_).substr(0, end), out);
          buf_.erase(0, end + opts_.reasoning_end.size());
          mode_ = Mode::kContent;
          skip_ws_ = true;
          continue;
        }
        const size_t keep = final ? 0 : PartialSuffix(buf_, opts_.reasoning_end);
        EmitReasoning(std::string_view(buf_).substr(0, buf_.size() - keep), out);
        buf_.erase(0, buf_.size() - keep);
        return;
      }
      case Mode::kContent: {
        if (skip_ws_ && opts_.parse_tool_calls) {
          // At the start of the answer: a bare JSON object may be an untagged tool call.
          size_t i = 0;
          while (i < buf_.size() && IsWs(buf_[i])) ++i;
          buf_.erase(0, i);
          if (buf_.empty()) return;
          if (buf_[0] == '{' || buf_[0] == '[') {  // an object, or an array of them (Mistral's form)
            mode_ = Mode::kBareJson;
            tool_buf_.clear();
            json_depth_ = 0;
            json_in_string_ = json_escape_ = false;
            continue;
          }
        }
        // The earliest marker: a stop sequence or a tool call opening.
        size_t best = std::string::npos;
        size_t best_len = 0;
        int which = -1;                                    // -1 tool call, else stop sequence index
        const ToolCallMarkup::Wrapper* wrapper = nullptr;  // null: the family's own tags
        if (opts_.parse_tool_calls) {
          best = buf_.find(opts_.markup.open);
          best_len = opts_.markup.open.size();
          for (const ToolCallMarkup::Wrapper& w : opts_.markup.wrappers) {
            const size_t f = buf_.find(w.open);
            if (f != std::string::npos && f < best) {
              best = f;
              best_len = w.open.size();
              wrapper = &w;
            }
          }
        }
        for (size_t i = 0; i < opts_.stop_sequences.size(); ++i) {
          const size_t p = buf_.find(opts_.stop_sequences[i]);
          if (p != std::string::npos && (best == std::string::npos || p < best)) {
            best = p;
            best_len = opts_.stop_sequences[i].size();
            which = static_cast<int>(i);
          }
        }
        if (best != std::string::npos) {
          EmitText(std::string_view(buf_).substr(0, best), out);
          if (which >= 0) {
            stopped_ = true;
            matched_stop_ = opts_.stop_sequences[which];
            buf_.clear();
            held_ws_.clear();
            return;
          }
          held_ws_.clear();
          buf_.erase(0, best + best_len);
          open_ = wrapper ? wrapper->open : opts_.markup.open;
          close_ = wrapper ? wrapper->close : opts_.markup.close;
          mode_ = Mode::kToolCall;
          tool_buf_.clear();
          tool_close_from_ = 0;
          json_in_string_ = json_escape_ = false;
          continue;
        }
        size_t keep = 0;
        if (!final) {
          if (opts_.parse_tool_calls) {
            keep = PartialSuffix(buf_, opts_.markup.open);
            for (const ToolCallMarkup::Wrapper& w : opts_.markup.wrappers)
              keep = std::max(keep, PartialSuffix(buf_, w.open));
          }
          for (const std::string& s : opts_.stop_sequences) keep = std::max(keep, PartialSuffix(buf_, s));
        }
        EmitText(std::string_view(buf_).substr(0, buf_.size() - keep), out);
        buf_.erase(0, buf_.size() - keep);
        if (final) held_ws_.clear();
        return;
      }
      case Mode::kBareJson: {
        size_t i = 0;
        bool closed = false;
        for (; i < buf_.size() && !closed; ++i) {
          const char c = buf_[i];
          if (JsonStringByte(c)) continue;
          if (c == '{' || c == '[') {
            ++json_depth_;
          } else if (c == '}' || c == ']') {
            closed = --json_depth_ == 0;
          }
        }
        tool_buf_.append(buf_, 0, i);
        buf_.erase(0, i);
        if (!closed && !final) return;
        const std::string body = std::move(tool_buf_);
        tool_buf_.clear();
        mode_ = Mode::kContent;
        std::vector<ChatToolCall> calls;
        if (closed && ParseBareToolCalls(body, &calls)) {
          for (ChatToolCall& c : calls) {
            ParsedEvent ev;
            ev.kind = ParsedEvent::Kind::kToolCall;
            ev.call = std::move(c);
            out->push_back(std::move(ev));
            ++tool_calls_;
          }
          skip_ws_ = true;
        } else {
          EmitText(body, out);  // plain JSON the model answered with
          if (final) held_ws_.clear();
        }
        continue;
      }
      case Mode::kHarmonyHeader:
      case Mode::kHarmonyText:
      case Mode::kHarmonyCall:
        return;  // only with opts_.harmony, handled above
      case Mode::kToolCall: {
        tool_buf_ += buf_;
        buf_.clear();
        size_t end = FindToolCallClose();
        // Not JSON after all (a quote never closed): the first close tag anywhere ends it.
        if (end == std::string::npos && final) end = tool_buf_.find(close_);
        if (end != std::string::npos) {
          buf_ = tool_buf_.substr(end + close_.size());
          const std::string body = tool_buf_.substr(0, end);
          tool_buf_.clear();
          mode_ = Mode::kContent;
          CompleteToolCall(body, out);
          continue;
        }
        if (final) {
          const std::string body = std::move(tool_buf_);
          tool_buf_.clear();
          mode_ = Mode::kContent;
          CompleteToolCall(body, out);
          held_ws_.clear();
        }
        return;
      }
    }
  }
}

// Harmony channels (gpt-oss): see output_parser.h.

namespace {

// A header longer than this is no header (the longest real one, `<|start|>assistant
// to=functions.NAME<|channel|>commentary <|constrain|>json`, is ~60 bytes besides the name).
constexpr size_t kMaxHarmonyHeader = 320;

// Whether `s` (after whitespace) is, or may still become, a message header: it starts with what
// a header starts with (or with the <|end|> of the message before).
bool MayBeHarmonyHeader(std::string_view s) {
  const HarmonyMarkup& h = Harmony();
  while (!s.empty() && IsWs(s.front())) s.remove_prefix(1);
  for (const std::string* m : {&h.start, &h.channel, &h.recipient, &h.end}) {
    const size_t n = std::min(s.size(), m->size());
    if (s.compare(0, n, *m, 0, n) == 0) return true;
  }
  return false;
}

// The word at the start of `s`: up to whitespace or the next marker.
std::string_view HeaderWord(std::string_view s) {
  size_t n = 0;
  while (n < s.size() && !IsWs(s[n]) && s[n] != '<') ++n;
  return s.substr(0, n);
}

}  // namespace

void OutputParser::StartHarmonyMessage(std::string_view header) {
  const HarmonyMarkup& h = Harmony();
  std::string_view channel, recipient;
  if (const size_t c = header.find(h.channel); c != std::string_view::npos)
    channel = HeaderWord(header.substr(c + h.channel.size()));
  if (const size_t r = header.find(h.recipient); r != std::string_view::npos)
    recipient = HeaderWord(header.substr(r + h.recipient.size()));
  if (!recipient.empty() && recipient != "assistant") {
    mode_ = Mode::kHarmonyCall;
    call_name_ = recipient;
    tool_buf_.clear();
    json_depth_ = 0;
    json_in_string_ = json_escape_ = false;
  } else if (channel == h.analysis) {
    mode_ = Mode::kReasoning;
  } else {
    mode_ = Mode::kHarmonyText;  // final, or a commentary preamble
  }
}

void OutputParser::CompleteHarmonyCall(const std::string& body, std::vector<ParsedEvent>* out) {
  const std::string& functions = Harmony().functions;
  ParsedEvent ev;
  std::string why;
  bool valid = false;
  if (opts_.parse_tool_calls && call_name_.compare(0, functions.size(), functions) == 0) {
    nlohmann::ordered_json args = nlohmann::ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
    valid = !args.is_discarded() &&
            ValidateToolCall(call_name_.substr(functions.size()), std::move(args), opts_.tools, &ev.call, &why);
  }
  if (valid) {
    ev.kind = ParsedEvent::Kind::kToolCall;
    out->push_back(std::move(ev));
    ++tool_calls_;
  } else {
    held_ws_.clear();
    EmitText(StripHarmonyMarkers(body), out);  // not a call: the client sees the arguments the model wrote
  }
  skip_ws_ = true;
  held_ws_.clear();
}

void OutputParser::ProcessHarmony(std::vector<ParsedEvent>* out, bool final) {
  const HarmonyMarkup& h = Harmony();
  while (!buf_.empty() || (final && mode_ == Mode::kHarmonyCall)) {
    switch (mode_) {
      case Mode::kHarmonyHeader: {
        const size_t m = buf_.find(h.message);
        const std::string_view header = std::string_view(buf_).substr(0, m);
        if (header.size() > kMaxHarmonyHeader || !MayBeHarmonyHeader(header)) {
          // No header: the model answered in plain text. The marker it may start with goes (the
          // text would hand it back here).
          size_t i = 0;
          while (i < buf_.size() && IsWs(buf_[i])) ++i;
          bool partial;
          buf_.erase(i, HarmonyMarkerAt(std::string_view(buf_).substr(i), &partial).len);
          mode_ = Mode::kHarmonyText;
          continue;
        }
        if (m == std::string::npos) {
          if (final) buf_.clear();  // a header the end cut off: routing, nothing to show
          return;
        }
        StartHarmonyMessage(header);
        buf_.erase(0, m + h.message.size());
        continue;
      }
      case Mode::kReasoning:  // an analysis message
      case Mode::kHarmonyText: {
        // The body runs to the first marker (or stop sequence: text only).
        const bool text = mode_ == Mode::kHarmonyText;
        const auto emit = [&](std::string_view s) { text ? EmitText(s, out) : EmitReasoning(s, out); };
        MarkerHit hit = FindHarmonyMarker(buf_);
        int stop = -1;
        for (size_t i = 0; text && i < opts_.stop_sequences.size(); ++i) {
          const size_t p = buf_.find(opts_.stop_sequences[i]);
          if (p != std::string::npos && p < hit.pos) {
            hit.pos = p;
            hit.len = opts_.stop_sequences[i].size();
            stop = static_cast<int>(i);
          }
        }
        if (hit.pos != std::string::npos) {
          emit(std::string_view(buf_).substr(0, hit.pos));
          if (stop >= 0) {
            stopped_ = true;
            matched_stop_ = opts_.stop_sequences[stop];
            buf_.clear();
            held_ws_.clear();
            return;
          }
          if (hit.kind == MarkerKind::kHeader) {
            buf_.erase(0, hit.pos);
            mode_ = Mode::kHarmonyHeader;
          } else {
            buf_.erase(0, hit.pos + hit.len);
            if (hit.kind == MarkerKind::kEnd) mode_ = Mode::kHarmonyHeader;
          }
          continue;
        }
        size_t keep = 0;
        if (!final) {
          // What may become a marker, with the end of what was emitted before (the seam that
          // EmitText / EmitReasoning trim).
          const std::string& tail = text ? text_tail_ : reasoning_tail_;
          keep = std::min(buf_.size(), HarmonyMarkerPartialSuffix(text && !held_ws_.empty() ? buf_ : tail + buf_));
          for (size_t i = 0; text && i < opts_.stop_sequences.size(); ++i)
            keep = std::max(keep, PartialSuffix(buf_, opts_.stop_sequences[i]));
        }
        emit(std::string_view(buf_).substr(0, buf_.size() - keep));
        buf_.erase(0, buf_.size() - keep);
        if (final) held_ws_.clear();
        return;
      }
      case Mode::kHarmonyCall: {
        // The arguments: an object, complete when it closes (json_depth_ 0: not begun, -1: the
        // body is no object). A marker outside the object's strings cannot be JSON: it ends the
        // body (a call the model broke off with <|end|> or <|call|>, or the next header), which
        // is then malformed. Each byte is looked at once (what may be a marker's start, once per
        // Feed until decided).
        size_t i = 0;
        bool closed = false;
        MarkerHit cut;
        for (; i < buf_.size() && !closed; ++i) {
          const char c = buf_[i];
          if (c == '<' && !(json_depth_ > 0 && json_in_string_)) {
            bool partial;
            const MarkerHit at = HarmonyMarkerAt(std::string_view(buf_).substr(i), &partial);
            if (at.len > 0) {
              cut = at;
              break;
            }
            if (partial && !final) break;  // decided by what comes next
          }
          tool_buf_ += c;
          if (json_depth_ < 0 || (json_depth_ == 0 && IsWs(c))) continue;
          if (json_depth_ == 0 && c != '{') {
            json_depth_ = -1;
            continue;
          }
          if (JsonStringByte(c)) continue;
          if (c == '{' || c == '[') {
            ++json_depth_;
          } else if ((c == '}' || c == ']') && json_depth_ > 0) {
            closed = --json_depth_ == 0;
          }
        }
        buf_.erase(0, i);
        if (cut.len > 0 && cut.kind != MarkerKind::kHeader) buf_.erase(0, cut.len);
        if (!closed && cut.len == 0 && final) {
          // Cut off by the end inside a string that never closed: not JSON after all; the first
          // marker anywhere ends it, as outside strings.
          const MarkerHit any = FindHarmonyMarker(tool_buf_);
          if (any.len > 0) {
            buf_ = tool_buf_.substr(any.pos + (any.kind == MarkerKind::kHeader ? 0 : any.len)) + buf_;
            tool_buf_.resize(any.pos);
          }
        }
        if (!closed && cut.len == 0 && !final) return;
        // Closed, ended by a marker or cut off by the end (then it does not parse and is text).
        const std::string body = std::move(tool_buf_);
        tool_buf_.clear();
        mode_ = Mode::kHarmonyHeader;
        CompleteHarmonyCall(body, out);
        if (final && buf_.empty()) return;
        continue;
      }
      default:
        return;  // the tagged modes: not used with harmony
    }
  }
}

}  // namespace mr::server
