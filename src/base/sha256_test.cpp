#include "base/sha256.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace mr {
namespace {

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  Sha256 h;
  h.Update("a");
  h.Update("bc");
  EXPECT_EQ(h.FinalHex(), Sha256Hex("abc"));
}

TEST(Sha256, FileMatchesBytesAndReportsMissingFile) {
  std::string path = ::testing::TempDir() + "sha256_test.bin";
  std::string data(5 << 20, 'x');  // larger than one 4 MiB read block
  data[12345] = 'y';
  std::FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fwrite(data.data(), 1, data.size(), f);
  std::fclose(f);
  uint64_t last = 0;
  auto h = Sha256File(path, [&](uint64_t done) { last = done; });
  ASSERT_TRUE(h.ok()) << h.status().message();
  EXPECT_EQ(*h, Sha256Hex(data));
  EXPECT_EQ(last, data.size());
  std::remove(path.c_str());
  auto missing = Sha256File(path);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("[sha256] cannot open"), std::string::npos);
}

}  // namespace
}  // namespace mr
