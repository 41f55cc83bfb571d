// Parsing of the speculative-decoding configuration: flags, "key=value" lists and the
// MERERUN_DRAFT / MERERUN_DRAFT_TOKENS variables, with errors that name the setting.
#include "app/spec_config.h"

#include <gtest/gtest.h>
#include <stdlib.h>

namespace mr::app {
namespace {

TEST(SpecConfig, ParsesDraftersAndLengths) {
  DecodeConfig c;
  std::string err;
  ASSERT_TRUE(ParseConfig("draft=ngram,k=3", &c, &err)) << err;
  EXPECT_TRUE(c.ngram);
  EXPECT_FALSE(c.use_model);
  EXPECT_EQ(c.k, 3);
  EXPECT_FALSE(c.adaptive);
  EXPECT_EQ(c.DrafterName(), "ngram");
  EXPECT_EQ(c.TokensName(), "3");
  ASSERT_TRUE(ParseConfig("draft=ngram+model:qwen,k=auto:5", &c, &err)) << err;
  EXPECT_TRUE(c.ngram && c.use_model);
  EXPECT_EQ(c.draft_model, "qwen");
  EXPECT_EQ(c.DrafterName(), "ngram+model:qwen");
  EXPECT_EQ(c.TokensName(), "auto:5");
  EXPECT_TRUE(c.adaptive);
  ASSERT_TRUE(ParseConfig("draft=off", &c, &err));
  EXPECT_FALSE(c.speculative());
  EXPECT_EQ(c.DrafterName(), "off");
  // "chain" and "model" take the model named elsewhere (--draft-model).
  c = DecodeConfig{};
  c.draft_model = "small";
  ASSERT_TRUE(SetConfigValue("--draft", "chain", &c, &err));
  EXPECT_EQ(c.DrafterName(), "ngram+model:small");
  EXPECT_TRUE(c.Validate().ok());
  c.draft_model.clear();
  EXPECT_FALSE(c.Validate().ok());
  EXPECT_NE(c.Validate().message().find("--draft-model"), std::string::npos);
}

TEST(SpecConfig, BadValuesNameTheSettingAndTheAllowedValues) {
  DecodeConfig c;
  std::string err;
  EXPECT_FALSE(SetConfigValue("MERERUN_DRAFT", "bogus", &c, &err));
  EXPECT_NE(err.find("MERERUN_DRAFT"), std::string::npos) << err;
  EXPECT_NE(err.find("ngram"), std::string::npos) << err;
  for (const char* bad : {"0", "17", "3x", "auto:", "auto:0", "-1", ""}) {
    err.clear();
    EXPECT_FALSE(SetConfigValue("--draft-tokens", bad, &c, &err)) << bad;
    EXPECT_NE(err.find("--draft-tokens"), std::string::npos) << err;
  }
  EXPECT_FALSE(ParseConfig("k", &c, &err));
  EXPECT_FALSE(ParseConfig("speed=fast", &c, &err));
  // A failed value leaves the configuration as it was.
  DecodeConfig d;
  ASSERT_TRUE(SetConfigValue("k", "5", &d, &err));
  EXPECT_FALSE(SetConfigValue("k", "99", &d, &err));
  EXPECT_EQ(d.k, 5);
}

TEST(SpecConfig, EnvironmentIsReadHereAndValidated) {
  DecodeConfig c;
  c.ngram = true;
  setenv("MERERUN_DRAFT", "off", 1);
  setenv("MERERUN_DRAFT_TOKENS", "4", 1);
  ASSERT_TRUE(ApplyDraftEnvironment(&c).ok());
  EXPECT_FALSE(c.speculative());
  EXPECT_EQ(c.k, 4);
  setenv("MERERUN_DRAFT_TOKENS", "lots", 1);
  const Status st = ApplyDraftEnvironment(&c);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("MERERUN_DRAFT_TOKENS"), std::string::npos);
  unsetenv("MERERUN_DRAFT");
  unsetenv("MERERUN_DRAFT_TOKENS");
}

}  // namespace
}  // namespace mr::app
