// GGUF v2/v3 writer (spec: ggml/docs/gguf.md). Builds a file image in memory from metadata and
// raw tensor bytes: used by tests to make tiny models and hand-corrupted files, and by
// `mererun convert`.
//
// Layout written: header, metadata (insertion order), tensor infos (insertion order), zero
// padding to the alignment, then each tensor's bytes at an aligned offset followed by zero
// padding to the alignment. The alignment is the value of the "general.alignment" key when that
// key is present as an integer that is a non-zero power of two, else 32 (the GGUF default). So a
// test may store a bad alignment value and still get a well-laid-out file around it.
//
// The checked entry points (Set*, AddTensor) produce valid files; the Raw entry points and
// Overrides exist to produce invalid ones and check nothing.
//
// Thread-safety: none (a builder owned by one thread).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "model/gguf.h"

namespace mr::gguf {

// Little-endian byte appender; also used by tests to hand-craft GGUF fragments.
class ByteSink {
 public:
  void U8(uint8_t v) { bytes_.push_back(v); }
  void U16(uint16_t v) { Le(v, 2); }
  void U32(uint32_t v) { Le(v, 4); }
  void U64(uint64_t v) { Le(v, 8); }
  void I32(int32_t v) { Le(static_cast<uint32_t>(v), 4); }
  void I64(int64_t v) { Le(static_cast<uint64_t>(v), 8); }
  void F32(float v);
  void F64(double v);
  // GGUF string: u64 length, then the bytes (no terminator).
  void Str(std::string_view s);
  void Bytes(const void* p, size_t n);
  void Append(const std::vector<uint8_t>& v) { bytes_.insert(bytes_.end(), v.begin(), v.end()); }
  void PadTo(uint64_t alignment);  // zero bytes up to a multiple of alignment (> 0)

  size_t size() const { return bytes_.size(); }
  std::vector<uint8_t>& bytes() { return bytes_; }
  std::vector<uint8_t> Take() { return std::move(bytes_); }

 private:
  void Le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) bytes_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  std::vector<uint8_t> bytes_;
};

class GgufWriter {
 public:
  // Byte positions inside a Serialize() result, for tests that patch fields.
  struct Layout {
    size_t tensor_count_pos = 0;               // u64 field in the header
    size_t kv_count_pos = 0;                   // u64 field in the header
    std::vector<size_t> kv_pos;                // start of each kv (its key length field)
    std::vector<size_t> tensor_info_pos;       // start of each tensor info (its name length)
    std::vector<size_t> tensor_type_pos;       // u32 type field of each tensor info
    std::vector<size_t> tensor_offset_pos;     // u64 offset field of each tensor info
    size_t data_pos = 0;                       // start of the data section
    std::vector<uint64_t> tensor_data_offset;  // offset of each tensor relative to data_pos
    uint64_t alignment = 32;
  };

  explicit GgufWriter(uint32_t version = 3) : version_(version) {}

  void set_version(uint32_t v) { version_ = v; }
  uint32_t version() const { return version_; }

  // Metadata. A Set* of an existing key replaces its value in place (keeps the key's position).
  void SetU8(std::string_view key, uint8_t v);
  void SetI8(std::string_view key, int8_t v);
  void SetU16(std::string_view key, uint16_t v);
  void SetI16(std::string_view key, int16_t v);
  void SetU32(std::string_view key, uint32_t v);
  void SetI32(std::string_view key, int32_t v);
  void SetU64(std::string_view key, uint64_t v);
  void SetI64(std::string_view key, int64_t v);
  void SetF32(std::string_view key, float v);
  void SetF64(std::string_view key, double v);
  void SetBool(std::string_view key, bool v);
  void SetString(std::string_view key, std::string_view v);
  void SetArrayStr(std::string_view key, const std::vector<std::string>& v);
  void SetArrayU8(std::string_view key, const std::vector<uint8_t>& v);
  void SetArrayI8(std::string_view key, const std::vector<int8_t>& v);
  void SetArrayU16(std::string_view key, const std::vector<uint16_t>& v);
  void SetArrayI16(std::string_view key, const std::vector<int16_t>& v);
  void SetArrayU32(std::string_view key, const std::vector<uint32_t>& v);
  void SetArrayI32(std::string_view key, const std::vector<int32_t>& v);
  void SetArrayU64(std::string_view key, const std::vector<uint64_t>& v);
  void SetArrayI64(std::string_view key, const std::vector<int64_t>& v);
  void SetArrayF32(std::string_view key, const std::vector<float>& v);
  void SetArrayF64(std::string_view key, const std::vector<double>& v);
  void SetArrayBool(std::string_view key, const std::vector<bool>& v);
  // Sets general.alignment (u32); the data layout then uses it (see the file comment).
  void SetAlignment(uint32_t alignment) { SetU32("general.alignment", alignment); }
  // Any parsed value (scalar or array, nested arrays included), e.g. copied from a GgufFile.
  // Fails for a value whose type or element type is not a GGUF value type.
  Status SetValue(std::string_view key, const MetaValue& v);
  bool HasKey(std::string_view key) const;
  void RemoveKey(std::string_view key);

  // Appends a kv without any check: `type_id` is written as the value type and `payload` as
  // the value bytes verbatim. Duplicate keys are kept (for corrupt-file tests).
  void AddRawKv(std::string_view key, uint32_t type_id, std::vector<uint8_t> payload);

  // Adds a tensor; dims in ggml order (dims[0] contiguous). Fails if the name is taken, the
  // type is unknown, dims are not 1..4 positive values, dims[0] is not a multiple of the
  // block size, or bytes.size() differs from the size the type and dims imply.
  Status AddTensor(std::string_view name, uint32_t type, std::vector<int64_t> dims, std::vector<uint8_t> bytes);
  // Adds a tensor info without checks. dims are written verbatim as u64 (so negative values
  // appear as huge ones); `offset`, when set, is written instead of the computed offset (the
  // bytes are still placed at the computed position).
  void AddTensorRaw(std::string_view name, uint32_t type, std::vector<int64_t> dims, std::vector<uint8_t> bytes,
                    std::optional<uint64_t> offset = std::nullopt);
  size_t tensor_count() const { return tensors_.size(); }

  // Header count fields written instead of the true counts (for corrupt-file tests).
  void OverrideTensorCount(uint64_t n) { tensor_count_override_ = n; }
  void OverrideKvCount(uint64_t n) { kv_count_override_ = n; }

  // The whole file image.
  std::vector<uint8_t> Serialize(Layout* layout = nullptr) const;
  // Everything before the data section (header, metadata, tensor infos, padding).
  std::vector<uint8_t> SerializeHeader(Layout* layout = nullptr) const;
  // Writes the same bytes as Serialize() to `path` (replacing it), streaming the tensor data.
  // Errors name the path.
  Status WriteFile(const std::string& path) const;

 private:
  struct Kv {
    std::string key;
    uint32_t type_id;
    std::vector<uint8_t> payload;
  };
  struct Tensor {
    std::string name;
    uint32_t type;
    std::vector<int64_t> dims;
    std::vector<uint8_t> bytes;
    std::optional<uint64_t> offset;
  };
  void Put(std::string_view key, ValueType type, std::vector<uint8_t> payload);
  uint64_t LayoutAlignment() const;

  uint32_t version_;
  std::vector<Kv> kvs_;
  std::vector<Tensor> tensors_;
  std::optional<uint64_t> tensor_count_override_;
  std::optional<uint64_t> kv_count_override_;
};

}  // namespace mr::gguf
