#include "model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

namespace mr::gguf {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little endian
// Sanity caps beyond the file-size checks: they bound memory when counts are individually
// plausible but their product is not.
constexpr uint64_t kMaxDims = 4;
constexpr int kMaxArrayDepth = 4;
constexpr uint64_t kMaxReserve = 1 << 16;
constexpr uint64_t kMaxNestedArrays = 1 << 16;
// The file-size checks alone do not bound memory: a sparse file claims terabytes on a few
// disk blocks, and parsed values take several times their encoded size (an i8 becomes an
// int64, a string a std::string). Everything the header parse stores is charged against this
// budget before it is allocated; real models need a few tens of MiB (mostly the vocabulary).
constexpr uint64_t kMaxHeaderMemory = 256ull << 20;
// An unordered_map node (hash, next pointer, key string, value) beside the key's own bytes.
constexpr uint64_t kIndexEntryMemory = 64;
// Keys and tensor names are identifiers (ggml caps tensor names at 64 bytes).
constexpr uint64_t kMaxNameLength = 1 << 16;

const TypeTraits kTraits[] = {
    {"f32", 1, 4},      {"f16", 1, 2},      {"q4_0", 32, 18},   {"q4_1", 32, 20},
    {nullptr, 0, 0},    {nullptr, 0, 0},    {"q5_0", 32, 22},   {"q5_1", 32, 24},
    {"q8_0", 32, 34},   {"q8_1", 32, 36},   {"q2_K", 256, 84},  {"q3_K", 256, 110},
    {"q4_K", 256, 144}, {"q5_K", 256, 176}, {"q6_K", 256, 210}, {"q8_K", 256, 292},
};
const TypeTraits kBf16 = {"bf16", 1, 2};
const TypeTraits kI8 = {"i8", 1, 1};
const TypeTraits kI16 = {"i16", 1, 2};
const TypeTraits kI32 = {"i32", 1, 4};
const TypeTraits kI64 = {"i64", 1, 8};
const TypeTraits kF64 = {"f64", 1, 8};
const TypeTraits kMxfp4 = {"mxfp4", 32, 17};

bool MulOverflow(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}
bool AddOverflow(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_add_overflow(a, b, out);
}

// Bounds-checked little-endian cursor over the mapped image.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  Status Bytes(void* out, size_t n, const char* what) {
    if (n > remaining()) {
      return InvalidArgument(std::string("[gguf] truncated file while reading ") + what + " at offset " +
                             std::to_string(pos_) + " (need " + std::to_string(n) + " bytes, " +
                             std::to_string(remaining()) + " left)");
    }
    std::memcpy(out, data_ + pos_, n);
    pos_ += n;
    return Status::Ok();
  }
  template <typename T>
  Status Pod(T* out, const char* what) {
    return Bytes(out, sizeof(T), what);
  }

  // A GGUF string of at most max_len bytes (a name), charged against the memory budget.
  Status String(std::string* out, const char* what, uint64_t max_len = UINT64_MAX) {
    uint64_t len = 0;
    MR_RETURN_IF_ERROR(Pod(&len, what));
    if (len > remaining()) {
      return InvalidArgument(std::string("[gguf] string length of ") + what + " exceeds the file (got " +
                             std::to_string(len) + ", " + std::to_string(remaining()) + " bytes left)");
    }
    if (len > max_len) {
      return InvalidArgument(std::string("[gguf] string length of ") + what + " is too long (got " +
                             std::to_string(len) + ", at most " + std::to_string(max_len) + ")");
    }
    MR_RETURN_IF_ERROR(Charge(len, what));
    out->assign(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return Status::Ok();
  }

  // Accounts for `bytes` of memory the parse is about to allocate (see kMaxHeaderMemory).
  Status Charge(uint64_t bytes, const char* what) {
    if (bytes > budget_) {
      return InvalidArgument(std::string("[gguf] ") + what + " needs more memory than the " +
                             std::to_string(kMaxHeaderMemory >> 20) + " MiB allowed for metadata and tensor infos");
    }
    budget_ -= bytes;
    return Status::Ok();
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  uint64_t budget_ = kMaxHeaderMemory;
};

// Minimum encoded size of one value of type t (used to reject impossible array lengths before
// allocating). Strings take at least their 8-byte length; arrays at least type + length.
uint64_t MinEncodedSize(ValueType t) {
  if (t == ValueType::kString) return 8;
  if (t == ValueType::kArray) return 12;
  const size_t n = ScalarBytes(t);
  return n > 0 ? n : 1;
}

bool ValidValueType(uint32_t t) {
  return t <= static_cast<uint32_t>(ValueType::kF64);
}

Status ReadScalarBody(Reader& r, ValueType t, MetaValue* v, const std::string& key) {
  v->type = t;
  const char* what = "metadata value";
  switch (t) {
    case ValueType::kU8: {
      uint8_t x;
      MR_RETURN_IF_ERROR(r.Pod(&x, what));
      v->u = x;
      v->i = x;
      break;
    }
    case ValueType::kI8: {
      int8_t x;
      MR_RETURN_IF_ERROR(r.Pod(&x, what));
      v->i = x;
      v->u = static_cast<uint64_t>(x);
      break;
    }
    case ValueType::kU16: {
      uint16_t x;
      MR_RETURN_IF_ERROR(r.Pod(&x, what));
      v->u = x;
      v->i = x;
      break;
    }
    case ValueType::kI16: {
      int16_t x;
      MR_RETURN_IF_ERROR(r.Pod(&x, what));
      v->i = x;
      v->u = static_cast<uint64_t>(x);
      break;
    }
    case ValueType::kU32: {
      uint32_t x;
      MR_RETURN_IF_ERROR(r.Pod(&x, what));
      v->u = x;
      v->i = x;
      break;
    }
    case ValueType::kI32: {
      int32_t x;
      MR_RETURN_IF_ERROR(r.Pod(&x, what));
      v->i = x;
      v->u = static_cast<uint64_t>(x);
      break;
    }
    case ValueType::kU64: {
      uint64_t x;
      MR_RETURN_IF_ERROR(r.Pod(&x, what));
      v->u = x;
      v->i = static_cast<int64_t>(x);
      break;
    }
    case ValueType::kI64: {
      int64_t x;
      MR_RETURN_IF_ERROR(r.Pod(&x, what));
      v->i = x;
      v->u = static_cast<uint64_t>(x);
      break;
    }
    case ValueType::kF32: {
      float x;
      MR_RETURN_IF_ERROR(r.Pod(&x, what));
      v->f = x;
      break;
    }
    case ValueType::kF64: {
      double x;
      MR_RETURN_IF_ERROR(r.Pod(&x, what));
      v->f = x;
      break;
    }
    case ValueType::kBool: {
      uint8_t x;
      MR_RETURN_IF_ERROR(r.Pod(&x, what));
      if (x > 1) return InvalidArgument("[gguf] key '" + key + "': bool value " + std::to_string(x) + " is not 0 or 1");
      v->b = x != 0;
      v->u = x;
      v->i = x;
      break;
    }
    case ValueType::kString:
      MR_RETURN_IF_ERROR(r.String(&v->s, what));
      break;
    case ValueType::kArray:
      return Internal("[gguf] ReadScalar called on array");
  }
  return Status::Ok();
}

// The key is named only on failure, so arrays of 10^5 scalars build no message per element.
Status ReadScalar(Reader& r, ValueType t, MetaValue* v, const std::string& key) {
  Status st = ReadScalarBody(r, t, v, key);
  if (st.ok() || st.message().find("'" + key + "'") != std::string::npos) return st;
  return Status(st.code(), st.message() + " (key '" + key + "')");
}

Status ReadValue(Reader& r, ValueType t, MetaValue* v, const std::string& key, int depth) {
  if (t != ValueType::kArray) return ReadScalar(r, t, v, key);
  if (depth >= kMaxArrayDepth)
    return InvalidArgument("[gguf] key '" + key + "': arrays nested deeper than " + std::to_string(kMaxArrayDepth));
  v->type = ValueType::kArray;
  uint32_t et = 0;
  MR_RETURN_IF_ERROR(r.Pod(&et, "array element type"));
  if (!ValidValueType(et))
    return InvalidArgument("[gguf] key '" + key + "': unknown array element type " + std::to_string(et));
  v->elem_type = static_cast<ValueType>(et);
  uint64_t n = 0;
  MR_RETURN_IF_ERROR(r.Pod(&n, "array length"));
  uint64_t min_bytes = 0;
  if (MulOverflow(n, MinEncodedSize(v->elem_type), &min_bytes) || min_bytes > r.remaining()) {
    return InvalidArgument("[gguf] key '" + key + "': array length " + std::to_string(n) + " exceeds the file (" +
                           std::to_string(r.remaining()) + " bytes left)");
  }
  v->array_len = n;
  const ValueType e = v->elem_type;
  const uint64_t elem_memory = e == ValueType::kString  ? sizeof(std::string)
                               : e == ValueType::kArray ? sizeof(MetaValue)
                                                        : sizeof(int64_t);  // arr_int / arr_float
  uint64_t memory = 0;
  if (MulOverflow(n, elem_memory, &memory) || !r.Charge(memory, "array").ok()) {
    return InvalidArgument("[gguf] key '" + key + "': array of " + std::to_string(n) +
                           " elements needs more memory than the " + std::to_string(kMaxHeaderMemory >> 20) +
                           " MiB allowed for metadata");
  }
  // Grow as elements really parse (a lying length costs no more memory than the bytes that
  // back it), and bound arrays of arrays, whose 12-byte empty elements are cheap to forge.
  const size_t reserve = static_cast<size_t>(std::min<uint64_t>(n, kMaxReserve));
  if (e == ValueType::kString) {
    v->arr_str.reserve(reserve);
    for (uint64_t k = 0; k < n; ++k) {
      std::string s;
      if (Status st = r.String(&s, "array string"); !st.ok()) {
        return Status(st.code(), st.message() + " (key '" + key + "', element " + std::to_string(k) + ")");
      }
      v->arr_str.push_back(std::move(s));
    }
  } else if (e == ValueType::kArray) {
    if (n > kMaxNestedArrays) {
      return InvalidArgument("[gguf] key '" + key + "': " + std::to_string(n) + " nested arrays (at most " +
                             std::to_string(kMaxNestedArrays) + " supported)");
    }
    v->arr_nested.resize(n);
    for (uint64_t k = 0; k < n; ++k) MR_RETURN_IF_ERROR(ReadValue(r, e, &v->arr_nested[k], key, depth + 1));
  } else if (e == ValueType::kF32 || e == ValueType::kF64) {
    v->arr_float.reserve(reserve);
    MetaValue tmp;
    for (uint64_t k = 0; k < n; ++k) {
      MR_RETURN_IF_ERROR(ReadScalar(r, e, &tmp, key));
      v->arr_float.push_back(tmp.f);
    }
  } else {
    v->arr_int.reserve(reserve);
    MetaValue tmp;
    for (uint64_t k = 0; k < n; ++k) {
      MR_RETURN_IF_ERROR(ReadScalar(r, e, &tmp, key));
      v->arr_int.push_back(tmp.i);
    }
  }
  return Status::Ok();
}

}  // namespace

const TypeTraits* GetTypeTraits(uint32_t type) {
  if (type < sizeof(kTraits) / sizeof(kTraits[0])) return kTraits[type].name ? &kTraits[type] : nullptr;
  switch (static_cast<TensorType>(type)) {
    case TensorType::kBF16:
      return &kBf16;
    case TensorType::kI8:
      return &kI8;
    case TensorType::kI16:
      return &kI16;
    case TensorType::kI32:
      return &kI32;
    case TensorType::kI64:
      return &kI64;
    case TensorType::kF64:
      return &kF64;
    case TensorType::kMXFP4:
      return &kMxfp4;
    default:
      return nullptr;
  }
}

std::string TypeName(uint32_t type) {
  const TypeTraits* t = GetTypeTraits(type);
  return t ? t->name : "unknown(" + std::to_string(type) + ")";
}

size_t ScalarBytes(ValueType t) {
  switch (t) {
    case ValueType::kU8:
    case ValueType::kI8:
    case ValueType::kBool:
      return 1;
    case ValueType::kU16:
    case ValueType::kI16:
      return 2;
    case ValueType::kU32:
    case ValueType::kI32:
    case ValueType::kF32:
      return 4;
    case ValueType::kU64:
    case ValueType::kI64:
    case ValueType::kF64:
      return 8;
    default:
      return 0;
  }
}

const char* ValueTypeName(ValueType t) {
  static const char* kNames[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                 "bool", "string", "array", "u64", "i64", "f64"};
  auto i = static_cast<uint32_t>(t);
  return i < 13 ? kNames[i] : "unknown";
}

bool MetaValue::is_integer() const {
  switch (type) {
    case ValueType::kU8:
    case ValueType::kI8:
    case ValueType::kU16:
    case ValueType::kI16:
    case ValueType::kU32:
    case ValueType::kI32:
    case ValueType::kU64:
    case ValueType::kI64:
      return true;
    default:
      return false;
  }
}

int64_t TensorInfo::rows() const {
  int64_t r = 1;
  for (size_t k = 1; k < dims.size(); ++k) r *= dims[k];
  return r;
}

Result<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return IoError("[gguf] cannot open '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return IoError("[gguf] cannot stat '" + path + "': " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgument("[gguf] '" + path + "' is not a regular file");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    return InvalidArgument("[gguf] '" + path + "' is empty");
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return IoError("[gguf] cannot mmap '" + path + "': " + std::strerror(errno));
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  f->map_ = map;
  f->base_ = static_cast<const uint8_t*>(map);
  f->size_ = size;
  Status st2 = f->ParseImpl();
  if (!st2.ok()) return Status(st2.code(), st2.message() + " in '" + path + "'");
  return f;
}

Result<std::unique_ptr<GgufFile>> GgufFile::Parse(const uint8_t* data, size_t size) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->base_ = data;
  f->size_ = size;
  MR_RETURN_IF_ERROR(f->ParseImpl());
  return f;
}

void GgufFile::ReleasePages(const TensorInfo& t) const {
  if (map_ == nullptr || t.data == nullptr) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t b = (reinterpret_cast<uintptr_t>(t.data) + page - 1) / page * page;
  const uintptr_t e = (reinterpret_cast<uintptr_t>(t.data) + t.n_bytes) / page * page;
  if (e > b) ::madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);  // advisory: failure is harmless
}

GgufFile::~GgufFile() {
  if (map_) ::munmap(map_, size_);
}

Status GgufFile::ParseImpl() {
  Reader r(base_, size_);
  uint32_t magic = 0;
  MR_RETURN_IF_ERROR(r.Pod(&magic, "magic"));
  if (magic != kMagic) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "0x%08x", magic);
    return InvalidArgument(std::string("[gguf] bad magic: got ") + buf + ", expected 0x46554747 (\"GGUF\")");
  }
  MR_RETURN_IF_ERROR(r.Pod(&version_, "version"));
  if (version_ != 2 && version_ != 3) {
    return Unsupported("[gguf] unsupported version " + std::to_string(version_) + " (supported: 2, 3)");
  }
  uint64_t n_tensors = 0, n_kv = 0;
  MR_RETURN_IF_ERROR(r.Pod(&n_tensors, "tensor count"));
  MR_RETURN_IF_ERROR(r.Pod(&n_kv, "metadata count"));
  // Each kv needs at least key length (8) + type (4) + 1 byte; each tensor info at least
  // name length (8) + n_dims (4) + one dim (8) + type (4) + offset (8).
  uint64_t need = 0;
  if (MulOverflow(n_kv, 13, &need) || need > r.remaining()) {
    return InvalidArgument("[gguf] metadata count " + std::to_string(n_kv) + " cannot fit in the file");
  }
  if (MulOverflow(n_tensors, 32, &need) || need > r.remaining()) {
    return InvalidArgument("[gguf] tensor count " + std::to_string(n_tensors) + " cannot fit in the file");
  }

  // Reserve no more than a bound: the counts are only known to fit the file's bytes, and each
  // entry takes far more memory than its minimal encoding.
  meta_.reserve(static_cast<size_t>(std::min<uint64_t>(n_kv, kMaxReserve)));
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key;
    MR_RETURN_IF_ERROR(r.Charge(sizeof(meta_[0]), "metadata"));
    MR_RETURN_IF_ERROR(r.String(&key, "metadata key", kMaxNameLength));
    if (key.empty()) return InvalidArgument("[gguf] metadata key #" + std::to_string(k) + " is empty");
    MR_RETURN_IF_ERROR(r.Charge(key.size() + kIndexEntryMemory, "metadata key index"));  // meta_index_
    uint32_t vt = 0;
    MR_RETURN_IF_ERROR(r.Pod(&vt, "metadata value type"));
    if (!ValidValueType(vt))
      return InvalidArgument("[gguf] key '" + key + "': unknown value type " + std::to_string(vt));
    MetaValue v;
    MR_RETURN_IF_ERROR(ReadValue(r, static_cast<ValueType>(vt), &v, key, 0));
    if (meta_index_.count(key)) return InvalidArgument("[gguf] duplicate metadata key '" + key + "'");
    meta_index_.emplace(key, meta_.size());
    meta_.emplace_back(std::move(key), std::move(v));
  }

  if (const MetaValue* a = Find("general.alignment")) {
    if (!a->is_integer() || a->u == 0 || (a->u & (a->u - 1)) != 0 || a->u > (1u << 20)) {
      return InvalidArgument("[gguf] general.alignment must be a power of two integer, got " +
                             (a->is_integer() ? std::to_string(a->u) : std::string(ValueTypeName(a->type))));
    }
    alignment_ = a->u;
  }

  tensors_.reserve(static_cast<size_t>(std::min<uint64_t>(n_tensors, kMaxReserve)));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    TensorInfo t;
    MR_RETURN_IF_ERROR(r.Charge(sizeof(TensorInfo) + kMaxDims * sizeof(int64_t), "tensor infos"));
    MR_RETURN_IF_ERROR(r.String(&t.name, "tensor name", kMaxNameLength));
    if (t.name.empty()) return InvalidArgument("[gguf] tensor #" + std::to_string(k) + " has an empty name");
    MR_RETURN_IF_ERROR(r.Charge(t.name.size() + kIndexEntryMemory, "tensor name index"));  // tensor_index_
    const std::string tn = "[gguf] tensor '" + t.name + "': ";
    uint32_t n_dims = 0;
    MR_RETURN_IF_ERROR(r.Pod(&n_dims, "tensor n_dims"));
    if (n_dims == 0 || n_dims > kMaxDims)
      return InvalidArgument(tn + "n_dims " + std::to_string(n_dims) + " is not in 1..4");
    uint64_t n_elem = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      int64_t dim = 0;
      MR_RETURN_IF_ERROR(r.Pod(&dim, "tensor dimension"));
      if (dim <= 0)
        return InvalidArgument(tn + "dimension " + std::to_string(d) + " is " + std::to_string(dim) + " (must be > 0)");
      if (MulOverflow(n_elem, static_cast<uint64_t>(dim), &n_elem) || n_elem > static_cast<uint64_t>(INT64_MAX)) {
        return InvalidArgument(tn + "element count overflows");
      }
      t.dims.push_back(dim);
    }
    MR_RETURN_IF_ERROR(r.Pod(&t.type, "tensor type"));
    MR_RETURN_IF_ERROR(r.Pod(&t.offset, "tensor offset"));
    const TypeTraits* tr = GetTypeTraits(t.type);
    if (!tr) return Unsupported(tn + "unknown tensor type " + std::to_string(t.type));
    if (t.dims[0] % tr->block_elems != 0) {
      return InvalidArgument(tn + "row length " + std::to_string(t.dims[0]) + " is not a multiple of the " + tr->name +
                             " block size " + std::to_string(tr->block_elems));
    }
    uint64_t n_bytes = 0;
    if (MulOverflow(n_elem / tr->block_elems, tr->block_bytes, &n_bytes))
      return InvalidArgument(tn + "byte size overflows");
    t.n_elements = static_cast<int64_t>(n_elem);
    t.n_bytes = n_bytes;
    if (t.offset % alignment_ != 0) {
      return InvalidArgument(tn + "offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                             std::to_string(alignment_));
    }
    if (tensor_index_.count(t.name)) return InvalidArgument("[gguf] duplicate tensor name '" + t.name + "'");
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment after the header.
  uint64_t data_start = (r.pos() + alignment_ - 1) / alignment_ * alignment_;
  if (data_start > size_ && !tensors_.empty()) {
    return InvalidArgument("[gguf] data section starts at " + std::to_string(data_start) +
                           ", past the end of the file (" + std::to_string(size_) + " bytes)");
  }
  for (TensorInfo& t : tensors_) {
    uint64_t begin = 0, end = 0;
    if (AddOverflow(data_start, t.offset, &begin) || AddOverflow(begin, t.n_bytes, &end) || end > size_) {
      return InvalidArgument("[gguf] tensor '" + t.name + "': data [" + std::to_string(t.offset) + ", +" +
                             std::to_string(t.n_bytes) + ") runs past the end of the file (data section at " +
                             std::to_string(data_start) + ", file size " + std::to_string(size_) + ")");
    }
    t.data = base_ + begin;
  }
  // Tensor data must not overlap (a sign of a corrupted header).
  std::vector<std::pair<uint64_t, size_t>> order;
  order.reserve(tensors_.size());
  for (size_t k = 0; k < tensors_.size(); ++k) order.emplace_back(tensors_[k].offset, k);
  std::sort(order.begin(), order.end());
  for (size_t k = 1; k < order.size(); ++k) {
    const TensorInfo& prev = tensors_[order[k - 1].second];
    const TensorInfo& cur = tensors_[order[k].second];
    if (prev.offset + prev.n_bytes > cur.offset) {
      return InvalidArgument("[gguf] tensors '" + prev.name + "' and '" + cur.name + "' overlap");
    }
  }
  return Status::Ok();
}

const MetaValue* GgufFile::Find(std::string_view key) const {
  auto it = meta_index_.find(std::string(key));
  return it == meta_index_.end() ? nullptr : &meta_[it->second].second;
}

std::optional<std::string> GgufFile::GetString(std::string_view key) const {
  const MetaValue* v = Find(key);
  if (!v || v->type != ValueType::kString) return std::nullopt;
  return v->s;
}

std::optional<int64_t> GgufFile::GetInt(std::string_view key) const {
  const MetaValue* v = Find(key);
  if (!v) return std::nullopt;
  if (v->type == ValueType::kBool) return v->b ? 1 : 0;
  if (!v->is_integer()) return std::nullopt;
  if (v->type == ValueType::kU64 && v->u > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
  return v->i;
}

std::optional<double> GgufFile::GetFloat(std::string_view key) const {
  const MetaValue* v = Find(key);
  if (!v) return std::nullopt;
  if (v->is_float()) return v->f;
  if (v->is_integer()) return static_cast<double>(v->i);
  return std::nullopt;
}

std::optional<bool> GgufFile::GetBool(std::string_view key) const {
  const MetaValue* v = Find(key);
  if (!v) return std::nullopt;
  if (v->type == ValueType::kBool) return v->b;
  if (v->is_integer()) return v->i != 0;
  return std::nullopt;
}

const std::vector<std::string>* GgufFile::GetStringArray(std::string_view key) const {
  const MetaValue* v = Find(key);
  return v && v->type == ValueType::kArray && v->elem_type == ValueType::kString ? &v->arr_str : nullptr;
}

const std::vector<int64_t>* GgufFile::GetIntArray(std::string_view key) const {
  const MetaValue* v = Find(key);
  return v && v->type == ValueType::kArray && !v->arr_int.empty()
             ? &v->arr_int
             : (v && v->type == ValueType::kArray && v->array_len == 0 ? &v->arr_int : nullptr);
}

const std::vector<double>* GgufFile::GetFloatArray(std::string_view key) const {
  const MetaValue* v = Find(key);
  return v && v->type == ValueType::kArray && (v->elem_type == ValueType::kF32 || v->elem_type == ValueType::kF64)
             ? &v->arr_float
             : nullptr;
}

const TensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace mr::gguf
