#include "model/catalog.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace mr::model {
namespace {

const char* kSha = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

// A valid one-model catalog; `patch` replaces the text of one field for error tests.
std::string OneModel(const std::string& extra_fields = "", const std::string& parts = "") {
  std::string p = parts.empty() ? R"([{"package": "pkg-a", "version": "1.0", "member": "a/x.bin", "size_bytes": 6},
                           {"package": "pkg-b", "version": "1.0", "member": "b/x.bin", "size_bytes": 4}])"
                                : parts;
  return std::string(R"({"version": 1, "models": [{"name": "tiny", "aliases": ["t"],)") +
         R"("architecture": "llama", "file": "tiny.gguf", "size_bytes": 10, "sha256": ")" + kSha +
         R"(", "status": "confirmed", "parts": )" + p + extra_fields + "}]}";
}

TEST(Catalog, ParsesValidCatalog) {
  auto cat = ParseCatalog(OneModel(R"(, "sampling": {"temperature": 0.5, "top_k": 40, "source": "x"})"));
  ASSERT_TRUE(cat.ok()) << cat.status().message();
  ASSERT_EQ(cat->models.size(), 1u);
  const CatalogEntry& e = cat->models[0];
  EXPECT_EQ(e.name, "tiny");
  EXPECT_EQ(e.file, "tiny.gguf");
  EXPECT_EQ(e.size_bytes, 10);
  ASSERT_EQ(e.parts.size(), 2u);
  EXPECT_EQ(e.parts[1].package, "pkg-b");
  EXPECT_EQ(e.parts[1].member, "b/x.bin");
  EXPECT_EQ(*e.sampling.temperature, 0.5);
  EXPECT_EQ(*e.sampling.top_k, 40);
  EXPECT_FALSE(e.sampling.top_p.has_value());
  EXPECT_EQ(cat->Find("t"), &e);
  EXPECT_EQ(cat->Find("tiny"), &e);
  EXPECT_EQ(cat->Find("nope"), nullptr);
  EXPECT_EQ(cat->NameList(), "tiny");
}

TEST(Catalog, RejectsInvalidJson) {
  auto cat = ParseCatalog("{\"models\": [", "x.json");
  ASSERT_FALSE(cat.ok());
  EXPECT_NE(cat.status().message().find("[catalog] x.json:"), std::string::npos);
}

TEST(Catalog, RejectsMissingModelsArray) {
  auto cat = ParseCatalog("{\"version\": 1}");
  ASSERT_FALSE(cat.ok());
  EXPECT_NE(cat.status().message().find("missing array 'models'"), std::string::npos);
}

TEST(Catalog, RejectsBadSha256) {
  std::string text = OneModel();
  text.replace(text.find(kSha), 64, "abc123");
  auto cat = ParseCatalog(text);
  ASSERT_FALSE(cat.ok());
  EXPECT_NE(cat.status().message().find("model 'tiny': sha256 must be 64"), std::string::npos)
      << cat.status().message();
}

TEST(Catalog, RejectsPartSizesThatDoNotAddUp) {
  auto cat = ParseCatalog(OneModel("", R"([{"package": "p", "version": "1", "member": "m", "size_bytes": 9}])"));
  ASSERT_FALSE(cat.ok());
  EXPECT_NE(cat.status().message().find("part sizes add up to 9 bytes, expected size_bytes 10"), std::string::npos)
      << cat.status().message();
}

TEST(Catalog, AcceptsPartsWithoutSizes) {
  auto cat = ParseCatalog(OneModel("", R"([{"package": "p", "version": "1", "member": "m"}])"));
  ASSERT_TRUE(cat.ok()) << cat.status().message();
  EXPECT_EQ(cat->models[0].parts[0].size_bytes, -1);
}

TEST(Catalog, RejectsEmptyParts) {
  auto cat = ParseCatalog(OneModel("", "[]"));
  ASSERT_FALSE(cat.ok());
  EXPECT_NE(cat.status().message().find("parts must be a non-empty array"), std::string::npos);
}

TEST(Catalog, RejectsPartMissingMember) {
  auto cat = ParseCatalog(OneModel("", R"([{"package": "p", "version": "1"}])"));
  ASSERT_FALSE(cat.ok());
  EXPECT_NE(cat.status().message().find("parts[0]: missing field 'member'"), std::string::npos)
      << cat.status().message();
}

TEST(Catalog, RejectsWrongFieldType) {
  std::string text = OneModel();
  text.replace(text.find("\"size_bytes\": 10"), 16, "\"size_bytes\": \"10\"");
  auto cat = ParseCatalog(text);
  ASSERT_FALSE(cat.ok());
  EXPECT_NE(cat.status().message().find("field 'size_bytes' must be an integer (got string)"), std::string::npos)
      << cat.status().message();
}

TEST(Catalog, RejectsFileNameWithDirectory) {
  std::string text = OneModel();
  text.replace(text.find("tiny.gguf"), 9, "../x.gguf");
  auto cat = ParseCatalog(text);
  ASSERT_FALSE(cat.ok());
  EXPECT_NE(cat.status().message().find("file must be a plain file name"), std::string::npos);
}

TEST(Catalog, RejectsDuplicateNames) {
  std::string one = OneModel();
  // Two copies of the same model (the second with another file name) clash on the name.
  std::string entry = one.substr(one.find("[{") + 1);
  entry = entry.substr(0, entry.size() - 2);  // drop "]}"
  std::string second = entry;
  second.replace(second.find("tiny.gguf"), 9, "tin2.gguf");
  auto cat = ParseCatalog("{\"models\": [" + entry + "," + second + "]}");
  ASSERT_FALSE(cat.ok());
  EXPECT_NE(cat.status().message().find("is used twice"), std::string::npos) << cat.status().message();
}

TEST(Catalog, CacheDirFollowsTheHomeSettings) {
  SetHomeSettings({"/x/y", "/c", "/h", ""});
  EXPECT_EQ(ModelCacheDir(), "/x/y/models");
  SetHomeSettings({"", "/c", "/h", ""});
  EXPECT_EQ(ModelCacheDir(), "/c/mererun/models");
  SetHomeSettings({"", "", "/h", ""});
  EXPECT_EQ(ModelCacheDir(), "/h/.cache/mererun/models");
  SetHomeSettings({});
}

// The catalog shipped in the repository parses and holds the four models the project uses.
TEST(Catalog, RepositoryCatalogIsValid) {
  auto cat = LoadCatalog(std::string(MERERUN_SOURCE_DIR) + "/models/catalog.json");
  ASSERT_TRUE(cat.ok()) << cat.status().message();
  for (const char* name : {"smollm2-135m-instruct", "gemma3-270m", "qwen2.5-coder-1.5b-instruct",
                           "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-0.5b"}) {
    EXPECT_NE(cat->Find(name), nullptr) << name;
  }
  for (const CatalogEntry& e : cat->models) {
    for (const CatalogPart& p : e.parts) EXPECT_GE(p.size_bytes, 0) << e.name;
  }
}

TEST(Catalog, FindCatalogPathHonoursTheSetting) {
  const std::string path = std::string(MERERUN_SOURCE_DIR) + "/models/catalog.json";
  SetHomeSettings({"", "", "", path});
  auto found = FindCatalogPath();
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(*found, path);
  SetHomeSettings({"", "", "", "/nonexistent/catalog.json"});
  EXPECT_FALSE(FindCatalogPath().ok());
  SetHomeSettings({});
  // Without the variable, the compiled-in source tree (or the exe-relative path) is found.
  EXPECT_TRUE(FindCatalogPath().ok());
}

}  // namespace
}  // namespace mr::model
