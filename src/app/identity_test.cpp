#include "app/identity.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace mr::app {
namespace {

std::string WriteBytes(const std::string& name, const std::vector<char>& bytes) {
  const std::string path = ::testing::TempDir() + name + "-" + std::to_string(::getpid());
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}

std::string Digest(const std::string& path) {
  auto d = SampledFileDigest(path);
  EXPECT_TRUE(d.ok()) << d.status().message();
  return d.ok() ? *d : std::string();
}

TEST(SampledFileDigest, SeesTheHeaderTheSamplesAndTheSize) {
  std::vector<char> bytes(20u << 20);
  std::mt19937 rng(7);
  for (char& c : bytes) c = static_cast<char>(rng());
  const std::string base = Digest(WriteBytes("digest-a", bytes));
  EXPECT_EQ(base.size(), 64u);
  EXPECT_EQ(Digest(WriteBytes("digest-b", bytes)), base) << "same contents, another file";

  auto changed = [&](size_t at) {
    std::vector<char> b = bytes;
    b[at] ^= 1;
    return Digest(WriteBytes("digest-c", b));
  };
  EXPECT_NE(changed(100), base) << "a header byte";
  EXPECT_NE(changed((4u << 20) + 10), base) << "the first sample of tensor data";
  const size_t span = bytes.size() - (4u << 20);
  EXPECT_NE(changed((4u << 20) + span * 17 / 32 + 5), base) << "a later sample";

  std::vector<char> longer = bytes;
  longer.push_back(0);
  EXPECT_NE(Digest(WriteBytes("digest-d", longer)), base) << "the size";

  std::vector<char> small(1000, 'x');
  EXPECT_EQ(Digest(WriteBytes("digest-e", small)).size(), 64u) << "a file shorter than the header";
}

TEST(SampledFileDigest, MissingFileIsAnError) {
  auto d = SampledFileDigest("/nonexistent/mererun-model.gguf");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("/nonexistent/mererun-model.gguf"), std::string::npos);
}

}  // namespace
}  // namespace mr::app
