#include "model/gguf_writer.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

namespace mr::gguf {
namespace {

constexpr uint64_t kDefaultAlignment = 32;
constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32

bool IsPowerOfTwo(uint64_t v) {
  return v != 0 && (v & (v - 1)) == 0;
}

bool IsIntegerType(ValueType t) {
  switch (t) {
    case ValueType::kU8:
    case ValueType::kI8:
    case ValueType::kU16:
    case ValueType::kI16:
    case ValueType::kU32:
    case ValueType::kI32:
    case ValueType::kU64:
    case ValueType::kI64:
    case ValueType::kBool:
      return true;
    default:
      return false;
  }
}

// Writes integer `v` as a scalar of integer type `t` (truncating to its width).
void PutInt(ByteSink& s, ValueType t, int64_t v) {
  const auto u = static_cast<uint64_t>(v);
  switch (ScalarBytes(t)) {
    case 1:
      s.U8(static_cast<uint8_t>(u));
      break;
    case 2:
      s.U16(static_cast<uint16_t>(u));
      break;
    case 4:
      s.U32(static_cast<uint32_t>(u));
      break;
    default:
      s.U64(u);
      break;
  }
}

// Writes the payload (no type id) of `v`. Returns false on an invalid type.
bool PutValue(ByteSink& s, const MetaValue& v) {
  switch (v.type) {
    case ValueType::kU8:
    case ValueType::kU16:
    case ValueType::kU32:
    case ValueType::kU64:
      PutInt(s, v.type, static_cast<int64_t>(v.u));
      return true;
    case ValueType::kI8:
    case ValueType::kI16:
    case ValueType::kI32:
    case ValueType::kI64:
      PutInt(s, v.type, v.i);
      return true;
    case ValueType::kBool:
      s.U8(v.b ? 1 : 0);
      return true;
    case ValueType::kF32:
      s.F32(static_cast<float>(v.f));
      return true;
    case ValueType::kF64:
      s.F64(v.f);
      return true;
    case ValueType::kString:
      s.Str(v.s);
      return true;
    case ValueType::kArray: {
      s.U32(static_cast<uint32_t>(v.elem_type));
      if (IsIntegerType(v.elem_type)) {
        s.U64(v.arr_int.size());
        for (int64_t x : v.arr_int) PutInt(s, v.elem_type, x);
      } else if (v.elem_type == ValueType::kF32) {
        s.U64(v.arr_float.size());
        for (double x : v.arr_float) s.F32(static_cast<float>(x));
      } else if (v.elem_type == ValueType::kF64) {
        s.U64(v.arr_float.size());
        for (double x : v.arr_float) s.F64(x);
      } else if (v.elem_type == ValueType::kString) {
        s.U64(v.arr_str.size());
        for (const std::string& x : v.arr_str) s.Str(x);
      } else if (v.elem_type == ValueType::kArray) {
        s.U64(v.arr_nested.size());
        for (const MetaValue& x : v.arr_nested) {
          if (x.type != ValueType::kArray) return false;
          if (!PutValue(s, x)) return false;
        }
      } else {
        return false;
      }
      return true;
    }
  }
  return false;
}

template <typename T, typename PutFn>
std::vector<uint8_t> ArrayPayload(ValueType elem, const std::vector<T>& v, PutFn put) {
  ByteSink s;
  s.U32(static_cast<uint32_t>(elem));
  s.U64(v.size());
  for (const T& x : v) put(s, x);
  return s.Take();
}

}  // namespace

void ByteSink::F32(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  U32(b);
}

void ByteSink::F64(double v) {
  uint64_t b;
  std::memcpy(&b, &v, 8);
  U64(b);
}

void ByteSink::Str(std::string_view s) {
  U64(s.size());
  Bytes(s.data(), s.size());
}

void ByteSink::Bytes(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  bytes_.insert(bytes_.end(), b, b + n);
}

void ByteSink::PadTo(uint64_t alignment) {
  while (bytes_.size() % alignment != 0) bytes_.push_back(0);
}

void GgufWriter::Put(std::string_view key, ValueType type, std::vector<uint8_t> payload) {
  for (Kv& kv : kvs_) {
    if (kv.key == key) {
      kv.type_id = static_cast<uint32_t>(type);
      kv.payload = std::move(payload);
      return;
    }
  }
  kvs_.push_back(Kv{std::string(key), static_cast<uint32_t>(type), std::move(payload)});
}

#define MR_GGUF_SCALAR_SETTER(Name, CType, VType, SinkFn)     \
  void GgufWriter::Set##Name(std::string_view key, CType v) { \
    ByteSink s;                                               \
    s.SinkFn(v);                                              \
    Put(key, ValueType::VType, s.Take());                     \
  }
MR_GGUF_SCALAR_SETTER(U8, uint8_t, kU8, U8)
MR_GGUF_SCALAR_SETTER(I8, int8_t, kI8, U8)
MR_GGUF_SCALAR_SETTER(U16, uint16_t, kU16, U16)
MR_GGUF_SCALAR_SETTER(I16, int16_t, kI16, U16)
MR_GGUF_SCALAR_SETTER(U32, uint32_t, kU32, U32)
MR_GGUF_SCALAR_SETTER(I32, int32_t, kI32, I32)
MR_GGUF_SCALAR_SETTER(U64, uint64_t, kU64, U64)
MR_GGUF_SCALAR_SETTER(I64, int64_t, kI64, I64)
MR_GGUF_SCALAR_SETTER(F32, float, kF32, F32)
MR_GGUF_SCALAR_SETTER(F64, double, kF64, F64)
MR_GGUF_SCALAR_SETTER(String, std::string_view, kString, Str)
#undef MR_GGUF_SCALAR_SETTER

void GgufWriter::SetBool(std::string_view key, bool v) {
  Put(key, ValueType::kBool, std::vector<uint8_t>{static_cast<uint8_t>(v ? 1 : 0)});
}

#define MR_GGUF_ARRAY_SETTER(Name, CType, VType, SinkFn)                                                       \
  void GgufWriter::SetArray##Name(std::string_view key, const std::vector<CType>& v) {                         \
    Put(key, ValueType::kArray, ArrayPayload(ValueType::VType, v, [](ByteSink& s, CType x) { s.SinkFn(x); })); \
  }
MR_GGUF_ARRAY_SETTER(U8, uint8_t, kU8, U8)
MR_GGUF_ARRAY_SETTER(I8, int8_t, kI8, U8)
MR_GGUF_ARRAY_SETTER(U16, uint16_t, kU16, U16)
MR_GGUF_ARRAY_SETTER(I16, int16_t, kI16, U16)
MR_GGUF_ARRAY_SETTER(U32, uint32_t, kU32, U32)
MR_GGUF_ARRAY_SETTER(I32, int32_t, kI32, I32)
MR_GGUF_ARRAY_SETTER(U64, uint64_t, kU64, U64)
MR_GGUF_ARRAY_SETTER(I64, int64_t, kI64, I64)
MR_GGUF_ARRAY_SETTER(F32, float, kF32, F32)
MR_GGUF_ARRAY_SETTER(F64, double, kF64, F64)
#undef MR_GGUF_ARRAY_SETTER

void GgufWriter::SetArrayBool(std::string_view key, const std::vector<bool>& v) {
  ByteSink s;
  s.U32(static_cast<uint32_t>(ValueType::kBool));
  s.U64(v.size());
  for (bool x : v) s.U8(x ? 1 : 0);
  Put(key, ValueType::kArray, s.Take());
}

void GgufWriter::SetArrayStr(std::string_view key, const std::vector<std::string>& v) {
  Put(key, ValueType::kArray, ArrayPayload(ValueType::kString, v, [](ByteSink& s, const std::string& x) { s.Str(x); }));
}

Status GgufWriter::SetValue(std::string_view key, const MetaValue& v) {
  ByteSink s;
  if (!PutValue(s, v)) {
    return InvalidArgument("[gguf-writer] key '" + std::string(key) + "': value of invalid type " +
                           std::to_string(static_cast<uint32_t>(v.type)) + " (element type " +
                           std::to_string(static_cast<uint32_t>(v.elem_type)) + ")");
  }
  Put(key, v.type, s.Take());
  return Status::Ok();
}

bool GgufWriter::HasKey(std::string_view key) const {
  for (const Kv& kv : kvs_) {
    if (kv.key == key) return true;
  }
  return false;
}

void GgufWriter::RemoveKey(std::string_view key) {
  std::erase_if(kvs_, [&](const Kv& kv) { return kv.key == key; });
}

void GgufWriter::AddRawKv(std::string_view key, uint32_t type_id, std::vector<uint8_t> payload) {
  kvs_.push_back(Kv{std::string(key), type_id, std::move(payload)});
}

Status GgufWriter::AddTensor(std::string_view name, uint32_t type, std::vector<int64_t> dims,
                             std::vector<uint8_t> bytes) {
  const std::string where = "[gguf-writer] tensor '" + std::string(name) + "': ";
  for (const Tensor& t : tensors_) {
    if (t.name == name) return InvalidArgument(where + "duplicate name");
  }
  const TypeTraits* traits = GetTypeTraits(type);
  if (traits == nullptr) return Unsupported(where + "unknown type " + TypeName(type));
  if (dims.empty() || dims.size() > 4) {
    return InvalidArgument(where + "got " + std::to_string(dims.size()) + " dims, expected 1..4");
  }
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d <= 0) return InvalidArgument(where + "non-positive dim " + std::to_string(d));
    if (n > std::numeric_limits<int64_t>::max() / d) {
      return InvalidArgument(where + "element count overflows");
    }
    n *= d;
  }
  if (dims[0] % traits->block_elems != 0) {
    return InvalidArgument(where + "dims[0] = " + std::to_string(dims[0]) + " is not a multiple of the block size " +
                           std::to_string(traits->block_elems) + " of " + traits->name);
  }
  const auto expected = static_cast<uint64_t>(n / traits->block_elems) * static_cast<uint64_t>(traits->block_bytes);
  if (bytes.size() != expected) {
    return InvalidArgument(where + "got " + std::to_string(bytes.size()) + " bytes, expected " +
                           std::to_string(expected));
  }
  AddTensorRaw(name, type, std::move(dims), std::move(bytes));
  return Status::Ok();
}

void GgufWriter::AddTensorRaw(std::string_view name, uint32_t type, std::vector<int64_t> dims,
                              std::vector<uint8_t> bytes, std::optional<uint64_t> offset) {
  tensors_.push_back(Tensor{std::string(name), type, std::move(dims), std::move(bytes), offset});
}

uint64_t GgufWriter::LayoutAlignment() const {
  for (const Kv& kv : kvs_) {
    if (kv.key != "general.alignment") continue;
    const auto t = static_cast<ValueType>(kv.type_id);
    const size_t width = ScalarBytes(t);
    if (!IsIntegerType(t) || t == ValueType::kBool || kv.payload.size() != width) break;
    uint64_t v = 0;
    for (size_t i = 0; i < width; ++i) v |= static_cast<uint64_t>(kv.payload[i]) << (8 * i);
    return IsPowerOfTwo(v) ? v : kDefaultAlignment;
  }
  return kDefaultAlignment;
}

std::vector<uint8_t> GgufWriter::SerializeHeader(Layout* layout) const {
  Layout local;
  Layout& lay = layout != nullptr ? *layout : local;
  lay = Layout{};
  lay.alignment = LayoutAlignment();

  // Data offsets first: each tensor starts at an aligned offset within the data section.
  uint64_t data_size = 0;
  for (const Tensor& t : tensors_) {
    lay.tensor_data_offset.push_back(data_size);
    data_size += t.bytes.size();
    data_size = (data_size + lay.alignment - 1) / lay.alignment * lay.alignment;
  }

  ByteSink s;
  s.U32(kMagic);
  s.U32(version_);
  lay.tensor_count_pos = s.size();
  s.U64(tensor_count_override_.value_or(tensors_.size()));
  lay.kv_count_pos = s.size();
  s.U64(kv_count_override_.value_or(kvs_.size()));
  for (const Kv& kv : kvs_) {
    lay.kv_pos.push_back(s.size());
    s.Str(kv.key);
    s.U32(kv.type_id);
    s.Append(kv.payload);
  }
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Tensor& t = tensors_[i];
    lay.tensor_info_pos.push_back(s.size());
    s.Str(t.name);
    s.U32(static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) s.I64(d);
    lay.tensor_type_pos.push_back(s.size());
    s.U32(t.type);
    lay.tensor_offset_pos.push_back(s.size());
    s.U64(t.offset.value_or(lay.tensor_data_offset[i]));
  }
  s.PadTo(lay.alignment);
  lay.data_pos = s.size();
  return s.Take();
}

std::vector<uint8_t> GgufWriter::Serialize(Layout* layout) const {
  Layout local;
  Layout& lay = layout != nullptr ? *layout : local;
  ByteSink s;
  s.Append(SerializeHeader(&lay));
  for (const Tensor& t : tensors_) {
    s.Append(t.bytes);
    s.PadTo(lay.alignment);
  }
  return s.Take();
}

Status GgufWriter::WriteFile(const std::string& path) const {
  // Streams the tensors instead of building the whole image: converted models are gigabytes.
  Layout lay;
  const std::vector<uint8_t> header = SerializeHeader(&lay);
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    return IoError("[gguf-writer] cannot open '" + path + "' for writing: " + std::strerror(errno));
  }
  uint64_t expected = header.size(), written = 0;
  auto put = [&](const void* p, size_t n) {
    if (n > 0) written += std::fwrite(p, 1, n, f);
  };
  put(header.data(), header.size());
  static const uint8_t kZeros[4096] = {};
  for (const Tensor& t : tensors_) {
    put(t.bytes.data(), t.bytes.size());
    expected += t.bytes.size();
    uint64_t pad = (lay.alignment - expected % lay.alignment) % lay.alignment;
    expected += pad;
    while (pad > 0) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(pad, sizeof kZeros));
      put(kZeros, n);
      pad -= n;
    }
  }
  const bool close_ok = std::fclose(f) == 0;
  if (written != expected || !close_ok) {
    return IoError("[gguf-writer] short write to '" + path + "': wrote " + std::to_string(written) + " of " +
                   std::to_string(expected) + " bytes");
  }
  return Status::Ok();
}

}  // namespace mr::gguf
