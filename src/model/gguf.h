// GGUF v2/v3 reader. The file is memory-mapped; every count, length, dimension product, offset
// and size is validated against the file size with overflow-safe arithmetic, and what the parse
// stores is bounded in memory (gguf.cpp: kMaxHeaderMemory, since a sparse file can claim sizes
// its disk blocks do not hold), so a malformed file yields an error Status and never a crash or
// a huge allocation. Spec: ggml/docs/gguf.md.
//
// Thread-safety: a GgufFile is immutable after Open/Parse and may be read from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"

namespace mr::gguf {

// ggml tensor types (values as in ggml.h). Only the ones the engine can dequantize are
// accepted by the loader; others are rejected naming tensor and type.
enum class TensorType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kBF16 = 30,
  kMXFP4 = 39,  // block_mxfp4: E8M0 shared exponent, 16 bytes of E2M1 nibbles per 32 elements
};

struct TypeTraits {
  const char* name;
  int64_t block_elems;  // elements per block
  int64_t block_bytes;  // bytes per block
};
// Traits of a supported tensor type, or nullptr for an unknown/unsupported type id.
const TypeTraits* GetTypeTraits(uint32_t type);
std::string TypeName(uint32_t type);  // "q4_K", or "unknown(123)"

enum class ValueType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};
const char* ValueTypeName(ValueType t);
// Encoded bytes of one scalar of type t (1, 2, 4 or 8); 0 for string, array and unknown types.
size_t ScalarBytes(ValueType t);

// A metadata value. Scalars fill exactly one of u/i/f/b/s by type; arrays fill the vector
// matching their element type (integers of every width in arr_int, bool too; floats in
// arr_float; strings in arr_str; nested arrays in arr_nested).
struct MetaValue {
  ValueType type = ValueType::kU8;
  ValueType elem_type = ValueType::kU8;  // arrays only
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0.0;
  bool b = false;
  std::string s;
  uint64_t array_len = 0;
  std::vector<int64_t> arr_int;
  std::vector<double> arr_float;
  std::vector<std::string> arr_str;
  std::vector<MetaValue> arr_nested;

  bool is_integer() const;
  bool is_float() const { return type == ValueType::kF32 || type == ValueType::kF64; }
};

struct TensorInfo {
  std::string name;
  uint32_t type = 0;
  std::vector<int64_t> dims;  // ggml order: dims[0] is the innermost (contiguous) dimension
  uint64_t offset = 0;        // relative to the data section
  int64_t n_elements = 0;
  uint64_t n_bytes = 0;
  const uint8_t* data = nullptr;  // into the mapping; valid while the GgufFile lives

  int64_t rows() const;                                                           // product of dims[1..]
  uint64_t row_bytes() const { return n_bytes / static_cast<uint64_t>(rows()); }  // bytes of one dims[0] row
  int64_t cols() const { return dims.empty() ? 0 : dims[0]; }
};

class GgufFile {
 public:
  // Map and parse a file. Errors name the file and what was wrong.
  static Result<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Parse an in-memory image (not copied: `data` must outlive the result).
  static Result<std::unique_ptr<GgufFile>> Parse(const uint8_t* data, size_t size);

  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  size_t file_size() const { return size_; }
  const std::string& path() const { return path_; }

  // Metadata in file order.
  const std::vector<std::pair<std::string, MetaValue>>& metadata() const { return meta_; }
  const MetaValue* Find(std::string_view key) const;
  std::optional<std::string> GetString(std::string_view key) const;
  std::optional<int64_t> GetInt(std::string_view key) const;   // any integer type (u64 > INT64_MAX: nullopt)
  std::optional<double> GetFloat(std::string_view key) const;  // f32/f64, or an integer
  std::optional<bool> GetBool(std::string_view key) const;
  const std::vector<std::string>* GetStringArray(std::string_view key) const;
  const std::vector<int64_t>* GetIntArray(std::string_view key) const;
  const std::vector<double>* GetFloatArray(std::string_view key) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* FindTensor(std::string_view name) const;
  // Drops this process's resident pages of the tensor's bytes (the whole pages inside them) when
  // the file is mapped: after the loader has copied a tensor into its own format, the mapping
  // no longer counts twice in the resident size. A later read of t.data faults the pages back
  // in from the file (the mapping is read-only), so this never changes what is read.
  void ReleasePages(const TensorInfo& t) const;

 private:
  GgufFile() = default;
  Status ParseImpl();

  std::string path_;
  void* map_ = nullptr;  // mmap base when opened from a file
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::vector<std::pair<std::string, MetaValue>> meta_;
  std::unordered_map<std::string, size_t> meta_index_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

}  // namespace mr::gguf
