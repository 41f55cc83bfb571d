#include "server/documents.h"

#include <poppler/cpp/poppler-document.h>
#include <poppler/cpp/poppler-global.h>
#include <poppler/cpp/poppler-page.h>

#include <memory>
#include <mutex>

namespace mr::server {
namespace {

using Json = nlohmann::ordered_json;

void SilencePoppler() {
  static std::once_flag once;
  std::call_once(once, [] { poppler::set_debug_error_function([](const std::string&, void*) {}, nullptr); });
}

std::string Utf8(const poppler::ustring& s) {
  const poppler::byte_array b = s.to_utf8();
  return std::string(b.begin(), b.end());
}

std::string StringField(const Json& b, const char* key) {
  return b.contains(key) && b[key].is_string() ? b[key].get<std::string>() : "";
}

}  // namespace

Result<std::string> DecodeBase64(std::string_view s) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  if (s.size() % 4 != 0) return InvalidArgument("not valid base64 (the length is not a multiple of 4)");
  std::string out;
  out.reserve(s.size() / 4 * 3);
  for (size_t i = 0; i < s.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s[i + k];
      if (c == '=' && i + 4 == s.size() && k >= 2) {
        v[k] = 0;
        ++pad;
        continue;
      }
      if (pad > 0 || (v[k] = value(c)) < 0) return InvalidArgument("not valid base64");
    }
    const uint32_t n = (uint32_t(v[0]) << 18) | (uint32_t(v[1]) << 12) | (uint32_t(v[2]) << 6) | uint32_t(v[3]);
    out.push_back(static_cast<char>(n >> 16));
    if (pad < 2) out.push_back(static_cast<char>((n >> 8) & 0xff));
    if (pad < 1) out.push_back(static_cast<char>(n & 0xff));
  }
  return out;
}

Result<std::vector<PdfPage>> PdfPages(std::string_view bytes) {
  SilencePoppler();
  if (bytes.substr(0, std::min<size_t>(bytes.size(), 1024)).find("%PDF-") == std::string_view::npos)
    return InvalidArgument("the data is not a PDF (no %PDF- header)");
  poppler::byte_array data(bytes.begin(), bytes.end());
  std::unique_ptr<poppler::document> doc(
      poppler::document::load_from_raw_data(data.data(), static_cast<int>(data.size())));
  if (!doc) return InvalidArgument("the PDF could not be read (damaged or not a PDF); send its text instead");
  if (doc->is_locked() || doc->is_encrypted())
    return InvalidArgument("the PDF is encrypted or password-protected; send an unencrypted copy or its text");
  const int n = doc->pages();
  if (n > kMaxPdfPages)
    return InvalidArgument("the PDF has " + std::to_string(n) + " pages; at most " + std::to_string(kMaxPdfPages) +
                           " are read");
  std::vector<PdfPage> pages;
  for (int i = 0; i < n; ++i) {
    std::unique_ptr<poppler::page> p(doc->create_page(i));
    PdfPage page;
    if (p) {
      page.label = Utf8(p->label());
      page.text = Utf8(p->text(poppler::rectf(), poppler::page::physical_layout));
    }
    if (page.label.empty()) page.label = std::to_string(i + 1);
    while (!page.text.empty() && (page.text.back() == '\n' || page.text.back() == ' ' || page.text.back() == '\f'))
      page.text.pop_back();
    pages.push_back(std::move(page));
  }
  return pages;
}

Result<std::string> DocumentText(const Json& b, const std::string& where) {
  if (b.contains("citations") && !b["citations"].is_null()) {
    const Json& c = b["citations"];
    if (!c.is_object()) return InvalidArgument(where + ".citations: expected an object");
    if (c.contains("enabled") && !c["enabled"].is_null() && !c["enabled"].is_boolean())
      return InvalidArgument(where + ".citations.enabled: expected a boolean");
    if (c.contains("enabled") && c["enabled"] == true)
      return InvalidArgument(where +
                             ".citations: citations are not supported by this server; send the document without "
                             "\"citations\"");
  }
  const Json src = b.contains("source") ? b["source"] : Json();
  const std::string type = src.is_object() ? StringField(src, "type") : "";
  std::string body;
  if (type == "text") {
    if (!src.contains("data") || !src["data"].is_string())
      return InvalidArgument(where + ".source.data: field required");
    body = src["data"].get<std::string>();
  } else if (type == "content") {
    const Json c = src.contains("content") ? src["content"] : Json();
    if (c.is_string()) {
      body = c.get<std::string>();
    } else if (c.is_array()) {
      for (const Json& part : c) {
        if (!part.is_object() || StringField(part, "type") != "text" || !part.contains("text") ||
            !part["text"].is_string())
          return InvalidArgument(where + ".source.content: only text blocks are supported by this text-only model");
        body += (body.empty() ? "" : "\n\n") + part["text"].get<std::string>();
      }
    } else {
      return InvalidArgument(where + ".source.content: expected a string or an array of text blocks");
    }
  } else if (type == "base64") {
    const std::string media = StringField(src, "media_type");
    if (media != "application/pdf")
      return InvalidArgument(where + ".source.media_type: expected \"application/pdf\" for a base64 document");
    if (!src.contains("data") || !src["data"].is_string())
      return InvalidArgument(where + ".source.data: field required");
    Result<std::string> pdf = DecodeBase64(src["data"].get<std::string>());
    if (!pdf.ok()) return InvalidArgument(where + ".source.data: " + pdf.status().message());
    Result<std::vector<PdfPage>> pages = PdfPages(*pdf);
    if (!pages.ok()) return InvalidArgument(where + ".source: " + pages.status().message());
    for (size_t i = 0; i < pages->size(); ++i) {
      const PdfPage& p = (*pages)[i];
      body += (i ? "\n\n" : "") + std::string("--- Page ") + p.label + " ---\n" + p.text;
    }
  } else if (type == "url") {
    return InvalidArgument(where +
                           ".source: URL documents cannot be fetched (this server has no network access); send "
                           "the file as {\"type\": \"base64\", \"media_type\": \"application/pdf\", \"data\": ...}");
  } else if (type == "file") {
    return InvalidArgument(where + ".source: the Files API is not supported; send the file as base64 data");
  } else {
    return InvalidArgument(where + ".source.type: expected \"text\", \"base64\" or \"content\"");
  }
  std::string head;
  if (const std::string title = StringField(b, "title"); !title.empty()) head += "Document: " + title + "\n";
  if (const std::string context = StringField(b, "context"); !context.empty()) head += context + "\n";
  return head.empty() ? body : head + "\n" + body;
}

}  // namespace mr::server
