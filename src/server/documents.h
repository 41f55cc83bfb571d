// Anthropic `document` content blocks as prompt text: plain-text documents, content-block
// documents, and base64 PDFs read with poppler (text per page, in page order, each page headed
// by its label). A title and context, when given, come first.
//
// PDFs arrive from anywhere: a file that is not a PDF, is damaged, encrypted or has more than
// kMaxPdfPages pages gets an actionable InvalidArgument, never a crash; poppler's own messages
// are silenced. URL and file sources are refused (the server has no network and no Files API).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace mr::server {

inline constexpr int kMaxPdfPages = 2000;

// The pages' text of a PDF, in page order, with each page's label (its printed number, e.g.
// "iv"; the 1-based index when the file has none).
struct PdfPage {
  std::string label;
  std::string text;
};
Result<std::vector<PdfPage>> PdfPages(std::string_view pdf_bytes);

// Strict base64 (RFC 4648, padding required, no whitespace).
Result<std::string> DecodeBase64(std::string_view s);

// The prompt text of one document block (`where` names it in errors). Citations are refused.
Result<std::string> DocumentText(const nlohmann::ordered_json& block, const std::string& where);

}  // namespace mr::server
