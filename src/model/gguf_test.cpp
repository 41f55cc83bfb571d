// GGUF reader/writer tests: round trips through GgufWriter -> GgufFile::Parse/Open, a table of
// hand-corrupted files (each must fail with a useful message and never crash; run under ASan
// too), truncation and mutation sweeps, and the real models when present.
#include "model/gguf.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "model/gguf_writer.h"
#include "model/test_models.h"

namespace mr::gguf {
namespace {

constexpr uint32_t kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ8_0 = 8, kQ4_K = 12, kQ6_K = 14, kBF16 = 30, kMXFP4 = 39;

std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(seed + i * 7);
  return b;
}

void PatchU32(std::vector<uint8_t>& b, size_t at, uint32_t v) {
  std::memcpy(&b[at], &v, 4);
}
void PatchU64(std::vector<uint8_t>& b, size_t at, uint64_t v) {
  std::memcpy(&b[at], &v, 8);
}

Result<std::unique_ptr<GgufFile>> ParseBytes(const std::vector<uint8_t>& b) {
  return GgufFile::Parse(b.data(), b.size());
}

// A small valid model: metadata of several kinds and three tensors of different types.
GgufWriter SmallModel() {
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetU32("llama.block_count", 2);
  w.SetF32("llama.rope.freq_base", 10000.0f);
  w.SetArrayStr("tokenizer.ggml.tokens", {"<s>", "a", "b"});
  w.SetArrayI32("tokenizer.ggml.token_type", {3, 1, 1});
  EXPECT_TRUE(w.AddTensor("tok_embd.weight", kF32, {4, 3}, Bytes(48, 1)).ok());
  EXPECT_TRUE(w.AddTensor("blk.0.attn_q.weight", kQ8_0, {32, 2}, Bytes(68, 2)).ok());
  EXPECT_TRUE(w.AddTensor("output_norm.weight", kF16, {4}, Bytes(8, 3)).ok());
  return w;
}

// ---- Round trips ---------------------------------------------------------------------------

TEST(GgufRoundTrip, EveryMetadataTypeV2AndV3) {
  for (uint32_t version : {2u, 3u}) {
    SCOPED_TRACE("version " + std::to_string(version));
    GgufWriter w(version);
    w.SetU8("t.u8", 200);
    w.SetI8("t.i8", -100);
    w.SetU16("t.u16", 60000);
    w.SetI16("t.i16", -30000);
    w.SetU32("t.u32", 4000000000u);
    w.SetI32("t.i32", -2000000000);
    w.SetU64("t.u64", 18000000000000000000ull);
    w.SetI64("t.i64", -9000000000000000000ll);
    w.SetF32("t.f32", 1.25f);
    w.SetF64("t.f64", -2.5e300);
    w.SetBool("t.bool", true);
    w.SetString("t.str", "h\xC3\xA9llo");
    w.SetString("t.empty_str", "");
    w.SetArrayStr("t.astr", {"x", "", "yz"});
    w.SetArrayU8("t.au8", {1, 255});
    w.SetArrayI8("t.ai8", {-128, 127});
    w.SetArrayU16("t.au16", {65535});
    w.SetArrayI16("t.ai16", {-32768, 5});
    w.SetArrayU32("t.au32", {4294967295u, 0});
    w.SetArrayI32("t.ai32", {-1, 2, -3});
    w.SetArrayU64("t.au64", {1ull << 40});
    w.SetArrayI64("t.ai64", {-(1ll << 50)});
    w.SetArrayF32("t.af32", {0.5f, -1.0f});
    w.SetArrayF64("t.af64", {1e-300});
    w.SetArrayBool("t.abool", {true, false, true});
    w.SetArrayI32("t.aempty", {});
    MetaValue nested;  // [[1, 2], [3]] as arrays of i32
    nested.type = ValueType::kArray;
    nested.elem_type = ValueType::kArray;
    for (std::vector<int64_t> inner : {std::vector<int64_t>{1, 2}, std::vector<int64_t>{3}}) {
      MetaValue a;
      a.type = ValueType::kArray;
      a.elem_type = ValueType::kI32;
      a.arr_int = inner;
      nested.arr_nested.push_back(a);
    }
    ASSERT_TRUE(w.SetValue("t.nested", nested).ok());
    ASSERT_TRUE(w.AddTensor("w", kF32, {2}, Bytes(8, 9)).ok());

    const std::vector<uint8_t> img = w.Serialize();
    auto f = ParseBytes(img);
    ASSERT_TRUE(f.ok()) << f.status().message();
    const GgufFile& g = **f;
    EXPECT_EQ(g.version(), version);
    EXPECT_EQ(g.metadata().size(), 27u);
    EXPECT_EQ(g.metadata()[0].first, "t.u8");  // file order kept
    EXPECT_EQ(g.Find("t.u8")->type, ValueType::kU8);
    EXPECT_EQ(g.GetInt("t.u8"), 200);
    EXPECT_EQ(g.GetInt("t.i8"), -100);
    EXPECT_EQ(g.GetInt("t.u16"), 60000);
    EXPECT_EQ(g.GetInt("t.i16"), -30000);
    EXPECT_EQ(g.GetInt("t.u32"), 4000000000ll);
    EXPECT_EQ(g.GetInt("t.i32"), -2000000000);
    EXPECT_EQ(g.Find("t.u64")->u, 18000000000000000000ull);
    EXPECT_EQ(g.GetInt("t.u64"), std::nullopt);  // > INT64_MAX
    EXPECT_EQ(g.GetInt("t.i64"), -9000000000000000000ll);
    EXPECT_EQ(g.GetFloat("t.f32"), 1.25);
    EXPECT_EQ(g.Find("t.f32")->type, ValueType::kF32);
    EXPECT_EQ(g.GetFloat("t.f64"), -2.5e300);
    EXPECT_EQ(g.GetBool("t.bool"), true);
    EXPECT_EQ(g.GetString("t.str"), "h\xC3\xA9llo");
    EXPECT_EQ(g.GetString("t.empty_str"), "");
    EXPECT_EQ(g.GetString("t.u8"), std::nullopt);
    ASSERT_NE(g.GetStringArray("t.astr"), nullptr);
    EXPECT_EQ(*g.GetStringArray("t.astr"), (std::vector<std::string>{"x", "", "yz"}));
    EXPECT_EQ(*g.GetIntArray("t.au8"), (std::vector<int64_t>{1, 255}));
    EXPECT_EQ(*g.GetIntArray("t.ai8"), (std::vector<int64_t>{-128, 127}));
    EXPECT_EQ(*g.GetIntArray("t.au16"), (std::vector<int64_t>{65535}));
    EXPECT_EQ(*g.GetIntArray("t.ai16"), (std::vector<int64_t>{-32768, 5}));
    EXPECT_EQ(*g.GetIntArray("t.au32"), (std::vector<int64_t>{4294967295ll, 0}));
    EXPECT_EQ(*g.GetIntArray("t.ai32"), (std::vector<int64_t>{-1, 2, -3}));
    EXPECT_EQ(*g.GetIntArray("t.au64"), (std::vector<int64_t>{1ll << 40}));
    EXPECT_EQ(*g.GetIntArray("t.ai64"), (std::vector<int64_t>{-(1ll << 50)}));
    EXPECT_EQ(*g.GetFloatArray("t.af32"), (std::vector<double>{0.5, -1.0}));
    EXPECT_EQ(*g.GetFloatArray("t.af64"), (std::vector<double>{1e-300}));
    EXPECT_EQ(*g.GetIntArray("t.abool"), (std::vector<int64_t>{1, 0, 1}));
    EXPECT_EQ(g.Find("t.abool")->elem_type, ValueType::kBool);
    ASSERT_NE(g.GetIntArray("t.aempty"), nullptr);
    EXPECT_TRUE(g.GetIntArray("t.aempty")->empty());
    const MetaValue* n = g.Find("t.nested");
    ASSERT_NE(n, nullptr);
    ASSERT_EQ(n->elem_type, ValueType::kArray);
    ASSERT_EQ(n->arr_nested.size(), 2u);
    EXPECT_EQ(n->arr_nested[0].arr_int, (std::vector<int64_t>{1, 2}));
    EXPECT_EQ(n->arr_nested[1].arr_int, (std::vector<int64_t>{3}));

    // Re-serializing every parsed value reproduces the image byte for byte.
    GgufWriter w2(version);
    for (const auto& [key, value] : g.metadata()) ASSERT_TRUE(w2.SetValue(key, value).ok()) << key;
    for (const TensorInfo& t : g.tensors()) {
      ASSERT_TRUE(w2.AddTensor(t.name, t.type, t.dims, std::vector<uint8_t>(t.data, t.data + t.n_bytes)).ok());
    }
    EXPECT_EQ(w2.Serialize(), img);
  }
}

TEST(GgufRoundTrip, TensorsOfManyTypesDataAndLayout) {
  GgufWriter w;
  w.SetString("general.architecture", "test");
  struct Spec {
    const char* name;
    uint32_t type;
    std::vector<int64_t> dims;
    size_t bytes;
  };
  const std::vector<Spec> specs = {
      {"f32", kF32, {3, 5}, 60},          {"f16", kF16, {7}, 14},
      {"bf16", kBF16, {2, 2, 2}, 16},     {"q4_0", kQ4_0, {64, 3}, 2 * 3 * 18},
      {"q8_0", kQ8_0, {32, 1, 1, 2}, 68}, {"q4_k", kQ4_K, {256, 2}, 288},
      {"q6_k", kQ6_K, {512}, 420},        {"mxfp4", kMXFP4, {64, 3, 2}, 2 * 3 * 2 * 17},
  };
  for (size_t k = 0; k < specs.size(); ++k) {
    ASSERT_TRUE(
        w.AddTensor(specs[k].name, specs[k].type, specs[k].dims, Bytes(specs[k].bytes, static_cast<uint8_t>(k))).ok())
        << k;
  }
  GgufWriter::Layout layout;
  const std::vector<uint8_t> img = w.Serialize(&layout);
  EXPECT_EQ(layout.data_pos % 32, 0u);
  auto f = ParseBytes(img);
  ASSERT_TRUE(f.ok()) << f.status().message();
  ASSERT_EQ((*f)->tensors().size(), specs.size());
  for (size_t k = 0; k < specs.size(); ++k) {
    const TensorInfo* t = (*f)->FindTensor(specs[k].name);
    ASSERT_NE(t, nullptr) << specs[k].name;
    EXPECT_EQ(t->type, specs[k].type);
    EXPECT_EQ(t->dims, specs[k].dims);
    EXPECT_EQ(t->n_bytes, specs[k].bytes);
    EXPECT_EQ(t->offset % 32, 0u);
    EXPECT_EQ(t->offset, layout.tensor_data_offset[k]);
    EXPECT_EQ(t->data, img.data() + layout.data_pos + t->offset);
    EXPECT_EQ(std::vector<uint8_t>(t->data, t->data + t->n_bytes), Bytes(specs[k].bytes, static_cast<uint8_t>(k)));
  }
  const TensorInfo* t = (*f)->FindTensor("f32");
  EXPECT_EQ(t->cols(), 3);
  EXPECT_EQ(t->rows(), 5);
  EXPECT_EQ(t->n_elements, 15);
  EXPECT_EQ((*f)->FindTensor("nope"), nullptr);
  // MXFP4 (ggml type 39): blocks of 32 elements in 17 bytes.
  EXPECT_EQ(TypeName(kMXFP4), "mxfp4");
  EXPECT_EQ((*f)->FindTensor("mxfp4")->row_bytes(), 2u * 17);
  EXPECT_FALSE(w.AddTensor("mxfp4_48", kMXFP4, {48}, Bytes(34, 0)).ok());  // not a whole block
}

TEST(GgufRoundTrip, CustomAlignment) {
  for (uint32_t align : {1u, 8u, 64u, 256u}) {
    GgufWriter w;
    w.SetAlignment(align);
    ASSERT_TRUE(w.AddTensor("a", kF32, {3}, Bytes(12, 1)).ok());
    ASSERT_TRUE(w.AddTensor("b", kF32, {5}, Bytes(20, 2)).ok());
    GgufWriter::Layout layout;
    const std::vector<uint8_t> img = w.Serialize(&layout);
    EXPECT_EQ(layout.alignment, align);
    EXPECT_EQ(layout.data_pos % align, 0u);
    auto f = ParseBytes(img);
    ASSERT_TRUE(f.ok()) << align << ": " << f.status().message();
    EXPECT_EQ((*f)->alignment(), align);
    const TensorInfo* b = (*f)->FindTensor("b");
    EXPECT_EQ(b->offset % align, 0u);
    EXPECT_EQ(b->offset, (12 + align - 1) / align * align);  // a's 12 bytes, padded
    EXPECT_EQ(std::vector<uint8_t>(b->data, b->data + 20), Bytes(20, 2));
  }
}

TEST(GgufRoundTrip, NoTensorsNoMetadata) {
  GgufWriter w;
  const std::vector<uint8_t> img = w.Serialize();
  EXPECT_EQ(img.size(), 32u);  // 24-byte header padded to the alignment
  auto f = ParseBytes(img);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_TRUE((*f)->metadata().empty());
  EXPECT_TRUE((*f)->tensors().empty());
}

TEST(GgufRoundTrip, WriteFileAndOpen) {
  const std::string path = ::testing::TempDir() + "/gguf_test_" + std::to_string(::getpid()) + ".gguf";
  ASSERT_TRUE(SmallModel().WriteFile(path).ok());
  {  // the streamed file is byte-identical to the in-memory image
    std::ifstream in(path, std::ios::binary);
    const std::vector<uint8_t> disk((std::istreambuf_iterator<char>(in)), {});
    EXPECT_EQ(disk, SmallModel().Serialize());
  }
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ((*f)->path(), path);
  EXPECT_EQ((*f)->file_size(), std::filesystem::file_size(path));
  EXPECT_EQ((*f)->GetString("general.architecture"), "llama");
  EXPECT_EQ((*f)->GetInt("llama.block_count"), 2);
  EXPECT_EQ((*f)->GetFloat("llama.rope.freq_base"), 10000.0);
  ASSERT_EQ((*f)->tensors().size(), 3u);
  const TensorInfo* q = (*f)->FindTensor("blk.0.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(std::vector<uint8_t>(q->data, q->data + 68), Bytes(68, 2));
  std::filesystem::remove(path);

  auto missing = GgufFile::Open(path);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find(path), std::string::npos);
  EXPECT_FALSE(GgufWriter().WriteFile("/nonexistent-dir/x.gguf").ok());
}

TEST(GgufWriter, SetReplacesInPlaceAndChecksTensors) {
  GgufWriter w;
  w.SetU32("a", 1);
  w.SetString("b", "x");
  w.SetString("a", "now a string");
  EXPECT_TRUE(w.HasKey("a"));
  w.RemoveKey("b");
  EXPECT_FALSE(w.HasKey("b"));
  auto f = ParseBytes(w.Serialize());
  ASSERT_TRUE(f.ok());
  ASSERT_EQ((*f)->metadata().size(), 1u);
  EXPECT_EQ((*f)->GetString("a"), "now a string");

  EXPECT_FALSE(w.AddTensor("t", kQ8_0, {33}, Bytes(34, 0)).ok());           // not block multiple
  EXPECT_FALSE(w.AddTensor("t", kQ8_0, {32}, Bytes(33, 0)).ok());           // wrong byte count
  EXPECT_FALSE(w.AddTensor("t", 999, {32}, Bytes(32, 0)).ok());             // unknown type
  EXPECT_FALSE(w.AddTensor("t", kF32, {}, {}).ok());                        // no dims
  EXPECT_FALSE(w.AddTensor("t", kF32, {1, 1, 1, 1, 1}, Bytes(4, 0)).ok());  // 5 dims
  EXPECT_FALSE(w.AddTensor("t", kF32, {0}, {}).ok());                       // zero dim
  ASSERT_TRUE(w.AddTensor("t", kF32, {1}, Bytes(4, 0)).ok());
  EXPECT_FALSE(w.AddTensor("t", kF32, {1}, Bytes(4, 0)).ok());  // duplicate
  MetaValue bad;
  bad.type = static_cast<ValueType>(77);
  EXPECT_FALSE(w.SetValue("bad", bad).ok());
}

// ---- Hand-corrupted files ------------------------------------------------------------------

struct CorruptCase {
  std::string name;
  std::function<std::vector<uint8_t>()> make;
  std::vector<std::string> expect_in_message;  // substrings the error message must contain
};

// Header only: magic, version, tensor count, kv count.
ByteSink Header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
  ByteSink s;
  s.U32(0x46554747);
  s.U32(version);
  s.U64(n_tensors);
  s.U64(n_kv);
  return s;
}

std::vector<uint8_t> Truncate(std::vector<uint8_t> b, size_t n) {
  b.resize(std::min(n, b.size()));
  return b;
}

// The small model with its first tensor's info patched by `patch(bytes, layout)`.
std::vector<uint8_t> PatchedModel(const std::function<void(std::vector<uint8_t>&, const GgufWriter::Layout&)>& patch) {
  GgufWriter::Layout layout;
  std::vector<uint8_t> b = SmallModel().Serialize(&layout);
  patch(b, layout);
  return b;
}

// One tensor (name "t", given raw dims/type/offset) after one metadata key; data bytes given.
std::vector<uint8_t> OneTensor(std::vector<int64_t> dims, uint32_t type, size_t data_bytes,
                               std::optional<uint64_t> offset = std::nullopt) {
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.AddTensorRaw("t", type, std::move(dims), Bytes(data_bytes, 5), offset);
  return w.Serialize();
}

// An array-of-arrays chain `depth` deep, innermost an empty i32 array.
std::vector<uint8_t> NestedArrays(int depth) {
  ByteSink payload;
  for (int d = 0; d < depth; ++d) {
    payload.U32(static_cast<uint32_t>(ValueType::kArray));
    payload.U64(1);
  }
  payload.U32(static_cast<uint32_t>(ValueType::kI32));
  payload.U64(0);
  // The value of the kv begins with the outer array's element type, i.e. the payload itself.
  GgufWriter w;
  w.AddRawKv("bomb", static_cast<uint32_t>(ValueType::kArray), payload.Take());
  return w.Serialize();
}

std::vector<CorruptCase> CorruptCases() {
  std::vector<CorruptCase> c;
  const std::vector<uint8_t> good = SmallModel().Serialize();
  GgufWriter::Layout L;
  (void)SmallModel().Serialize(&L);

  // -- Header
  c.push_back({"EmptyFile", [] { return std::vector<uint8_t>{}; }, {"truncated"}});
  c.push_back({"TruncatedMagic", [=] { return Truncate(good, 3); }, {"truncated", "magic"}});
  c.push_back({"BadMagic",
               [=] {
                 auto b = good;
                 b[0] = 'X';
                 return b;
               },
               {"magic"}});
  c.push_back({"BadMagicGGML",
               [] {
                 ByteSink s;
                 s.Bytes("GGML", 4);
                 s.U32(3);
                 s.U64(0);
                 s.U64(0);
                 return s.Take();
               },
               {"magic"}});
  c.push_back({"TruncatedVersion", [=] { return Truncate(good, 6); }, {"version"}});
  c.push_back({"Version0", [] { return Header(0, 0, 0).Take(); }, {"version", "0"}});
  c.push_back({"Version1", [] { return Header(1, 0, 0).Take(); }, {"version", "1"}});
  c.push_back({"Version4", [] { return Header(4, 0, 0).Take(); }, {"version", "4"}});
  c.push_back({"VersionByteSwapped", [] { return Header(0x03000000, 0, 0).Take(); }, {"version"}});
  c.push_back({"TruncatedTensorCount", [=] { return Truncate(good, 12); }, {"tensor count"}});
  c.push_back({"TruncatedKvCount", [=] { return Truncate(good, 20); }, {"truncated"}});
  c.push_back({"HugeTensorCount",
               [=] {
                 auto b = good;
                 PatchU64(b, L.tensor_count_pos, ~0ull);
                 return b;
               },
               {"tensor count"}});
  c.push_back({"TensorCount2Pow40",
               [=] {
                 auto b = good;
                 PatchU64(b, L.tensor_count_pos, 1ull << 40);
                 return b;
               },
               {"tensor count"}});
  c.push_back({"HugeKvCount",
               [=] {
                 auto b = good;
                 PatchU64(b, L.kv_count_pos, ~0ull);
                 return b;
               },
               {"metadata count"}});
  c.push_back({"KvCountOneTooMany",
               [=] {
                 auto b = good;
                 PatchU64(b, L.kv_count_pos, L.kv_pos.size() + 1);
                 return b;
               },
               {}});
  c.push_back({"TensorCountOneTooMany",
               [=] {
                 auto b = good;
                 PatchU64(b, L.tensor_count_pos, L.tensor_info_pos.size() + 1);
                 return b;
               },
               {}});

  // -- Metadata
  // The up-front count check catches this one (5 kvs cannot fit in what is left).
  c.push_back({"TruncatedInKeyLength", [=] { return Truncate(good, L.kv_pos[1] + 4); }, {"metadata count"}});
  c.push_back({"TruncatedInKey",
               [] {
                 ByteSink s = Header(3, 0, 1);
                 s.U64(30);
                 s.Bytes("general.architectur", 19);
                 return s.Take();
               },
               {"key", "30"}});
  c.push_back({"HugeKeyLength",
               [=] {
                 auto b = good;
                 PatchU64(b, L.kv_pos[0], ~0ull);
                 return b;
               },
               {"length"}});
  c.push_back({"KeyLengthPastEnd",
               [=] {
                 auto b = good;
                 PatchU64(b, L.kv_pos[0], b.size());
                 return b;
               },
               {"length"}});
  c.push_back({"EmptyKey",
               [] {
                 GgufWriter w;
                 w.SetU32("", 1);
                 return w.Serialize();
               },
               {"empty"}});
  c.push_back({"TruncatedInValue",
               [] {
                 ByteSink s = Header(3, 0, 1);
                 s.Str("general.some_long_key");
                 s.U32(static_cast<uint32_t>(ValueType::kU64));
                 s.U32(7);  // half of the u64
                 return s.Take();
               },
               {"truncated", "general.some_long_key"}});
  c.push_back({"HugeStringValueLength",
               [] {
                 GgufWriter w;
                 ByteSink v;
                 v.U64(1ull << 62);
                 v.Bytes("abc", 3);
                 w.AddRawKv("general.name", static_cast<uint32_t>(ValueType::kString), v.Take());
                 return w.Serialize();
               },
               {"length"}});
  c.push_back({"UnknownValueType",
               [] {
                 GgufWriter w;
                 w.AddRawKv("weird.key", 13, {1, 2, 3, 4});
                 return w.Serialize();
               },
               {"weird.key", "13"}});
  c.push_back({"UnknownValueTypeHuge",
               [] {
                 GgufWriter w;
                 w.AddRawKv("weird.key", 0xFFFFFFFF, {0});
                 return w.Serialize();
               },
               {"weird.key"}});
  c.push_back({"BoolValueNotZeroOrOne",
               [] {
                 GgufWriter w;
                 w.AddRawKv("flag", static_cast<uint32_t>(ValueType::kBool), {7});
                 return w.Serialize();
               },
               {"flag"}});
  c.push_back({"HugeArrayLengthU32",
               [] {
                 GgufWriter w;
                 ByteSink v;
                 v.U32(static_cast<uint32_t>(ValueType::kU32));
                 v.U64(1ull << 62);
                 v.U32(1);
                 w.AddRawKv("arr", static_cast<uint32_t>(ValueType::kArray), v.Take());
                 return w.Serialize();
               },
               {"arr", "array"}});
  c.push_back({"ArrayLengthTimesWidthOverflows",
               [] {
                 GgufWriter w;
                 ByteSink v;
                 v.U32(static_cast<uint32_t>(ValueType::kU64));
                 v.U64((1ull << 61) + 1);
                 v.U64(0);
                 w.AddRawKv("arr", static_cast<uint32_t>(ValueType::kArray), v.Take());
                 return w.Serialize();
               },
               {"arr"}});
  c.push_back({"HugeStringArrayLength",
               [] {
                 GgufWriter w;
                 ByteSink v;
                 v.U32(static_cast<uint32_t>(ValueType::kString));
                 v.U64(~0ull);
                 v.Str("a");
                 w.AddRawKv("tokenizer.ggml.tokens", static_cast<uint32_t>(ValueType::kArray), v.Take());
                 return w.Serialize();
               },
               {"tokenizer.ggml.tokens"}});
  c.push_back({"StringInArrayTooLong",
               [] {
                 GgufWriter w;
                 ByteSink v;
                 v.U32(static_cast<uint32_t>(ValueType::kString));
                 v.U64(2);
                 v.Str("ok");
                 v.U64(1ull << 40);
                 v.Bytes("zz", 2);
                 w.AddRawKv("strs", static_cast<uint32_t>(ValueType::kArray), v.Take());
                 return w.Serialize();
               },
               {"length"}});
  c.push_back({"ArrayOfUnknownType",
               [] {
                 GgufWriter w;
                 ByteSink v;
                 v.U32(42);
                 v.U64(1);
                 v.U32(0);
                 w.AddRawKv("arr", static_cast<uint32_t>(ValueType::kArray), v.Take());
                 return w.Serialize();
               },
               {"arr", "42"}});
  c.push_back({"NestedArrayBombDeep", [] { return NestedArrays(100000); }, {"bomb"}});
  c.push_back({"NestedArrayBombWide",
               [] {
                 // An array claiming 2^40 empty inner arrays: each needs >= 12 bytes.
                 GgufWriter w;
                 ByteSink v;
                 v.U32(static_cast<uint32_t>(ValueType::kArray));
                 v.U64(1ull << 40);
                 for (int k = 0; k < 4; ++k) {
                   v.U32(static_cast<uint32_t>(ValueType::kU8));
                   v.U64(0);
                 }
                 w.AddRawKv("bomb", static_cast<uint32_t>(ValueType::kArray), v.Take());
                 return w.Serialize();
               },
               {"bomb"}});
  c.push_back({"DuplicateKey",
               [] {
                 GgufWriter w;
                 w.SetU32("dup.key", 1);
                 ByteSink v;
                 v.U32(2);
                 w.AddRawKv("dup.key", static_cast<uint32_t>(ValueType::kU32), v.Take());
                 return w.Serialize();
               },
               {"duplicate", "dup.key"}});
  c.push_back({"AlignmentZero",
               [] {
                 GgufWriter w;
                 w.SetAlignment(0);
                 EXPECT_TRUE(w.AddTensor("t", kF32, {1}, Bytes(4, 0)).ok());
                 return w.Serialize();
               },
               {"general.alignment"}});
  c.push_back({"AlignmentNotPowerOfTwo",
               [] {
                 GgufWriter w;
                 w.SetAlignment(48);
                 EXPECT_TRUE(w.AddTensor("t", kF32, {1}, Bytes(4, 0)).ok());
                 return w.Serialize();
               },
               {"general.alignment", "48"}});
  c.push_back({"AlignmentWrongType",
               [] {
                 GgufWriter w;
                 w.SetString("general.alignment", "32");
                 return w.Serialize();
               },
               {"general.alignment"}});
  c.push_back({"AlignmentNegative",
               [] {
                 GgufWriter w;
                 w.SetI32("general.alignment", -32);
                 return w.Serialize();
               },
               {"general.alignment"}});

  // -- Tensor infos
  c.push_back({"TruncatedInTensorName", [=] { return Truncate(good, L.tensor_info_pos[1] + 9); }, {"tensor name"}});
  c.push_back({"TruncatedInTensorInfo", [=] { return Truncate(good, L.tensor_type_pos[1] + 2); }, {"truncated"}});
  c.push_back({"TruncatedBeforeDataSection", [=] { return Truncate(good, L.data_pos - 1); }, {}});
  c.push_back({"TruncatedInLastTensorData",
               [=] { return Truncate(good, L.data_pos + L.tensor_data_offset[2] + 4); },
               {"output_norm.weight"}});
  c.push_back(
      {"HugeTensorNameLength",
       [=] { return PatchedModel([](auto& b, const auto& l) { PatchU64(b, l.tensor_info_pos[0], 1ull << 63); }); },
       {"length"}});
  c.push_back({"EmptyTensorName",
               [] {
                 GgufWriter w;
                 w.AddTensorRaw("", kF32, {1}, Bytes(4, 0));
                 return w.Serialize();
               },
               {"empty"}});
  c.push_back({"NDimsZero", [] { return OneTensor({}, kF32, 4); }, {"'t'", "n_dims"}});
  c.push_back({"NDimsFive", [] { return OneTensor({1, 1, 1, 1, 1}, kF32, 4); }, {"'t'", "n_dims"}});
  c.push_back({"NDimsHuge",
               [=] {
                 return PatchedModel([](auto& b, const auto& l) {
                   // n_dims follows the name: u64 length + "tok_embd.weight" (15 bytes).
                   PatchU32(b, l.tensor_info_pos[0] + 8 + 15, 0xFFFFFFFF);
                 });
               },
               {"tok_embd.weight", "n_dims"}});
  c.push_back({"DimZero", [] { return OneTensor({4, 0}, kF32, 0); }, {"'t'", "dimension"}});
  c.push_back({"DimNegative", [] { return OneTensor({-4}, kF32, 16); }, {"'t'", "dimension"}});
  c.push_back({"DimProductOverflows", [] { return OneTensor({1ll << 32, 1ll << 32}, kF32, 4); }, {"'t'", "overflow"}});
  c.push_back({"DimProductOverflowsInt64", [] { return OneTensor({1ll << 62, 4}, kF32, 4); }, {"'t'", "overflow"}});
  c.push_back({"ByteSizeHugeButElementsFit",
               [] {
                 // 2^60 f32 elements: the element count fits in int64, the byte size not the file.
                 return OneTensor({1ll << 30, 1ll << 30}, kF32, 4);
               },
               {"'t'"}});
  c.push_back({"RowNotMultipleOfBlock", [] { return OneTensor({33}, kQ8_0, 34); }, {"'t'", "33"}});
  c.push_back({"UnknownTensorType", [] { return OneTensor({4}, 99, 16); }, {"'t'", "99"}});
  c.push_back({"UnknownTensorTypeGap", [] { return OneTensor({32}, 4, 18); }, {"'t'", "4"}});
  c.push_back({"UnknownTensorTypeHuge", [] { return OneTensor({4}, 0x80000000u, 16); }, {"'t'", "2147483648"}});
  c.push_back({"OffsetPastEnd", [] { return OneTensor({4}, kF32, 16, 1ull << 20); }, {"'t'", "past the end"}});
  c.push_back({"OffsetHugeOverflows", [] { return OneTensor({4}, kF32, 16, ~0ull - 31); }, {"'t'"}});
  c.push_back({"OffsetNotAligned", [] { return OneTensor({4}, kF32, 16, 4); }, {"'t'", "align"}});
  c.push_back({"DataRunsPastEnd", [] { return OneTensor({64}, kF32, 16); }, {"'t'", "past the end"}});
  c.push_back({"OverlappingTensors",
               [] {
                 GgufWriter w;
                 w.AddTensorRaw("a", kF32, {16}, Bytes(64, 1), 0);
                 w.AddTensorRaw("b", kF32, {16}, Bytes(64, 2), 32);
                 return w.Serialize();
               },
               {"overlap", "'a'", "'b'"}});
  c.push_back({"SameOffsetTensors",
               [] {
                 GgufWriter w;
                 w.AddTensorRaw("a", kF32, {8}, Bytes(32, 1), 0);
                 w.AddTensorRaw("b", kF32, {8}, Bytes(32, 2), 0);
                 return w.Serialize();
               },
               {"overlap"}});
  c.push_back({"DuplicateTensorNames",
               [] {
                 GgufWriter w;
                 w.AddTensorRaw("same", kF32, {8}, Bytes(32, 1));
                 w.AddTensorRaw("same", kF32, {8}, Bytes(32, 2));
                 return w.Serialize();
               },
               {"duplicate", "same"}});
  c.push_back({"TensorTypePatchedToQ4K",
               [=] {
                 // q4_K needs rows of 256: the f32 tensor's 4 columns are not a block multiple.
                 return PatchedModel([](auto& b, const auto& l) { PatchU32(b, l.tensor_type_pos[0], kQ4_K); });
               },
               {"tok_embd.weight"}});
  // -- Names: identifiers, not blobs (ggml itself caps tensor names at 64 bytes)
  c.push_back({"KeyLongerThanLimit",
               [] {
                 GgufWriter w;
                 w.SetU32(std::string(70000, 'k'), 1);
                 return w.Serialize();
               },
               {"metadata key", "70000"}});
  c.push_back({"TensorNameLongerThanLimit",
               [] {
                 GgufWriter w;
                 EXPECT_TRUE(w.AddTensor(std::string(70000, 't'), kF32, {1}, Bytes(4, 0)).ok());
                 return w.Serialize();
               },
               {"tensor name", "70000"}});
  return c;
}

void PrintTo(const CorruptCase& c, std::ostream* os) {
  *os << c.name;
}

class GgufCorrupt : public ::testing::TestWithParam<CorruptCase> {};

TEST_P(GgufCorrupt, FailsWithUsefulMessage) {
  const CorruptCase& cc = GetParam();
  const std::vector<uint8_t> bytes = cc.make();
  auto f = ParseBytes(bytes);
  ASSERT_FALSE(f.ok()) << cc.name << " parsed successfully";
  const std::string& msg = f.status().message();
  EXPECT_EQ(msg.rfind("[gguf]", 0), 0u) << msg;
  EXPECT_GT(msg.size(), 15u) << msg;
  for (const std::string& want : cc.expect_in_message) {
    EXPECT_NE(msg.find(want), std::string::npos) << "message lacks '" << want << "': " << msg;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GgufCorrupt, ::testing::ValuesIn(CorruptCases()),
                         [](const ::testing::TestParamInfo<CorruptCase>& i) { return i.param.name; });

TEST(GgufCorruptSweep, EveryTruncationBeforeTheLastTensorEndFails) {
  GgufWriter::Layout layout;
  const std::vector<uint8_t> good = SmallModel().Serialize(&layout);
  ASSERT_TRUE(ParseBytes(good).ok());
  const size_t end_of_data = layout.data_pos + layout.tensor_data_offset.back() + 8;
  for (size_t n = 0; n < end_of_data; ++n) {
    // A fresh exact-size heap copy so ASan sees any read past the end.
    std::vector<uint8_t> prefix(good.begin(), good.begin() + static_cast<ptrdiff_t>(n));
    auto f = ParseBytes(prefix);
    EXPECT_FALSE(f.ok()) << "prefix of " << n << " bytes parsed";
    if (!f.ok()) {
      EXPECT_FALSE(f.status().message().empty());
    }
  }
  // Dropping only the trailing padding after the last tensor is fine.
  EXPECT_TRUE(ParseBytes(std::vector<uint8_t>(good.begin(), good.begin() + end_of_data)).ok());
}

TEST(GgufCorruptSweep, RandomByteMutationsNeverCrash) {
  const std::vector<uint8_t> good = SmallModel().Serialize();
  std::mt19937 rng(1234);
  int failures = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<uint8_t> b = good;
    const int n_mut = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < n_mut; ++m) {
      const size_t at = rng() % b.size();
      switch (rng() % 3) {
        case 0:
          b[at] = static_cast<uint8_t>(rng());
          break;
        case 1:
          b[at] ^= static_cast<uint8_t>(1u << (rng() % 8));
          break;
        default:
          b[at] = (rng() & 1) ? 0xFF : 0x00;
          break;
      }
    }
    if (rng() % 4 == 0) b.resize(rng() % b.size());
    auto f = ParseBytes(b);
    if (!f.ok()) {
      ++failures;
      EXPECT_EQ(f.status().message().rfind("[gguf]", 0), 0u) << f.status().message();
    } else {
      // Whatever parsed must be internally consistent: tensor data inside the buffer.
      for (const TensorInfo& t : (*f)->tensors()) {
        ASSERT_GE(t.data, b.data());
        ASSERT_LE(t.data + t.n_bytes, b.data() + b.size());
      }
    }
  }
  EXPECT_GT(failures, 100);
}

// ---- Claimed sizes that the file's bytes do back ------------------------------------------
// A sparse file claims terabytes on a few disk blocks, so "fits in the file" does not bound
// memory. These parse a 1 TiB image of zeros (an anonymous mapping: untouched pages cost
// nothing) whose header claims counts and lengths that fit it. Before the parser bounded its
// reservations and charged what it stores to a memory budget, each one allocated hundreds of
// GiB (std::bad_alloc) or grew a vector until memory ran out.

class HugeImage {
 public:
  static constexpr size_t kSize = size_t{1} << 40;
  HugeImage() {
    void* p = ::mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p != MAP_FAILED) data_ = static_cast<uint8_t*>(p);
  }
  ~HugeImage() {
    if (data_) ::munmap(data_, kSize);
  }
  HugeImage(const HugeImage&) = delete;
  HugeImage& operator=(const HugeImage&) = delete;
  bool ok() const { return data_ != nullptr; }
  uint8_t* data() { return data_; }

 private:
  uint8_t* data_ = nullptr;
};

struct HugeCase {
  std::string name;
  std::function<void(uint8_t* image)> write;  // writes the non-zero bytes of the image
  std::vector<std::string> expect_in_message;
};

// A case whose image is `head` followed by zeros.
std::function<void(uint8_t*)> Head(std::function<ByteSink()> head) {
  return [head](uint8_t* image) {
    ByteSink s = head();
    std::memcpy(image, s.bytes().data(), s.size());
  };
}

// Header, one key and the start of an array value of `elem` elements claiming length n.
ByteSink ArrayHead(const char* key, ValueType elem, uint64_t n) {
  ByteSink s = Header(3, 0, 1);
  s.Str(key);
  s.U32(static_cast<uint32_t>(ValueType::kArray));
  s.U32(static_cast<uint32_t>(elem));
  s.U64(n);
  return s;
}

std::vector<HugeCase> HugeCases() {
  std::vector<HugeCase> c;
  // 2^36 kvs need >= 13 bytes each: they fit 1 TiB. The first key (all zeros) is empty.
  c.push_back({"KvCount2Pow36", Head([] { return Header(3, 0, 1ull << 36); }), {"metadata key #0 is empty"}});
  c.push_back({"TensorCount2Pow34", Head([] { return Header(3, 1ull << 34, 0); }), {"tensor #0 has an empty name"}});
  // The first name (a key, or a tensor's when there are no kvs) claims 512 GiB.
  auto first_name_length = [](uint64_t n_tensors, uint64_t n_kv) {
    return Head([=] {
      ByteSink s = Header(3, n_tensors, n_kv);
      s.U64(1ull << 39);
      return s;
    });
  };
  c.push_back({"KeyLength2Pow39", first_name_length(0, 1), {"metadata key", "too long"}});
  c.push_back({"TensorNameLength2Pow39", first_name_length(1, 0), {"tensor name", "too long"}});
  c.push_back({"StringValueLength2Pow39",
               Head([] {
                 ByteSink s = Header(3, 0, 1);
                 s.Str("general.name");
                 s.U32(static_cast<uint32_t>(ValueType::kString));
                 s.U64(1ull << 39);
                 return s;
               }),
               {"general.name", "MiB"}});
  c.push_back({"U8ArrayLength2Pow39",
               Head([] { return ArrayHead("tokenizer.ggml.token_type", ValueType::kU8, 1ull << 39); }),
               {"tokenizer.ggml.token_type", "MiB"}});
  c.push_back({"StringArrayLength2Pow36",
               Head([] { return ArrayHead("tokenizer.ggml.tokens", ValueType::kString, 1ull << 36); }),
               {"tokenizer.ggml.tokens", "MiB"}});
  c.push_back({"ManyLongStrings",
               [](uint8_t* image) {
                 // 4096 strings of 1 MiB (4 GiB): each length is plausible, their sum is not. Only
                 // the length fields are written; the string bytes are the image's zeros.
                 ByteSink s = ArrayHead("tokenizer.ggml.merges", ValueType::kString, 4096);
                 std::memcpy(image, s.bytes().data(), s.size());
                 size_t at = s.size();
                 for (int k = 0; k < 4096; ++k) {
                   const uint64_t len = 1ull << 20;
                   std::memcpy(image + at, &len, 8);
                   at += 8 + len;
                 }
               },
               {"tokenizer.ggml.merges", "MiB"}});
  return c;
}

void PrintTo(const HugeCase& c, std::ostream* os) {
  *os << c.name;
}

class GgufHugeClaim : public ::testing::TestWithParam<HugeCase> {};

TEST_P(GgufHugeClaim, FailsWithoutAHugeAllocation) {
  const HugeCase& hc = GetParam();
  HugeImage image;
  if (!image.ok()) GTEST_SKIP() << "cannot map a 1 TiB image";
  hc.write(image.data());
  auto f = GgufFile::Parse(image.data(), HugeImage::kSize);
  ASSERT_FALSE(f.ok()) << hc.name << " parsed successfully";
  const std::string& msg = f.status().message();
  EXPECT_EQ(msg.rfind("[gguf]", 0), 0u) << msg;
  for (const std::string& want : hc.expect_in_message) {
    EXPECT_NE(msg.find(want), std::string::npos) << "message lacks '" << want << "': " << msg;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GgufHugeClaim, ::testing::ValuesIn(HugeCases()),
                         [](const ::testing::TestParamInfo<HugeCase>& i) { return i.param.name; });

TEST(GgufOpen, RejectsDirectoryAndEmptyFile) {
  EXPECT_FALSE(GgufFile::Open(::testing::TempDir()).ok());
  const std::string path = ::testing::TempDir() + "/gguf_empty_" + std::to_string(::getpid());
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  auto r = GgufFile::Open(path);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(path), std::string::npos);
  std::filesystem::remove(path);
}

// ---- Real models ---------------------------------------------------------------------------

struct RealModel {
  std::vector<const char*> names;
  const char* arch;
  int64_t min_tensors;
};

void CheckRealModel(const RealModel& m) {
  std::string path;
  for (const char* n : m.names) {
    path = FindModelFile(n);
    if (!path.empty()) break;
  }
  if (path.empty()) GTEST_SKIP() << m.names[0] << " not found";
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  const GgufFile& g = **f;
  EXPECT_EQ(g.GetString("general.architecture"), m.arch);
  EXPECT_GE(static_cast<int64_t>(g.tensors().size()), m.min_tensors);
  const std::string a = m.arch;
  const auto blocks = g.GetInt(a + ".block_count");
  ASSERT_TRUE(blocks.has_value());
  // Every block has an attention-norm weight; tensor count is consistent with block count.
  for (int64_t k = 0; k < *blocks; ++k) {
    EXPECT_NE(g.FindTensor("blk." + std::to_string(k) + ".attn_norm.weight"), nullptr) << k;
  }
  EXPECT_NE(g.FindTensor("token_embd.weight"), nullptr);
  const auto* tokens = g.GetStringArray("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  EXPECT_GT(tokens->size(), 1000u);
  EXPECT_TRUE(g.GetInt(a + ".embedding_length").has_value());
  EXPECT_TRUE(g.GetInt(a + ".context_length").has_value());
}

TEST(GgufRealModel, SmolLM2) {
  CheckRealModel({{"SmolLM2-135M-Instruct.Q4_1.gguf"}, "llama", 30 * 9 + 2});
}
TEST(GgufRealModel, Gemma3) {
  CheckRealModel({{"gemma-3-270m-q4_k_m.gguf"}, "gemma3", 18 * 9});
}
TEST(GgufRealModel, Qwen05) {
  CheckRealModel({{"qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "qwen05.gguf"}, "qwen2", 24 * 12});
}
TEST(GgufRealModel, Qwen15) {
  CheckRealModel({{"qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "qwen15.gguf"}, "qwen2", 28 * 12});
}

}  // namespace
}  // namespace mr::gguf
