// The per-sequence KV cache: BF16 rows of every layer's keys and values, in lazily resident
// anonymous mappings.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace mr {

// A BF16 buffer of KV rows backed by an anonymous private mapping: pages cost no resident
// memory until written (untouched positions of a long-context cache are free), and Release()
// hands them back to the OS (they read as zero afterwards). Movable, not copyable.
class KvBuffer {
 public:
  KvBuffer() = default;
  explicit KvBuffer(size_t n);  // n uint16_t, zero; throws std::bad_alloc as operator new would
  KvBuffer(KvBuffer&& o) noexcept : p_(o.p_), n_(o.n_) {
    o.p_ = nullptr;
    o.n_ = 0;
  }
  KvBuffer& operator=(KvBuffer&& o) noexcept;
  KvBuffer(const KvBuffer&) = delete;
  KvBuffer& operator=(const KvBuffer&) = delete;
  ~KvBuffer();

  uint16_t* data() { return p_; }
  const uint16_t* data() const { return p_; }
  size_t size() const { return n_; }
  uint16_t* begin() { return p_; }
  uint16_t* end() { return p_ + n_; }
  const uint16_t* begin() const { return p_; }
  const uint16_t* end() const { return p_ + n_; }
  uint16_t& operator[](size_t i) { return p_[i]; }
  const uint16_t& operator[](size_t i) const { return p_[i]; }
  // Returns the pages to the OS (madvise MADV_DONTNEED); the contents read as zero after.
  void Release();

 private:
  uint16_t* p_ = nullptr;
  size_t n_ = 0;
};

// Per-sequence KV cache in BF16. k[l], v[l]: (n_ctx, n_head_kv * head_dim). Memory is lazy:
// a position costs resident memory only once written. Movable, not copyable.
struct KvCache {
  int64_t n_ctx = 0;
  int64_t kv_dim = 0;
  int64_t n_past = 0;  // positions filled
  std::vector<KvBuffer> k, v;

  KvCache() = default;
  KvCache(KvCache&&) noexcept = default;
  KvCache& operator=(KvCache&&) noexcept = default;
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  // A cache of n_layer layers of (n_ctx, kv_dim) rows, empty (n_past 0, no resident pages).
  static KvCache Allocate(int64_t n_layer, int64_t n_ctx, int64_t kv_dim);
  size_t bytes() const;         // reserved (address space): n_ctx rows of every layer's k and v
  size_t bytes_in_use() const;  // rows filled: n_past * kv_dim * 2 bytes * 2 (k, v) * n_layer
  // Empties the cache (n_past 0) and returns its pages to the OS; it stays usable.
  void Release();
};

}  // namespace mr
